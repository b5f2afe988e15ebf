/* glibc_threads.c - a program that never runs libtag whose four threads
 * each allocate and free blocks in glibc's heap (each thread's first malloc
 * gives it an arena of its own), print where, wait, and then the main thread
 * aborts - the kernel writes the core while every thread is still alive.
 *
 * Facts, one per line (user pointers as 0x...):
 *
 *   pid PID
 *   thread I TID                 worker I (1..4) is kernel thread TID;
 *                                main is thread 0
 *   chunk I PTR SIZE STATE       a block of SIZE requested bytes that
 *                                thread I allocated: STATE inuse, or
 *                                tcache (freed by I: in I's tcache)
 *
 * Worker I's blocks are 100 + 48 * I bytes, a size class of its own.
 * Worker 4 then fills more than one 64 MiB heap of its arena (BIG blocks of
 * 100000 bytes, one byte of each touched), frees every third - they lose
 * NON_MAIN_ARENA when glibc files them - and mallocs once more, which
 * sorts them into the large bins; it prints a few of them (state inuse or
 * largebin).
 * Built -O2 without libtag.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WORKERS 4
#define BLOCKS 6
#define BIG 800

static pthread_barrier_t ready;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;
static void *volatile sink;

static void fact(int i, void *p, size_t size, const char *state)
{
    printf("chunk %d %p %zu %s\n", i, p, size, state);
}

static void blocks(int i, size_t size)
{
    void *b[BLOCKS];
    for (int k = 0; k < BLOCKS; k++) {
        b[k] = malloc(size);
        memset(b[k], 0x30 + i, size);
    }
    /* every other one freed: into this thread's tcache */
    for (int k = 1; k < BLOCKS; k += 2)
        free(b[k]);
    pthread_mutex_lock(&out);
    printf("thread %d %ld\n", i, (long)syscall(SYS_gettid));
    for (int k = 0; k < BLOCKS; k++)
        fact(i, b[k], size, k % 2 ? "tcache" : "inuse");
    fflush(stdout);
    pthread_mutex_unlock(&out);
    sink = b[0];
}

static void *big[BIG];

static void big_blocks(int i)
{
    for (int k = 0; k < BIG; k++) {
        big[k] = malloc(100000);
        *(volatile char *)big[k] = 1;
    }
    for (int k = 0; k < BIG; k += 3)
        free(big[k]);
    void *sort = malloc(120000);  /* sorts the unsorted bin */
    *(volatile char *)sort = 1;
    sink = sort;
    pthread_mutex_lock(&out);
    fact(i, sort, 120000, "inuse");
    fact(i, big[1], 100000, "inuse");
    fact(i, big[BIG - 1], 100000, "inuse");
    fact(i, big[0], 100000, "largebin");
    fact(i, big[399], 100000, "largebin");
    fact(i, big[BIG - 2], 100000, "largebin");
    fflush(stdout);
    pthread_mutex_unlock(&out);
}

static void *worker(void *arg)
{
    int i = (int)(long)arg;
    blocks(i, 100 + 48 * i);
    if (i == WORKERS)
        big_blocks(i);
    pthread_barrier_wait(&ready);
    for (;;)
        pause();  /* alive until the core */
    return NULL;
}

int main(void)
{
    pthread_t t[WORKERS];
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    printf("pid %d\n", (int)getpid());
    pthread_barrier_init(&ready, NULL, WORKERS + 1);
    for (long i = 1; i <= WORKERS; i++)
        pthread_create(&t[i - 1], NULL, worker, (void *)i);
    pthread_barrier_wait(&ready);
    blocks(0, 100);
    abort();
}
