/* uw_reuse.c - does reusing the outer part of the last walk ever give a
 * wrong stack?  Built -O2 without frame pointers, not instrumented: every
 * stack is a CFI walk, and most reuse the last one's outer frames.
 *
 * Each thread makes 20000 allocations and frees through random paths: a
 * random depth (0..7) of calls, each through one of two functions (fa, fb:
 * different call sites and frame sizes), with alloca() of a random size on
 * the way (so the same functions sit at different stack addresses), into
 * leaf_alloc or leaf_free.  Every function on the path stores its own
 * return address in ras[] (__builtin_return_address(0) needs no frame
 * pointer), so the victim knows the stack libtag must record, and checks
 * each block's allocation and free stack against it at once:
 *   recorded[0]        the leaf's call to malloc/free: within 4 KiB after
 *                      the leaf's address, and the same every time
 *   recorded[1..lvl]   ras[lvl-1] .. ras[0]
 *   recorded[lvl+1..]  the thread's start, the same for every stack
 * Prints "thread <i> checked <n> bad <m>".
 */
#include <alloca.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_reader.c"

#define KEEP() __asm__ volatile("" ::: "memory")
#define ROUNDS 20000

struct path {
    uintptr_t ras[16];
    int lvl;
    uint64_t rng;
    uintptr_t tail[64];  /* the thread's outer frames, from the first stack */
    int tail_n;
    uintptr_t first[2];  /* recorded[0] of each leaf, from its first stack */
    long checked, bad;
    void *keep[8];
};
static __thread struct path P;

static uint64_t rnd(void)
{
    P.rng ^= P.rng << 13;
    P.rng ^= P.rng >> 7;
    P.rng ^= P.rng << 17;
    return P.rng;
}

static void check(uint32_t id, int which, uintptr_t leaf)
{
    const struct libtag_control *c = lt_ctl();
    const struct libtag_stack_node *nodes =
        (const struct libtag_stack_node *)(uintptr_t)c->stack_nodes;
    uintptr_t got[96];
    int n = 0;
    for (; id && id < c->stack_count && n < 96; id = nodes[id].parent)
        got[n++] = (uintptr_t)nodes[id].pc;
    int ok = n >= P.lvl + 1 && got[0] > leaf && got[0] < leaf + 4096;
    if (ok && !P.first[which])
        P.first[which] = got[0];
    ok = ok && got[0] == P.first[which];
    for (int i = 0; ok && i < P.lvl; i++)
        ok = got[1 + i] == P.ras[P.lvl - 1 - i];
    int rest = n - (P.lvl + 1);
    if (ok && P.tail_n < 0) {
        P.tail_n = rest;
        memcpy(P.tail, got + P.lvl + 1, (size_t)rest * sizeof got[0]);
    } else if (ok) {
        ok = rest == P.tail_n && memcmp(P.tail, got + P.lvl + 1, (size_t)rest * sizeof got[0]) == 0;
    }
    P.checked++;
    if (!ok && P.bad++ < 3) {
        printf("bad stack (lvl %d):", P.lvl);
        for (int i = 0; i < n; i++)
            printf(" %lx", (unsigned long)got[i]);
        printf("\n");
    }
}

__attribute__((noipa)) static void leaf_free(void)
{
    P.ras[P.lvl++] = (uintptr_t)__builtin_return_address(0);
    int k = (int)(rnd() % 8);
    void *p = P.keep[k];
    P.keep[k] = NULL;
    if (p) {
        free(p);
        const struct libtag_free_rec *f = lt_free_rec(p);
        if (f)
            check(f->free_stack, 1, (uintptr_t)leaf_free);
    }
    P.lvl--;
    KEEP();
}

__attribute__((noipa)) static void leaf_alloc(void)
{
    P.ras[P.lvl++] = (uintptr_t)__builtin_return_address(0);
    void *p = malloc(16 + rnd() % 200);
    check(lt_tag(p)->alloc_stack, 0, (uintptr_t)leaf_alloc);
    int k = (int)(rnd() % 8);
    free(P.keep[k]);  /* not checked: a free from here */
    P.keep[k] = p;
    P.lvl--;
    KEEP();
}

__attribute__((noipa)) static void fb(int d);

__attribute__((noipa)) static void fa(int d)
{
    P.ras[P.lvl++] = (uintptr_t)__builtin_return_address(0);
    volatile char *pad = alloca(16 * (rnd() % 5));
    (void)pad;
    if (d == 0)
        (rnd() & 1) ? leaf_alloc() : leaf_free();
    else
        (rnd() & 1) ? fa(d - 1) : fb(d - 1);
    P.lvl--;
    KEEP();
}

__attribute__((noipa)) static void fb(int d)
{
    P.ras[P.lvl++] = (uintptr_t)__builtin_return_address(0);
    volatile char big[48];
    big[0] = (char)d;
    if (d == 0)
        (rnd() & 1) ? leaf_free() : leaf_alloc();
    else
        (rnd() & 1) ? fb(d - 1) : fa(d - 1);
    P.lvl--;
    KEEP();
}

__attribute__((noipa)) static void *worker(void *arg)
{
    P.rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)arg;
    P.tail_n = -1;
    for (int r = 0; r < ROUNDS; r++) {
        int d = (int)(rnd() % 8);
        (rnd() & 1) ? fa(d) : fb(d);
    }
    printf("thread %ld checked %ld bad %ld\n", (long)(uintptr_t)arg, P.checked, P.bad);
    return NULL;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    pthread_t th[3];
    for (long i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    return 0;
}
