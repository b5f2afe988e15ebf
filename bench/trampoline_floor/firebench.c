/* firebench.c - what one trampoline fire costs.
 *
 * A noinline function is called N times from a loop, from 4 call sites per
 * iteration (so the trampoline's indirect jmp has 4 targets in a fixed
 * rotation), in these variants:
 *   plain    it returns normally;
 *   control  it does the marker's bookkeeping (records its return slot and
 *            real return address in the side stack, writes the real return
 *            address back into its slot) and returns normally; the loop pops
 *            the entry;
 *   tramp    the same bookkeeping, but it writes tramp_ret (tramp_asm.h, the
 *            very code tramp.so uses) into its return slot, so its `ret`
 *            lands in the trampoline (the return-stack buffer predicted the
 *            call site: a mispredict), which pops the entry and jmps to the
 *            real return address;
 *   control-rand / tramp-rand
 *            the call site is chosen from 4 by a pseudo-random number each
 *            call, so the trampoline's jmp target is unpredictable (the
 *            switch's own mispredicts are in both).
 * One fire costs (tramp - control).  Median of 5 runs, ns per call and
 * TSC ticks per call (the TSC runs at the nominal clock, not the core's).
 *
 *   gcc -O2 -fno-omit-frame-pointer -o firebench firebench.c && ./firebench
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

#include "tramp_asm.h"

TRAMP_DEFINE_ASM

static volatile uint64_t sink;

__attribute__((noinline)) static uint64_t f_plain(uint64_t x)
{
    __asm__ volatile("" ::: "memory");
    return x + 1;
}

/* The same work, but for the word stored back into the return slot: the
 * real return address (control) or the trampoline's. */
#define MARKED(name, stored)                                                  \
    __attribute__((noinline)) static uint64_t name(uint64_t x)                \
    {                                                                         \
        uintptr_t *slot = (uintptr_t *)__builtin_frame_address(0) + 1;        \
        struct tramp_state *T = &tramp_tls;                                   \
        struct tramp_entry *e = &T->e[T->n++];                                \
        e->slot = slot;                                                       \
        e->ret = *slot;                                                       \
        e->pid = x;                                                           \
        *(volatile uintptr_t *)slot = (stored);                               \
        return x + 1;                                                         \
    }
MARKED(f_control, e->ret)
MARKED(f_tramp, (uintptr_t)tramp_ret)

#define POP_CONTROL() (tramp_tls.n = 0)
#define POP_TRAMP() ((void)0) /* the trampoline popped it */

#define LOOP4(F, POP)                                                     \
    __attribute__((noinline)) static uint64_t loop_##F(long n)           \
    {                                                                     \
        uint64_t x = 0;                                                   \
        for (long i = 0; i < n; i += 4) {                                 \
            x = F(x); POP; __asm__ volatile("" ::: "memory");             \
            x = F(x); POP; __asm__ volatile("" ::: "memory");             \
            x = F(x); POP; __asm__ volatile("" ::: "memory");             \
            x = F(x); POP; __asm__ volatile("" ::: "memory");             \
        }                                                                 \
        return x;                                                         \
    }

LOOP4(f_plain, (void)0)
LOOP4(f_control, POP_CONTROL())
LOOP4(f_tramp, POP_TRAMP())

#define LOOPR(F, POP)                                                     \
    __attribute__((noinline)) static uint64_t loopr_##F(long n)          \
    {                                                                     \
        uint64_t x = 0, r = 88172645463325252ull;                         \
        for (long i = 0; i < n; i++) {                                    \
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;                      \
            switch (r & 3) {                                              \
            case 0: x = F(x + 3); POP; __asm__ volatile("" ::: "memory"); break; \
            case 1: x = F(x ^ 5); POP; __asm__ volatile("" ::: "memory"); break; \
            case 2: x = F(x - 7); POP; __asm__ volatile("" ::: "memory"); break; \
            default: x = F(x * 3); POP; __asm__ volatile("" ::: "memory"); break; \
            }                                                             \
        }                                                                 \
        return x;                                                         \
    }

LOOPR(f_control, POP_CONTROL())
LOOPR(f_tramp, POP_TRAMP())

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000000;
    struct {
        const char *name;
        uint64_t (*fn)(long);
    } v[] = {
        {"plain", loop_f_plain},         {"control", loop_f_control},
        {"tramp", loop_f_tramp},         {"control-rand", loopr_f_control},
        {"tramp-rand", loopr_f_tramp},
    };
    enum { NV = sizeof v / sizeof v[0], REPS = 5 };
    double ns[NV][REPS], tk[NV][REPS];
    for (int r = 0; r < REPS; r++)
        for (int i = 0; i < NV; i++) { /* interleaved */
            uint64_t f0 = tramp_tls.fires;
            double t0 = now();
            uint64_t c0 = __rdtsc();
            sink += v[i].fn(n);
            uint64_t c1 = __rdtsc();
            double t1 = now();
            ns[i][r] = (t1 - t0) * 1e9 / n;
            tk[i][r] = (double)(c1 - c0) / n;
            uint64_t fires = tramp_tls.fires - f0;
            if (fires != (!strncmp(v[i].name, "tramp", 5) ? (uint64_t)n : 0)) {
                fprintf(stderr, "%s: %lu fires for %ld calls\n", v[i].name,
                        (unsigned long)fires, n);
                return 1;
            }
        }
    double med[NV], medt[NV];
    for (int i = 0; i < NV; i++) {
        qsort(ns[i], REPS, sizeof(double), cmpd);
        qsort(tk[i], REPS, sizeof(double), cmpd);
        med[i] = ns[i][REPS / 2];
        medt[i] = tk[i][REPS / 2];
        printf("%-13s %7.2f ns/call  %7.1f TSC ticks/call  (min %.2f max %.2f ns)\n",
               v[i].name, med[i], medt[i], ns[i][0], ns[i][REPS - 1]);
    }
    printf("fire (tramp - control):           %6.2f ns  %6.1f ticks\n",
           med[2] - med[1], medt[2] - medt[1]);
    printf("fire, random site (tramp-rand - control-rand): %6.2f ns  %6.1f ticks\n",
           med[4] - med[3], medt[4] - medt[3]);
    return 0;
}
