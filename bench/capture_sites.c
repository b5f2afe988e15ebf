/* Stack capture with more sites than libtag keeps walks for: 4 allocation
 * sites and one free helper called from 3 places (gcc folds f0..f2 into one
 * function, so 3 free stacks share their innermost frame), picked at
 * random, 1 thread.  Measures the fast check's cache (unwind.c):
 *   gcc -O2 -g bench/capture_sites.c -o capture_sites
 *   LIBTAG_GUARD_RATE=0 LD_PRELOAD=.../libtag.so valgrind --tool=callgrind ./capture_sites 200000 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#define W 1024
static void *win[W];
static uint64_t s = 88172645463325252ull;
static uint64_t rng(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
#define NI __attribute__((noinline))
NI static void *a0(size_t n) { void *p = malloc(n); __asm__ volatile("" ::: "memory"); return p; }
NI static void *a1(size_t n) { void *p = malloc(n + 1); __asm__ volatile("" ::: "memory"); return p; }
NI static void *a2(size_t n) { void *p = malloc(n + 2); __asm__ volatile("" ::: "memory"); return p; }
NI static void *a3(size_t n) { void *p = malloc(n + 3); __asm__ volatile("" ::: "memory"); return p; }
NI static void f0(void *p) { free(p); __asm__ volatile("" ::: "memory"); }
NI static void f1(void *p) { free(p); __asm__ volatile("" ::: "memory"); }
NI static void f2(void *p) { free(p); __asm__ volatile("" ::: "memory"); }
NI static void *l1(size_t n, int k) { void *p; switch (k) { case 0: p = a0(n); break; case 1: p = a1(n); break; case 2: p = a2(n); break; default: p = a3(n); } __asm__ volatile("" ::: "memory"); return p; }
NI static void *l2(size_t n, int k) { void *p = l1(n, k); __asm__ volatile("" ::: "memory"); return p; }
NI static void *l3(size_t n, int k) { void *p = l2(n, k); __asm__ volatile("" ::: "memory"); return p; }
NI static void d1(void *p, int k) { if (k == 0) f0(p); else if (k == 1) f1(p); else f2(p); __asm__ volatile("" ::: "memory"); }
NI static void d2(void *p, int k) { d1(p, k); __asm__ volatile("" ::: "memory"); }
int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 200000;
    for (long i = 0; i < iters; i++) {
        uint64_t r = rng();
        size_t k = r % W;
        if (win[k]) d2(win[k], (int)((r >> 20) % 3));
        win[k] = l3(8 + (r >> 32) % 200, (int)((r >> 40) & 3));
    }
    for (int k = 0; k < W; k++) free(win[k]);
    printf("%ld ops\n", iters);
    return 0;
}
