/* rob_small.c - a tiny libtag victim that snapshots itself: the seed cores of
 * the reader fuzz (tests/integration/test_fuzz_reader.py).
 *
 * Two threads allocate a handful of blocks through two call paths, free some
 * (they wait in the quarantine, so the core holds freed tags and free
 * records too), then main raises SIGUSR2: libtag forks and the child writes
 * the core (LIBTAG_CORE=self keeps the core small and independent of the
 * machine's core_pattern).  It prints "pid N" and "block ADDR SIZE STATE"
 * for every block so the test can ask whoowns about real addresses.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBLOCKS 6

static void *blocks[2][NBLOCKS];

__attribute__((noinline)) static void *make(size_t n, int fill)
{
    void *p = malloc(n);
    memset(p, fill, n);
    return p;
}

__attribute__((noinline)) static void fill_row(void **row, int seed)
{
    for (int i = 0; i < NBLOCKS; i++)
        row[i] = make((size_t)(24 + 40 * i + seed), 'a' + i);
    /* a pointer from one block to the next: referrers for whoowns */
    *(void **)row[1] = row[2];
    free(row[3]);
    free(row[5]);
    row[3] = row[5] = NULL;
}

static void *worker(void *arg)
{
    fill_row(blocks[1], (int)(long)arg);
    return NULL;
}

int main(void)
{
    pthread_t th;
    fill_row(blocks[0], 0);
    if (pthread_create(&th, NULL, worker, (void *)8L) != 0)
        return 1;
    pthread_join(th, NULL);
    printf("pid %d\n", (int)getpid());
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NBLOCKS; i++)
            if (blocks[r][i])
                printf("block %p %d live\n", blocks[r][i], 24 + 40 * i + (r ? 8 : 0));
    fflush(stdout);
    raise(SIGUSR2);
    printf("done\n");
    return 0;
}
