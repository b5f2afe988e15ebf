/* heap_threads.c - a heap whose every block the test knows.
 *
 * Built with -finstrument-functions and run under libtag (LD_PRELOAD) with
 * LIBTAG_QUARANTINE=1500, so blocks up to 1500 bytes wait in the quarantine
 * when freed and bigger ones go straight back to the heap.
 *
 * Prints (one fact per line):
 *   pid PID
 *   block ADDR SIZE TID live|freed WHO   every block it allocated; WHO is the
 *                                        function that called make_record
 *   copy ADDR HOLDER                     ADDR: the 16 bytes of another
 *                                        block's tag, copied inside block
 *                                        HOLDER
 *   recycled OLD NEW                     OLD: a freed big block whose memory
 *                                        the heap merged and handed out again
 *                                        as NEW (OLD's old tag inside NEW)
 *   dangling ADDR                        a pointer main keeps to a freed block
 *   stats LIVE_BLOCKS LIVE_BYTES         libtag_stats() just before the snapshot
 *   snapped | ready
 *
 * argv[1] = "snapshot": raise(SIGUSR2) (libtag's on-demand snapshot), then exit.
 * argv[1] = "wait": print "ready" and wait for EOF on stdin, then exit.
 * Worker threads stay alive, parked in wait_for_quit, until the end: a
 * thread's quarantine is drained when it exits.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libtag.h"

#define NOINLINE __attribute__((noinline))
#define WORKERS 3

static pthread_barrier_t allocated;
static pthread_mutex_t quit_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t quit_cond = PTHREAD_COND_INITIALIZER;
static int quit;
static int parked; /* workers inside wait_for_quit */

NOINLINE void *alloc_node(size_t size)
{
    void *p = malloc(size);
    __asm__ volatile("" ::: "memory");
    return p;
}

NOINLINE void *make_record(size_t size)
{
    void *p = alloc_node(size);
    __asm__ volatile("" ::: "memory");
    return p;
}

NOINLINE void release_record(void *p)
{
    free(p);
    __asm__ volatile("" ::: "memory");
}

static void report(const char *who, void *p, size_t size, const char *state)
{
    printf("block %p %zu %d %s %s\n", p, size, gettid(), state, who);
}

NOINLINE void wait_for_quit(void)
{
    pthread_mutex_lock(&quit_lock);
    parked++;
    pthread_cond_broadcast(&quit_cond);
    while (!quit)
        pthread_cond_wait(&quit_cond, &quit_lock);
    pthread_mutex_unlock(&quit_lock);
}

NOINLINE void *worker(void *arg)
{
    size_t w = (size_t)(uintptr_t)arg;
    void *b0 = make_record(24 + w);
    void *b1 = make_record(130 + w);
    void *b2 = make_record(3000 + w);
    void *b3 = make_record(64 + w);
    memset(b0, 0x11, 24 + w);
    memset(b2, 0x22, 3000 + w);
    release_record(b1);
    release_record(b3);
    report("worker", b0, 24 + w, "live");
    report("worker", b1, 130 + w, "freed");
    report("worker", b2, 3000 + w, "live");
    report("worker", b3, 64 + w, "freed");
    fflush(stdout);
    pthread_barrier_wait(&allocated);
    wait_for_quit();
    release_record(b0);
    release_record(b2);
    return NULL;
}

NOINLINE void take_snapshot(void)
{
    raise(SIGUSR2);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "snapshot";
    printf("pid %d\n", getpid());
    fflush(stdout);

    /* A stale tag at its own address: P and A are large blocks (a span of
     * 10 slices each, one after the other) bigger than the quarantine
     * budget, so free() hands them to the heap at once; A's span merges
     * with P's, and NEW (19 slices) is carved from the merged span, its
     * payload covering A's old tag. */
    void *p = make_record(600000);
    void *a = make_record(600000);
    void *guard = make_record(100);
    release_record(p);
    release_record(a);
    char *fresh = make_record(1200000);
    if ((char *)a >= fresh && (char *)a < fresh + 1200000)
        printf("recycled %p %p\n", a, (void *)fresh);
    else
        printf("recycled-miss %p %p\n", a, (void *)fresh);
    report("main", fresh, 1200000, "live");
    report("main", guard, 100, "live");

    char *m1 = make_record(40);
    char *m2 = make_record(100);
    char *holder = make_record(96);
    memset(m1, 0x33, 40);
    memset(holder, 0, 96);
    memcpy(holder + 32, m1 - 16, 16); /* a copy of m1's 16-byte tag, at the wrong address */
    printf("copy %p %p\n", (void *)(holder + 32), (void *)holder);
    report("main", m1, 40, "live");
    report("main", holder, 96, "live");

    pthread_barrier_init(&allocated, NULL, WORKERS + 1);
    pthread_t th[WORKERS];
    for (size_t w = 0; w < WORKERS; w++)
        pthread_create(&th[w], NULL, worker, (void *)(uintptr_t)(w + 1));
    pthread_barrier_wait(&allocated);

    release_record(m2);
    char *dangling = m2; /* kept on purpose: the test asks who owns it */
    report("main", m2, 100, "freed");
    printf("dangling %p\n", (void *)dangling);

    /* every worker is inside wait_for_quit: its shadow stack is known */
    pthread_mutex_lock(&quit_lock);
    while (parked < WORKERS)
        pthread_cond_wait(&quit_cond, &quit_lock);
    pthread_mutex_unlock(&quit_lock);

    void (*stats_fn)(struct libtag_stats *) =
        (void (*)(struct libtag_stats *))dlsym(RTLD_DEFAULT, "libtag_stats");
    struct libtag_stats st;
    memset(&st, 0, sizeof st);
    if (stats_fn)
        stats_fn(&st);
    printf("stats %llu %llu\n", (unsigned long long)st.live_blocks,
           (unsigned long long)st.live_bytes);
    fflush(stdout);

    if (strcmp(mode, "wait") == 0) {
        printf("ready\n");
        fflush(stdout);
        char buf[64];
        while (read(0, buf, sizeof buf) > 0)
            ;
    } else {
        take_snapshot();
        printf("snapped\n");
        fflush(stdout);
    }

    pthread_mutex_lock(&quit_lock);
    quit = 1;
    pthread_cond_broadcast(&quit_cond);
    pthread_mutex_unlock(&quit_lock);
    for (size_t w = 0; w < WORKERS; w++)
        pthread_join(th[w], NULL);
    return 0;
}
