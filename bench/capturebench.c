/* Stack capture alone: allocbench's call pattern (a capture from the worker
 * where allocbench frees, and one through top_alloc -> mid_alloc^k ->
 * leaf_alloc where it allocates) with libtag_current_stack() in place of
 * free() and malloc(), timed in-process.  Prints "captures N ns_per_capture
 * X frames_per_capture Y" (frames from the stack table, sampled).  Run it
 * under LD_PRELOAD=libtag.so with LIBTAG_UNWIND set; bench/run_alloc.py
 * builds it the three ways it builds allocbench. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../libtag/include/tag_abi.h"

/* weak: resolved from the preloaded libtag.so at run time */
extern uint32_t libtag_current_stack(void) __attribute__((weak));
extern const void *libtag_control(void) __attribute__((weak));

static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

__attribute__((noinline)) static uint32_t leaf_cap(void) { uint32_t id = libtag_current_stack(); __asm__ volatile("" ::: "memory"); return id; }
__attribute__((noinline)) static uint32_t mid_cap(int k) { return k ? mid_cap(k - 1) : leaf_cap(); }
__attribute__((noinline)) static uint32_t top_cap(uint64_t r) { return mid_cap((int)((r >> 20) % 6)); }

static unsigned depth_of(uint32_t id)
{
    const struct libtag_control *c = libtag_control();
    const struct libtag_stack_node *n = (const struct libtag_stack_node *)(uintptr_t)c->stack_nodes;
    unsigned d = 0;
    for (; id && id < c->stack_count && d < 1000; id = n[id].parent)
        d++;
    return d;
}

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 1000000;
    if (!libtag_current_stack) {
        fprintf(stderr, "capturebench: run it with LD_PRELOAD=libtag.so\n");
        return 2;
    }
    uint64_t s = 12345, frames = 0, sampled = 0;
    uint32_t sink = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < iters; i++) {
        uint64_t r = rng(&s);
        uint32_t f = libtag_current_stack();  /* where allocbench frees */
        uint32_t m = top_cap(r >> 12);         /* where it allocates */
        sink += f ^ m;
        if ((i & 1023) == 0) {
            frames += depth_of(f) + depth_of(m);
            sampled += 2;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (2.0 * iters);
    printf("captures %ld ns_per_capture %.1f frames_per_capture %.2f sink %u\n", 2 * iters, ns,
           sampled ? (double)frames / sampled : 0.0, sink);
    return 0;
}
