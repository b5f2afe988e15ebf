/* glibc_damage.c - a program that never runs libtag, lays out glibc's heap
 * with a chunk in every state, prints where each one is, then damages the
 * heap in the way argv names and lets glibc's own checks abort it (the
 * kernel writes the core):
 *
 *   overflow      a 2000-byte block a is overrun by 8 bytes: the size field
 *                 of the 100-byte block b right after it becomes
 *                 0x4141414141414141; free(a) aborts with
 *                 "free(): invalid next size (normal)"
 *   double-free   a 70-byte block is freed twice; glibc aborts with
 *                 "free(): double free detected in tcache 2"
 *   tcache-uaf    two 56-byte blocks p, q are freed (tcache: q -> p), then
 *                 q's tcache next pointer is overwritten (a write after
 *                 free) so that it demangles to 0x4141414141414141;
 *                 malloc(56) hands out q, the next malloc(56) aborts with
 *                 "malloc(): unaligned tcache chunk detected"
 *
 * Facts, one per line, before the damage (user pointers as 0x...):
 *
 *   pid PID
 *   chunk NAME PTR SIZE STATE      a block of SIZE requested bytes at PTR,
 *                                  and the state glibc keeps its chunk in at
 *                                  the crash: inuse, tcache, fastbin,
 *                                  unsorted, smallbin, largebin, mmapped
 *   damaged PTR                    overflow: b, whose size field is overwritten
 *                                  tcache-uaf: q, whose next pointer is
 *   twice PTR                      double-free: the block freed twice
 *   mangled VALUE                  tcache-uaf: the word written into q
 *
 * Built -O2 without libtag.  Every block is followed by a live "guard" block,
 * so no two free chunks coalesce.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fact(const char *name, void *p, size_t size, const char *state)
{
    printf("chunk %s %p %zu %s\n", name, p, size, state);
}

/* The misuse is the point: the compiler's warnings about it are expected. */
#pragma GCC diagnostic ignored "-Wuse-after-free"

/* Opaque to the optimiser: the frees and writes below must happen as
 * written (a store into a block that is freed next is otherwise dropped). */
static void *volatile sink;
static void *(*volatile fill)(void *, int, size_t) = memset;

/* A live block between two others: 120 bytes, a size class nothing here
 * frees, so its chunk always comes from the top. */
static void guard(void)
{
    void *g = malloc(120);
    memset(g, 0x47, 120);
    fact("guard", g, 120, "inuse");
}

static void *block(size_t n)
{
    void *p = malloc(n);
    memset(p, 0x55, n);
    guard();
    return p;
}

/* Every block is allocated before anything is freed, and the one malloc
 * after the frees (3000 bytes, from the top) only sorts the unsorted bin:
 * no free chunk is handed out again or split. */
static void layout(void)
{
    char name[32];
    void *t[3], *f[8], *s[8];

    for (int i = 0; i < 3; i++)
        t[i] = block(40);  /* 48-byte chunks */
    for (int i = 0; i < 8; i++)
        f[i] = block(24);  /* 32-byte chunks */
    for (int i = 0; i < 8; i++)
        s[i] = block(200); /* 208-byte chunks */
    void *large = block(2000);
    void *unsorted = block(1500);
    void *mapped = malloc(1 << 20); /* above the mmap threshold */
    memset(mapped, 0x4d, 4096);
    fact("mapped", mapped, 1 << 20, "mmapped");
    sink = mapped;

    for (int i = 0; i < 3; i++) {
        free(t[i]);
        snprintf(name, sizeof name, "tcache%d", i);
        fact(name, t[i], 40, "tcache");
    }
    /* seven fill their tcache bin, the eighth goes to the unsorted bin and
     * the malloc below sorts it into its small bin */
    for (int i = 0; i < 8; i++) {
        free(s[i]);
        snprintf(name, sizeof name, "small%d", i);
        fact(name, s[i], 200, i < 7 ? "tcache" : "smallbin");
    }
    free(large);  /* unsorted, then sorted into its large bin */
    fact("large", large, 2000, "largebin");
    void *big = malloc(3000);
    memset(big, 0x42, 3000);
    fact("big", big, 3000, "inuse");
    sink = big;
    /* seven fill their tcache bin, the eighth goes to fastbin 0 (after
     * the large malloc above, which would have consolidated it) */
    for (int i = 0; i < 8; i++) {
        free(f[i]);
        snprintf(name, sizeof name, "fast%d", i);
        fact(name, f[i], 24, i < 7 ? "tcache" : "fastbin");
    }
    free(unsorted);  /* after the last sort: stays in the unsorted bin */
    fact("unsorted", unsorted, 1500, "unsorted");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("pid %d\n", (int)getpid());
    if (strcmp(mode, "overflow") == 0) {
        char *a = malloc(2000);
        char *b = malloc(100);
        char *c = malloc(100);
        memset(a, 0x61, 2000);
        memset(b, 0x62, 100);
        memset(c, 0x63, 100);
        guard();
        layout();
        fact("a", a, 2000, "inuse");
        fact("b", b, 100, "inuse");
        fact("c", c, 100, "inuse");
        printf("damaged %p\n", (void *)b);
        fflush(stdout);
        /* malloc_usable_size(a) reaches b's prev_size; 8 more bytes are b's size */
        fill(a, 0x41, malloc_usable_size(a) + 8);
        free(a);
    } else if (strcmp(mode, "double-free") == 0) {
        char *p = block(70);
        layout();
        fact("twice", p, 70, "tcache");
        printf("twice %p\n", (void *)p);
        fflush(stdout);
        free(p);
        sink = p;
        free(sink);
    } else if (strcmp(mode, "tcache-uaf") == 0) {
        char *p = block(56);
        char *q = block(56);
        layout();
        free(p);
        free(q);
        uintptr_t mangled = ((uintptr_t)q >> 12) ^ (uintptr_t)0x4141414141414141ULL;
        /* q, handed out again, keeps the word; p stays counted in its
         * tcache bin, unreachable from the bin's list */
        fact("p", p, 56, "tcache");
        fact("q", q, 56, "inuse");
        printf("damaged %p\n", (void *)q);
        printf("mangled %#lx\n", (unsigned long)mangled);
        fflush(stdout);
        *(volatile uintptr_t *)q = mangled;  /* use after free */
        sink = malloc(56);                   /* q again */
        sink = malloc(56);                   /* aborts */
    } else {
        fprintf(stderr, "usage: glibc_damage overflow|double-free|tcache-uaf\n");
        return 2;
    }
    printf("survived\n");
    return 0;
}
