/* The resident memory of many threads alive at once, each allocating and
 * freeing once from a few call sites: what libtag costs a thread.  Run it
 * under libtag with LIBTAG_STACK_STATS=1 and =0; the difference is the
 * per-stack counters', and against the bare program libtag's whole.
 *
 *   gcc -O2 -g -pthread -fno-omit-frame-pointer -o threadmem bench/threadmem.c
 *   LD_PRELOAD=.../libtag.so LIBTAG_QUIET=1 ./threadmem 1000 10
 *
 * Prints "threads=N sites=S rss_kb=K", VmRSS taken while every thread is
 * alive (64 KiB stacks, so the threads' own stacks weigh little). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int sites;
static pthread_barrier_t all_alive;

/* One call of malloc each, not a tail call: ten distinct stacks. */
#define SITE(n)                                                   \
    __attribute__((noinline)) static void *site##n(size_t k)      \
    {                                                             \
        void *p = malloc(k);                                      \
        __asm__ volatile("" ::: "memory");                        \
        return p;                                                 \
    }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7) SITE(8) SITE(9)
static void *(*const site[10])(size_t) = {site0, site1, site2, site3, site4,
                                          site5, site6, site7, site8, site9};

static void *worker(void *arg)
{
    void *keep[10];
    for (int i = 0; i < sites; i++)
        keep[i] = site[i](32);
    for (int i = 0; i < sites; i++)
        free(keep[i]);
    pthread_barrier_wait(&all_alive);  /* measured here */
    pthread_barrier_wait(&all_alive);
    return arg;
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = atol(line + 6);
    if (f)
        fclose(f);
    return kb;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    sites = argc > 2 ? atoi(argv[2]) : 10;
    if (n < 1 || sites < 0 || sites > 10) {
        fprintf(stderr, "usage: threadmem THREADS [SITES <= 10]\n");
        return 2;
    }
    pthread_t *t = calloc((size_t)n, sizeof *t);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 << 10);
    pthread_barrier_init(&all_alive, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], &attr, worker, NULL) != 0) {
            fprintf(stderr, "threadmem: thread %d not created\n", i);
            return 1;
        }
    pthread_barrier_wait(&all_alive);
    printf("threads=%d sites=%d rss_kb=%ld\n", n, sites, rss_kb());
    pthread_barrier_wait(&all_alive);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    free(t);
    return 0;
}
