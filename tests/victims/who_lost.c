/* who_lost.c - a block a worker thread allocated and then lost every pointer
 * to, while libtag still remembers it (its per-thread list of recent
 * allocations, for the overflow sweep, lives in libtag's TLS block inside
 * the worker's stack mapping).
 *
 * The worker allocates 200 bytes in lose_block, prints "lost=0x...", drops
 * the pointer and blocks; main takes an on-demand snapshot, then lets the
 * worker finish.  Prints "worker_tid=N"; exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

extern int libtag_snapshot(void) __attribute__((weak));

static int ready[2], go[2];

__attribute__((noinline)) static void *lose_block(void)
{
    char *p = malloc(200);
    memset(p, 1, 200);
    printf("lost=%p\n", (void *)p);
    return p;
}

static void *worker(void *arg)
{
    (void)arg;
    char c;
    void *volatile p = lose_block();
    p = NULL;  /* the program holds no pointer to it any more */
    printf("worker_tid=%ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
        abort();
    return NULL;
}

int main(void)
{
    pthread_t th;
    char c;
    if (pipe(ready) || pipe(go) || pthread_create(&th, NULL, worker, NULL) ||
        read(ready[0], &c, 1) != 1)
        return 1;
    if (!libtag_snapshot || libtag_snapshot() != 0)
        return 1;
    if (write(go[1], "g", 1) != 1)
        return 1;
    pthread_join(th, NULL);
    return 0;
}
