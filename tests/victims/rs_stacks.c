/* rs_stacks.c - stacks the reader must unwind and symbolise as gdb does.
 *
 * Built -O2 without frame pointers and without -finstrument-functions:
 * every stack comes from the binaries' CFI, and the victim's helpers marked
 * always_inline become inline frames.  (uw_stacks.c has the allocation
 * paths through nested calls, a thread, strdup, fopen, recursion and
 * signal handlers; uw_crash.c an abort.)
 *
 *   rs_stacks park     a marked allocation and free, threads parked in
 *                      known places, park_done() (a breakpoint for gdb),
 *                      then a snapshot from main (libtag_snapshot), exit
 *   rs_stacks thread   a worker thread faults two calls deep, through an
 *                      inlined helper
 *   rs_stacks handler  a worker's SIGUSR1 handler faults: the crash stack
 *                      runs through the signal frame into the code the
 *                      signal interrupted
 *
 * In park mode the victim sets `marker` around the call that makes each
 * marked allocation or free (a gdb breakpoint on malloc or free with the
 * condition `marker == N` stops at exactly that call) and prints
 *   block <marker> <address>     the block of each marker
 *   thread <name> <tid>          each parked thread
 *   main <tid>                   the thread that takes the snapshot
 *
 * Markers:
 *   1  host_of_inline -> inline_outer -> inline_inner -> malloc, the two
 *      helpers inlined
 *   2  free through an inlined helper: release -> inline_release -> free
 *      (the block stays in the quarantine)
 *
 * Parked threads (each blocks in read() on its own pipe):
 *   nested    worker_nested -> park_middle -> park_inner -> read
 *   recursive worker_recursive -> park_recurse x 30 -> read
 *   inlined   worker_inlined -> park_inline (inlined) -> read
 *   handler   worker_handler -> interrupted -> raise(SIGUSR1) ...
 *             handler_park -> park_inner -> read: parked inside a signal
 *             handler (SIGUSR1: libtag's snapshot signal is SIGUSR2)
 * and one that does not park:
 *   spinning  worker_spin -> spin_clock, calling clock_gettime() in a loop:
 *             mostly stopped inside the kernel's vDSO
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rs_park.h"

#define FAULT_ADDR ((volatile int *)0xdead0000)
#define KEEP() __asm__ volatile("" ::: "memory")  /* no tail call: a real frame */
#define MARKERS 3

extern int libtag_snapshot(void) __attribute__((weak));

volatile int marker;
static void *blocks[MARKERS];


/* -- a marked allocation and free ------------------------------------------ */

static inline __attribute__((always_inline)) void *inline_inner(size_t n)
{
    void *p = malloc(n);
    KEEP();
    return p;
}

static inline __attribute__((always_inline)) void *inline_outer(size_t n)
{
    void *p = inline_inner(n + 1);
    KEEP();
    return p;
}

__attribute__((noipa)) static void *host_of_inline(size_t n)
{
    void *p = inline_outer(n + 1);
    KEEP();
    return p;
}

__attribute__((noipa)) static void interrupted(int sig)
{
    raise(sig);
    KEEP();
}

static inline __attribute__((always_inline)) void inline_release(void *p)
{
    free(p);
    KEEP();
}

__attribute__((noipa)) static void release(void *p)
{
    marker = 2;
    inline_release(p);
    marker = 0;
}

/* -- parked threads ------------------------------------------------------ */

struct park {
    const char *name;
    int fds[2];
    volatile pid_t tid;
};

static struct park parks[4] = {{"nested"}, {"recursive"}, {"inlined"}, {"handler"}};

__attribute__((noipa)) static void park_inner(struct park *p)
{
    char c;
    p->tid = rs_gettid();
    while (read(p->fds[0], &c, 1) < 0)
        ;
    KEEP();
}

__attribute__((noipa)) static void park_middle(struct park *p)
{
    park_inner(p);
    KEEP();
}

__attribute__((noipa)) static void *worker_nested(void *arg)
{
    park_middle(arg);
    KEEP();
    return NULL;
}

__attribute__((noipa)) static void park_recurse(struct park *p, int depth)
{
    if (depth)
        park_recurse(p, depth - 1);
    else
        park_inner(p);
    KEEP();
}

__attribute__((noipa)) static void *worker_recursive(void *arg)
{
    park_recurse(arg, 29);
    KEEP();
    return NULL;
}

static inline __attribute__((always_inline)) void park_inline(struct park *p)
{
    char c;
    p->tid = rs_gettid();
    while (read(p->fds[0], &c, 1) < 0)
        ;
    KEEP();
}

__attribute__((noipa)) static void *worker_inlined(void *arg)
{
    park_inline(arg);
    KEEP();
    return NULL;
}

__attribute__((noipa)) static void handler_park(int sig)
{
    (void)sig;
    park_inner(&parks[3]);
    KEEP();
}

__attribute__((noipa)) static void *worker_handler(void *arg)
{
    (void)arg;
    interrupted(SIGUSR1);
    KEEP();
    return NULL;
}

static volatile int spinning, stop_spinning;
static volatile pid_t spin_tid;

__attribute__((noipa)) static void spin_clock(void)
{
    struct timespec ts;
    spin_tid = rs_gettid();
    while (!stop_spinning) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        spinning = 1;
    }
    KEEP();
}

__attribute__((noipa)) static void *worker_spin(void *arg)
{
    (void)arg;
    spin_clock();
    KEEP();
    return NULL;
}

/* gdb stops here (park mode): every thread is parked.  The store is where
 * its breakpoint lands: a line of the body, not the function's entry. */
volatile int parked_all;
__attribute__((noipa)) void park_done(void)
{
    parked_all = 1;
    KEEP();
}

__attribute__((noipa)) static void take_snapshot(void)
{
    if (libtag_snapshot)
        libtag_snapshot();
    KEEP();
}

__attribute__((noipa)) static int park_mode(void)
{
    marker = 1;
    blocks[1] = host_of_inline(100);
    marker = 0;
    blocks[2] = malloc(200);
    release(blocks[2]);

    signal(SIGUSR1, handler_park);
    void *(*fns[4])(void *) = {worker_nested, worker_recursive, worker_inlined, worker_handler};
    pthread_t ts[4];
    for (int i = 0; i < 4; i++) {
        if (pipe(parks[i].fds) != 0)
            return 1;
        pthread_create(&ts[i], NULL, fns[i], &parks[i]);
    }
    for (int i = 0; i < 4; i++) {
        while (!parks[i].tid)
            rs_nap();
        rs_wait_in_read(parks[i].tid);
    }
    pthread_t spinner;
    pthread_create(&spinner, NULL, worker_spin, NULL);
    while (!spinning)
        rs_nap();
    for (int m = 1; m < MARKERS; m++)
        printf("block %d %p\n", m, blocks[m]);
    for (int i = 0; i < 4; i++)
        printf("thread %s %d\n", parks[i].name, (int)parks[i].tid);
    printf("thread spinning %d\n", (int)spin_tid);
    printf("main %d\n", (int)rs_gettid());
    park_done();
    take_snapshot();
    stop_spinning = 1;
    pthread_join(spinner, NULL);
    for (int i = 0; i < 4; i++) {
        if (write(parks[i].fds[1], "x", 1) != 1)
            return 1;
        pthread_join(ts[i], NULL);
    }
    return 0;
}

/* -- crashes --------------------------------------------------------------- */

static inline __attribute__((always_inline)) void inline_crash(int v)
{
    *FAULT_ADDR = v;
    KEEP();
}

__attribute__((noipa)) static void crash_here(int v)
{
    inline_crash(v + 1);
    KEEP();
}

__attribute__((noipa)) static void *crash_worker(void *arg)
{
    crash_here((int)(long)arg);
    KEEP();
    return NULL;
}

__attribute__((noipa)) static void crash_handler_fn(int sig)
{
    crash_here(sig);
    KEEP();
}

__attribute__((noipa)) static void *handler_worker(void *arg)
{
    (void)arg;
    interrupted(SIGUSR1);
    KEEP();
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    free(malloc(10));  /* libtag is up */
    const char *mode = argc > 1 ? argv[1] : "park";
    if (strcmp(mode, "park") == 0) {
        int rc = park_mode();
        KEEP();  /* a call, not a tail jump: main stays on the stack */
        return rc;
    }
    pthread_t th;
    if (strcmp(mode, "handler") == 0) {
        signal(SIGUSR1, crash_handler_fn);
        pthread_create(&th, NULL, handler_worker, NULL);
    } else {
        pthread_create(&th, NULL, crash_worker, (void *)41L);
    }
    pthread_join(th, NULL);
    return 0;
}
