/* snap_churn.c - a multi-threaded victim that keeps allocating while it is
 * snapshotted.
 *
 *   snap_churn NTHREADS
 *
 * Each thread repeats one deterministic round until stdin reaches EOF (or a
 * line "stop"): allocate BLOCKS blocks of LCG-chosen sizes, fill them with
 * LCG bytes, grow every third one with realloc, read everything back into a
 * checksum, free all.  Every round of thread t must give the same checksum;
 * tests/integration/test_snapshot.py computes the expected value in Python.
 * Prints "ready pid=N" once every thread has finished its first round, and at
 * the end "thread T checksum=0x... rounds=R bad=B" per thread.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCKS 64
#define MAXT 64

static volatile int stop;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int started;

struct worker {
    int index;
    uint64_t checksum;  /* of the first round */
    uint64_t rounds;
    uint64_t bad;       /* rounds whose checksum differed from the first */
};

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void fill(unsigned char *p, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)lcg(s);
}

static uint64_t one_round(int index)
{
    uint64_t s = 0x1000u + (uint64_t)index;
    unsigned char *blocks[BLOCKS];
    size_t sizes[BLOCKS];
    uint64_t sum = 0;
    for (int b = 0; b < BLOCKS; b++) {
        sizes[b] = 1 + lcg(&s) % 512;
        blocks[b] = malloc(sizes[b]);
        if (!blocks[b])
            abort();
        fill(blocks[b], sizes[b], &s);
    }
    for (int b = 0; b < BLOCKS; b += 3) {
        size_t grow = sizes[b] + 1 + lcg(&s) % 256;
        unsigned char *q = realloc(blocks[b], grow);
        if (!q)
            abort();
        for (size_t i = sizes[b]; i < grow; i++)
            q[i] = (unsigned char)lcg(&s);
        blocks[b] = q;
        sizes[b] = grow;
    }
    for (int b = 0; b < BLOCKS; b++) {
        for (size_t i = 0; i < sizes[b]; i++)
            sum = sum * 31 + blocks[b][i];
        free(blocks[b]);
    }
    return sum;
}

static void *churn(void *arg)
{
    struct worker *w = arg;
    w->checksum = one_round(w->index);
    w->rounds = 1;
    pthread_mutex_lock(&lock);
    started++;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    while (!stop) {
        if (one_round(w->index) != w->checksum)
            w->bad++;
        w->rounds++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4;
    if (n < 1 || n > MAXT)
        return 2;
    pthread_t th[MAXT];
    struct worker w[MAXT];
    memset(w, 0, sizeof w);
    for (int i = 0; i < n; i++) {
        w[i].index = i;
        if (pthread_create(&th[i], NULL, churn, &w[i]) != 0)
            return 1;
    }
    pthread_mutex_lock(&lock);
    while (started < n)
        pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);

    char line[64];
    while (fgets(line, sizeof line, stdin) && strcmp(line, "stop\n") != 0)
        ;
    stop = 1;
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        printf("thread %d checksum=0x%016llx rounds=%llu bad=%llu\n", i,
               (unsigned long long)w[i].checksum, (unsigned long long)w[i].rounds,
               (unsigned long long)w[i].bad);
    return 0;
}
