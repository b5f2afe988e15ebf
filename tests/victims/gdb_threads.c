/* gdb_threads.c - threads parked in known functions while the main thread
 * takes a snapshot, for gdb on a snapshot core (every thread's registers).
 *
 *   gdb_threads        starts 3 threads; thread i parks in park_<name>()
 *                      (alpha, beta, gamma), blocked in read(2) on a pipe;
 *                      main calls libtag_snapshot() from take_snapshot_here()
 *                      once all three are parked, then releases them, joins
 *                      and exits 0.
 *
 * Output: "thread <name> tid=<n>" per thread, "main tid=<n>", then
 * "snapshot rc=<n>" (libtag_snapshot()'s result).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* weak: the program links without libtag and gets it preloaded */
extern int libtag_snapshot(void) __attribute__((weak));

static int gate[2];
static pthread_barrier_t parked;
static pid_t tids[3];

/* Each parks in its own frame: gdb's bt of that thread names it.  The
 * barrier is passed before read(): a thread may still be on its way into
 * read() when the snapshot stops it, so its innermost frame is read() or
 * park_<name>() itself - either way park_<name>() is on its stack. */
#define PARK(name, i)                                                         \
    __attribute__((noinline)) static void park_##name(void)                   \
    {                                                                         \
        char c;                                                               \
        tids[i] = (pid_t)syscall(SYS_gettid);                                 \
        void *keep = malloc(64 + i);                                          \
        pthread_barrier_wait(&parked);                                        \
        if (read(gate[0], &c, 1) < 0)                                         \
            perror("read");                                                   \
        free(keep);                                                           \
        __asm__ volatile("" ::: "memory");                                    \
    }
PARK(alpha, 0)
PARK(beta, 1)
PARK(gamma, 2)

static void *run(void *arg)
{
    switch ((int)(long)arg) {
    case 0: park_alpha(); break;
    case 1: park_beta(); break;
    default: park_gamma(); break;
    }
    return NULL;
}

__attribute__((noinline)) static int take_snapshot_here(void)
{
    int rc = libtag_snapshot ? libtag_snapshot() : -1;
    __asm__ volatile("" ::: "memory");
    return rc;
}

int main(void)
{
    static const char *const names[] = {"alpha", "beta", "gamma"};
    pthread_t th[3];
    if (pipe(gate) < 0)
        return 1;
    pthread_barrier_init(&parked, NULL, 4);
    for (long i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, run, (void *)i);
    pthread_barrier_wait(&parked);
    /* give the threads time to enter read(): not needed for the test's
     * assertions (see PARK), only to make the usual case the blocked one */
    usleep(100000);
    for (int i = 0; i < 3; i++)
        printf("thread %s tid=%d\n", names[i], (int)tids[i]);
    printf("main tid=%d\n", (int)syscall(SYS_gettid));
    int rc = take_snapshot_here();
    printf("snapshot rc=%d\n", rc);
    fflush(stdout);
    if (write(gate[1], "xxx", 3) != 3)
        return 1;
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    return 0;
}
