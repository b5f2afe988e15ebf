/* foreign.c - blocks glibc handed out before libtag was attached to a
 * running process (life/attach.c attaches it): free, realloc and
 * malloc_usable_size of a pointer outside libtag's heap region go to
 * glibc once attached (_tag_foreign, alloc/foreign.h: the exact-free
 * arithmetic on the address, never a guess from the bytes in front of
 * it). */
#include <stddef.h>

#include "alloc/foreign.h"

int _tag_attached;
int _tag_late;

extern void __libc_free(void *);
extern void *__libc_realloc(void *, size_t);

/* The usable size of a glibc chunk (its header: the size word 8 bytes in
 * front of the pointer, bit 1 set for an mmap'ed one). */
static size_t glibc_usable(const void *p)
{
    size_t head = ((const size_t *)p)[-1];
    size_t size = head & ~(size_t)7;
    return (head & 2) ? size - 16 : size - 8;
}

void _tag_foreign_free(void *p)
{
    __libc_free(p);
}

void *_tag_foreign_realloc(void *p, size_t n)
{
    return __libc_realloc(p, n);
}

size_t _tag_foreign_usable(const void *p)
{
    return glibc_usable(p);
}
