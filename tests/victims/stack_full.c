/* stack_full.c - more distinct stacks than libtag's stack table holds.
 * Run under libtag with a small table (LIBTAG_STACK_NODES=1024).
 *
 *   stack_full N
 *
 * Allocates one 24-byte block on each of N paths (path i: DEPTH levels of
 * step(), each calling left() when bit k of i is set, else right(), the
 * lowest bit outermost), so every path is a new stack and the table fills
 * after a few hundred.  Prints "pid=N", "depth=DEPTH", "shallow=0x..." (the
 * block of path 3, made before the table filled) and "deep=0x..." (path
 * N-1, made after), snapshots itself (SIGUSR2) and prints "done".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define DEPTH 11

static volatile int sink;

void *step(int d, unsigned bits);

__attribute__((noinline)) void *leaf(void)
{
    void *p = malloc(24);
    sink++;
    return p;
}

__attribute__((noinline)) void *left(int d, unsigned bits)
{
    void *p = step(d, bits);
    sink++;  /* no tail call: every level keeps its frame */
    return p;
}

__attribute__((noinline)) void *right(int d, unsigned bits)
{
    void *p = step(d, bits);
    sink += 2;
    return p;
}

__attribute__((noinline)) void *step(int d, unsigned bits)
{
    void *p = d == 0 ? leaf() : (bits & 1) ? left(d - 1, bits >> 1) : right(d - 1, bits >> 1);
    sink++;
    return p;
}

int main(int argc, char **argv)
{
    unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 2048;
    void **keep = calloc(n, sizeof *keep);
    for (unsigned i = 0; i < n; i++)
        keep[i] = step(DEPTH, i);
    printf("pid=%d\ndepth=%d\nshallow=%p\ndeep=%p\n", (int)getpid(), DEPTH, keep[3],
           keep[n - 1]);
    fflush(stdout);
    raise(SIGUSR2);
    printf("done\n");
    return 0;
}
