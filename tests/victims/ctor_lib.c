/* ctor_lib.c - a shared library whose constructor allocates before main,
 * and before libtag's own constructor (the loader runs a preloaded
 * library's constructor after those of the libraries it does not need):
 * ctor_init -> ctor_alloc -> ctor_helper -> malloc(CTOR_SIZE).
 * tests/victims/ctor_main.c links it and prints the block. */
#include <stdlib.h>
#include <string.h>

#define CTOR_SIZE 333

void *g_ctor_block;

__attribute__((noinline)) static void *ctor_helper(size_t n)
{
    void *p = malloc(n);
    memset(p, 0x5c, n);
    return p;
}

__attribute__((noinline)) static void ctor_alloc(void)
{
    g_ctor_block = ctor_helper(CTOR_SIZE);
}

__attribute__((constructor)) static void ctor_init(void)
{
    ctor_alloc();
}
