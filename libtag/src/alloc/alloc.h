/* alloc.h - the malloc family's bodies (interpose.c), shared with the C++
 * operators (new_delete.c), and the entry points by their hidden names. */
#ifndef LIBTAG_ALLOC_H
#define LIBTAG_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include "base/base.h"

/* The malloc family's bodies, shared with the C++ operators (new_delete.c):
 * allocate as kind (enum libtag_alloc_kind); release a block the way
 * dealloc (the same numbers) expects; align as glibc's memalign. */
void *_tag_alloc(size_t size, size_t align, int zero, uint32_t kind, void *ret, void *frame);
void *_tag_memalign(size_t align, size_t size, uint32_t kind, void *ret, void *frame);
void _tag_free(void *ptr, uint32_t dealloc, void *ret, void *frame);
/* Is a release of a block made as alloc_kind by a function expecting
 * dealloc one libtag can call a mismatch?  (Not when the program replaces
 * operator new or delete itself.) */
TAG_COLD int _tag_cxx_checked(uint32_t alloc_kind, uint32_t dealloc);
/* interpose.c's entry points by hidden names: their own addresses, which
 * attach.c writes into GOTs and control.c compares with what the process
 * calls malloc to learn whether libtag was preloaded */
void *_tag_malloc_self(size_t);
void _tag_free_self(void *);
void *_tag_calloc_self(size_t, size_t);
void *_tag_realloc_self(void *, size_t);
void *_tag_reallocarray_self(void *, size_t, size_t);
void *_tag_memalign_self(size_t, size_t);
void *_tag_aligned_alloc_self(size_t, size_t);
int _tag_posix_memalign_self(void **, size_t, size_t);
void *_tag_valloc_self(size_t);
void *_tag_pvalloc_self(size_t);
size_t _tag_malloc_usable_size_self(void *);

/* Called up: the allocation path collects exited snapshot children
 * (snapshot/snapshot.c, a folder above). */
TAG_COLD void _tag_snapshot_reap(void);
extern int _tag_snapshot_pending;

#endif /* LIBTAG_ALLOC_H */
