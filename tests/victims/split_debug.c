/* split_debug.c - a program to strip as distributions do, whose stack the
 * separate debug file must name.
 *
 * Built -O2 -g, then split: objcopy --only-keep-debug, strip --strip-all,
 * the debug file put where a -dbgsym package puts it (.build-id/xx/rest.debug)
 * or named by .gnu_debuglink.  It allocates one block in allocate_in_leaf
 * <- middle <- main, keeps it in the global `held`, prints what it did and
 * takes an on-demand snapshot (raise(SIGUSR2)), exit 0.  Prints:
 *   pid PID
 *   live ADDR SIZE                 the block held by `held`
 *   held ADDR                      the global
 *   fn NAME ADDR                   allocate_in_leaf, middle, main: entry addresses
 *
 * noipa: no clone (allocate_in_leaf.constprop.0), no inlining, no tail
 * call: each function is a frame of its own under its own name.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HELD_SIZE 72

char *held;

__attribute__((noipa)) char *allocate_in_leaf(size_t size)
{
    char *p = malloc(size);
    memset(p, 0x5a, size);
    return p;
}

__attribute__((noipa)) char *middle(size_t size)
{
    char *p = allocate_in_leaf(size);
    p[0] = 1;  /* work after the call: not a tail call */
    return p;
}

int main(void)
{
    printf("pid %d\n", (int)getpid());
    held = middle(HELD_SIZE);
    printf("live %p %d\nheld %p\n", (void *)held, HELD_SIZE, (void *)&held);
    printf("fn allocate_in_leaf %p\nfn middle %p\nfn main %p\n", (void *)allocate_in_leaf,
           (void *)middle, (void *)main);
    fflush(stdout);
    raise(SIGUSR2);
    return 0;
}
