/* rt_noise.c - a program whose biggest live block is the C library's own:
 * stdout's buffer, which glibc allocates at the first printf (its size is
 * stdout's st_blksize), beside a few small blocks of the program's own.
 *
 *   rt_noise     print the facts, raise(SIGUSR2) (an on-demand snapshot
 *                into $LIBTAG_DIR), exit 0
 *
 * The facts (one per line):
 *
 *   blksize N          fstat(1).st_blksize: the size of stdout's buffer
 *   own ADDR SIZE      each block of the program's own (keep_small <- main)
 *   pid PID
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OWN_BLOCKS 3
#define OWN_SIZE 100

static void *g_own[OWN_BLOCKS];

__attribute__((noinline)) static void *keep_small(size_t n)
{
    char *p = malloc(n);
    memset(p, 0x22, n);
    return p;
}

int main(void)
{
    struct stat st;
    if (fstat(1, &st) != 0)
        return 2;
    for (int i = 0; i < OWN_BLOCKS; i++)
        g_own[i] = keep_small(OWN_SIZE);
    /* the first printf: glibc allocates stdout's buffer (st_blksize bytes) */
    printf("blksize %ld\n", (long)st.st_blksize);
    for (int i = 0; i < OWN_BLOCKS; i++)
        printf("own %p %d\n", g_own[i], OWN_SIZE);
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    raise(SIGUSR2);
    return 0;
}
