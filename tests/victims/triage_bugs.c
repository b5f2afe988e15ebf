/* Three bugs for `forensics triage` and the crash signature: the same bug
 * from several runs (and from two binaries built alike) must group
 * together, and each other bug apart.
 *
 *   triage_bugs double   make_node's block freed twice by release
 *   triage_bugs other    make_other's block freed twice by release: the
 *                        same wrong free, another allocation site
 *   triage_bugs segv     a store through a NULL-page pointer in store_into
 *
 * Prints "pid N" first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) char *make_node(size_t n)
{
    char *p = malloc(n);
    memset(p, 'n', n);
    return p;
}

__attribute__((noinline)) char *make_other(size_t n)
{
    char *p = malloc(n);
    memset(p, 'o', n);
    return p;
}

__attribute__((noinline)) void release(char *p)
{
    free(p);
    __asm__ volatile("" : : : "memory");  /* a call, not a tail call: release stays in the stack */
}

__attribute__((noinline)) void store_into(int *p)
{
    *(volatile int *)p = 42;
}

int main(int argc, char **argv)
{
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    const char *what = argc > 1 ? argv[1] : "double";
    if (strcmp(what, "segv") == 0) {
        store_into((int *)(long)(argc > 2 ? 0x10 : 0x18));
        return 0;
    }
    char *p = strcmp(what, "other") == 0 ? make_other(72) : make_node(48);
    release(p);
    release(p);
    return 0;
}
