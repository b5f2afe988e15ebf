/* sweep_unmapped.c - the sweep reads recent blocks that are gone.
 *
 * 20 rounds: a 64 MiB block (mmap'ed by glibc, beyond the quarantine
 * budget, so free() munmaps it at once: the thread's recent allocations
 * then name unmapped memory), a 40-byte block overflowed by one byte, then
 * enough instrumented calls for a sweep (LIBTAG_SWEEP=1000) before it is
 * freed.  The program has its own SIGSEGV handler, which must never run:
 * the sweep's probe faults are libtag's.  With an argument, the thread
 * blocks every signal first (the sweep must then not probe at all: a
 * blocked fault would kill the process).  Prints the handler's count.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "overwrite.h"

static volatile int segv_seen;

static void on_segv(int sig)
{
    (void)sig;
    segv_seen++;
}

__attribute__((noinline)) static int busy_step(int i)
{
    __asm__ volatile("");
    return i + 1;
}

int main(int argc, char **argv)
{
    signal(SIGSEGV, on_segv);
    if (argc > 1) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, NULL);
    }
    for (int r = 0; r < 20; r++) {
        char *volatile big = malloc(64 << 20);
        memset(big, 1, 100);
        free(big);
        char *volatile q = malloc(40);
        overwrite(q + 40, 'x', 1);
        int x = 0;
        for (int i = 0; i < 3000; i++)
            x = busy_step(x);
        free(q);
    }
    printf("segv_seen=%d\n", segv_seen);
    return 0;
}
