/* foreign.h - blocks glibc handed out before libtag was attached to a
 * running process (foreign.c; the attach itself is life/attach.c). */
#ifndef LIBTAG_FOREIGN_H
#define LIBTAG_FOREIGN_H

#include <stddef.h>
#include <stdint.h>
#include "base/base.h"
#include "heap/heap.h"

extern int _tag_attached;  /* libtag_attach() ran: glibc's old blocks live on */
extern int _tag_late;      /* loaded after start (dlopen): not interposing by itself */
/* A block glibc handed out before the attach: a pointer outside libtag's
 * heap region once attached (never a guess from the bytes in front of it).
 * Only tested where a pointer failed libtag's own checks. */
TAG_INLINE int _tag_foreign(const void *p)
{
    return TAG_UNLIKELY(__atomic_load_n(&_tag_attached, __ATOMIC_RELAXED)) &&
           (uint64_t)((uintptr_t)p - _tag_heap.base) >= _tag_heap.slices_max * TAG_HEAP_SLICE;
}
TAG_COLD void _tag_foreign_free(void *p);
TAG_COLD void *_tag_foreign_realloc(void *p, size_t n);
TAG_COLD size_t _tag_foreign_usable(const void *p);

#endif /* LIBTAG_FOREIGN_H */
