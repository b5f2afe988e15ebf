/* A plain program (started without libtag) for `forensics attach PID`:
 * blocks from before the attach, a thread allocating all the while, and
 * commands that exercise both kinds of block after it.
 *
 *   attach_loop
 *
 * Prints "old ADDR" for three blocks made before any attach (make_before)
 * and "usable N" (malloc_usable_size of the third), "lost ADDR" for a
 * block of 1234 bytes made before it whose only pointer is dropped, then
 * "ready".  On stdin:
 *   new          prints "new ADDR": a block of 400 bytes from make_after,
 *                which the program does not keep
 *   free_old     frees the first old block; prints "freed"
 *   realloc_old  reallocates the second old block to 5000 bytes; prints
 *                "realloc ADDR" (its first byte checked: 'b')
 *   usable_old   prints "usable N" for the third old block
 *   double       frees a block of make_double twice; prints "double ADDR"
 *   lose         a block of 333 bytes from lose_after, its pointer dropped;
 *                prints "lost_after"
 *   report       prints "report churn=N": rounds of the churning thread
 *   quit         exits 0
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_long rounds;

__attribute__((noinline)) void *make_before(size_t n, int c)
{
    void *p = malloc(n);
    memset(p, c, n);
    return p;
}

__attribute__((noinline)) void *make_after(size_t n)
{
    void *p = malloc(n);
    memset(p, 'n', n);
    return p;
}

/* Zeroes the stack below the caller: copies of a lost block's address left
 * in dead frames (printf's, malloc's) would otherwise be words of the live
 * frames the next calls make, and keep the block "reachable". */
__attribute__((noinline)) void scrub_stack(void)
{
    char pad[16384];
    explicit_bzero(pad, sizeof pad);
    __asm__ volatile("" : : "r"(pad) : "memory");
}

__attribute__((noinline)) void lose_before(size_t n)
{
    char *p = make_before(n, 'l');
    printf("lost %p\n", (void *)p);
}

__attribute__((noinline)) void lose_after(size_t n)
{
    char *p = malloc(n);
    memset(p, 'z', n);
    __asm__ volatile("" : : "r"(p) : "memory");  /* the block is made, then lost */
}

__attribute__((noinline)) void *make_double(size_t n)
{
    return malloc(n);
}

__attribute__((noinline)) void *churn_main(void *arg)
{
    (void)arg;
    void *keep[64] = {0};
    for (unsigned i = 0;; i++) {
        unsigned k = i % 64;
        free(keep[k]);  /* glibc's before the attach, libtag's after */
        keep[k] = malloc(16 + (i * 37) % 2000);
        if (k == 0) {
            char *r = realloc(keep[1], 100 + i % 300);
            if (r)
                keep[1] = r;
        }
        atomic_fetch_add(&rounds, 1);
    }
    return NULL;
}

int main(void)
{
    char *old[3];
    old[0] = make_before(300, 'a');
    old[1] = make_before(600, 'b');
    old[2] = make_before(1000, 'c');
    for (int i = 0; i < 3; i++)
        printf("old %p\n", (void *)old[i]);
    printf("usable %zu\n", malloc_usable_size(old[2]));
    lose_before(1234);
    scrub_stack();
    pthread_t t;
    pthread_create(&t, NULL, churn_main, NULL);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "new", 3) == 0) {
            printf("new %p\n", make_after(400));
        } else if (strncmp(line, "free_old", 8) == 0) {
            free(old[0]);
            printf("freed\n");
        } else if (strncmp(line, "realloc_old", 11) == 0) {
            old[1] = realloc(old[1], 5000);
            printf("realloc %p %c\n", (void *)old[1], old[1][0]);
        } else if (strncmp(line, "usable_old", 10) == 0) {
            printf("usable %zu\n", malloc_usable_size(old[2]));
        } else if (strncmp(line, "double", 6) == 0) {
            void *q = make_double(48);
            free(q);
            free(q);
            printf("double %p\n", q);
        } else if (strncmp(line, "lose", 4) == 0) {
            lose_after(333);
            printf("lost_after\n");
        } else if (strncmp(line, "report", 6) == 0) {
            printf("report churn=%ld\n", atomic_load(&rounds));
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        }
        fflush(stdout);
        scrub_stack();
    }
    return 0;
}
