/* deepstack.c - does a capture's cost stay flat as the stack deepens?
 *
 * base() recurses to depth D (the stable part of every stack), then loops:
 * mid() descends 4 more levels to leaf(), which does 8 malloc/free pairs
 * through xalloc()/xfree() (one-line allocator wrappers, like lua's l_alloc,
 * so the function that called malloc returns right after every capture),
 * then everything down to base's innermost frame returns and re-descends.
 * Every capture's stack is about D + 8 frames deep; the innermost 7 change.
 *
 *   gcc -O2 -fno-omit-frame-pointer -o deepstack deepstack.c
 *   ./deepstack D ITERS      (2 * 8 * ITERS captures)
 */
#include <stdio.h>
#include <stdlib.h>

static void *volatile sinkp;

__attribute__((noinline)) static void *xalloc(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline)) static void xfree(void *p)
{
    free(p);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void leaf(void)
{
    for (int j = 0; j < 8; j++) {
        void *p = xalloc(32 + j);
        sinkp = p;
        xfree(p);
    }
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void mid(int d)
{
    if (d)
        mid(d - 1);
    else
        leaf();
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void base(int d, long iters)
{
    if (d)
        base(d - 1, iters);
    else
        for (long i = 0; i < iters; i++)
            mid(3);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
    int d = argc > 1 ? atoi(argv[1]) : 10;
    long iters = argc > 2 ? atol(argv[2]) : 10000;
    base(d, iters);
    printf("depth %d iters %ld\n", d, iters);
    return 0;
}
