/* diff_growth.c - a victim whose heap changes in known ways between three
 * on-demand snapshots (raise(SIGUSR2)).  Run with LIBTAG_QUARANTINE=0 so a
 * freed block goes straight back to glibc and its address is handed out again.
 *
 *   diff_growth K
 *
 Before snapshot 1:  KEEP blocks from keep_alloc (kept to the end),
 *                     CHURN blocks from churn_alloc (a window of fixed sizes),
 *                     one block from recycle_alloc.
 * Before every snapshot: every churn block freed and allocated again with
 *                     the same size, ROUNDS times (churn: count and bytes stay).
 * Before snapshots 2 and 3: K more blocks from leak_alloc (kept: they grow).
 * Before snapshot 2 only: the recycle block freed and, 50 ms later,
 *                     allocated again from the same call site - glibc gives
 *                     back the same address.
 * Prints "pid N", "recycled OLD NEW" (addresses) and "snap I" per snapshot.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define KEEP 10
#define CHURN 32
#define ROUNDS 20
#define LEAK_SIZE 40
#define MAXLEAK 4096

static void *keep[KEEP], *churn[CHURN], *leaked[MAXLEAK];
static int nleaked;

NOINLINE static void *keep_alloc(void) { return malloc(200); }
NOINLINE static void *churn_alloc(size_t n) { return malloc(n); }
NOINLINE static void *leak_alloc(void) { return malloc(LEAK_SIZE); }
NOINLINE static void *recycle_alloc(void) { return malloc(24); }

static size_t churn_size(int i) { return 64 + 16 * (size_t)(i % 4); }

NOINLINE static void do_churn(void)
{
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < CHURN; i++) {
            free(churn[i]);
            churn[i] = churn_alloc(churn_size(i));
            memset(churn[i], r, churn_size(i));
        }
}

NOINLINE static void do_leak(int k, int phase)
{
    if (phase == 1)
        return;
    for (int i = 0; i < k && nleaked < MAXLEAK; i++)
        leaked[nleaked++] = leak_alloc();
}

static void snap(int i)
{
    printf("snap %d\n", i);
    fflush(stdout);
    raise(SIGUSR2);
}

/* Phase 1 allocates the block, phase 2 frees it and allocates it again
 * from the same call site (recycle_new), so both blocks have one stack. */
static uintptr_t recycled_old;

NOINLINE static void recycle_free(void **slot, int phase)
{
    if (phase != 2)
        return;
    recycled_old = (uintptr_t)*slot;
    free(*slot);
    usleep(50 * 1000);  /* a later allocation time than the old block's */
}

NOINLINE static void recycle_new(void **slot, int phase)
{
    if (phase > 2)
        return;
    *slot = recycle_alloc();
    if (phase == 2)
        printf("recycled %#lx %#lx\n", (unsigned long)recycled_old, (unsigned long)(uintptr_t)*slot);
}

/* Every allocation of a kind comes from one call site, so it has one stack:
 * the phase is decided inside the callees, not by branches the compiler
 * could duplicate call sites for. */
NOINLINE static void step(int phase, int k, void **rec)
{
    /* A block's identity is (address, allocation time, thread, stack) and
     * libtag's clock ticks every few ms: a churned block given the same
     * address in the same tick as its predecessor would be the same block. */
    usleep(20 * 1000);
    do_leak(k, phase);
    do_churn();
    recycle_free(rec, phase);
    recycle_new(rec, phase);
    snap(phase);
}

int main(int argc, char **argv)
{
    int k = argc > 1 ? atoi(argv[1]) : 7;
    void *rec = NULL;
    printf("pid %d\n", getpid());
    for (int i = 0; i < KEEP; i++)
        keep[i] = keep_alloc();
    volatile int phases = 3;  /* a loop the compiler cannot unroll into 3 call sites */
    for (int phase = 1; phase <= phases; phase++)
        step(phase, k, &rec);
    for (int i = 0; i < KEEP; i++)
        free(keep[i]);
    for (int i = 0; i < CHURN; i++)
        free(churn[i]);
    for (int i = 0; i < nleaked; i++)
        free(leaked[i]);
    free(rec);
    printf("done\n");
    return 0;
}
