/* guard_longrun: does guarded sampling keep its rate in a long run?
 *
 * Phase 1 allocates 10,000 long-lived blocks from 5,000 allocation stacks
 * (two blocks a stack; a stack is the path of 13 choices between two call
 * sites, step_a and step_b, down to make_block), the way a program's
 * start-up fills the guard pool with each site's first block.  Phase 2
 * churns N short-lived blocks (argv[1], default 50,000,000), each freed
 * at once, from one site.
 *
 * It counts its own blocks that libtag placed in the guard pool (the
 * control block's guard_pool range) and prints, before exiting:
 *   long_guarded=K   of the 10,000 long-lived blocks
 *   churn=N churn_guarded=G   of the churned ones
 * then frees the long-lived blocks and prints "done".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tag_abi.h"

extern const void *libtag_control(void) __attribute__((weak));

#define SITES 5000
#define DEPTH 13 /* 2^13 = 8192 paths >= SITES */
#define PER_SITE 2

static uint64_t pool_lo, pool_hi;

static void pool_range(void)
{
    const struct libtag_control *c = libtag_control ? libtag_control() : NULL;
    if (c && c->guard_pool_bytes) {
        pool_lo = c->guard_pool;
        pool_hi = c->guard_pool + c->guard_pool_bytes;
    }
}

static int guarded(const void *p)
{
    return (uint64_t)(uintptr_t)p - pool_lo < pool_hi - pool_lo;
}

__attribute__((noinline)) static void *make_block(size_t n)
{
    void *p = malloc(n);
    memset(p, 0x11, n);
    return p;
}

static void *step_b(unsigned path, int depth, size_t n);

__attribute__((noinline)) static void *step_a(unsigned path, int depth, size_t n)
{
    void *p = depth == 0 ? make_block(n)
              : (path & 1) ? step_b(path >> 1, depth - 1, n)
                           : step_a(path >> 1, depth - 1, n);
    __asm__ volatile("" ::: "memory"); /* no sibling call: a frame per step */
    return p;
}

__attribute__((noinline)) static void *step_b(unsigned path, int depth, size_t n)
{
    void *p = depth == 0 ? make_block(n)
              : (path & 1) ? step_b(path >> 1, depth - 1, n)
                           : step_a(path >> 1, depth - 1, n);
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline)) static void *churn_one(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 50000000L;
    static void *keep[SITES * PER_SITE];
    for (int k = 0; k < PER_SITE; k++)
        for (unsigned s = 0; s < SITES; s++)
            keep[k * SITES + s] = step_a(s, DEPTH, 64 + s % 64);
    pool_range();
    long long_guarded = 0;
    for (int i = 0; i < SITES * PER_SITE; i++)
        long_guarded += guarded(keep[i]);
    printf("long_guarded=%ld\n", long_guarded);
    fflush(stdout);
    long churn_guarded = 0;
    for (long i = 0; i < n; i++) {
        void *p = churn_one(16 + (size_t)(i & 63));
        if (!pool_hi)
            pool_range();  /* the pool is reserved at the first guarded block */
        churn_guarded += guarded(p);
        free(p);
    }
    printf("churn=%ld churn_guarded=%ld\n", n, churn_guarded);
    for (int i = 0; i < SITES * PER_SITE; i++)
        free(keep[i]);
    printf("done\n");
    return 0;
}
