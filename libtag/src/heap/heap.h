/* heap.h - libtag's heap (heap.c): its types and interface, with the hot
 * paths' inline bodies (a thread cache's pop and push, a pointer's span, a
 * slot's start), so each stays one inline body in its caller.  A program
 * that uses the heap alone includes just this and links CMake's
 * libtag_heap target (libtag/CMakeLists.txt): libtag/tests' unit tests and
 * bench/'s floors.
 *
 * What heap.c takes from the rest of libtag, all of it from base/ (a
 * program that uses the heap alone gets it from libtag/alone/base_alone.c):
 *   _tag_ctl.secret  read once by _tag_heap_init: the free links' key;
 *   _tag_log         two lines: a free block's link found written over, the
 *                    region not reserved;
 *   _tag_fatal       a TAG_ASSERT that fails (the debug build).
 * fork(): _tag_heap_atfork_prepare and _tag_heap_atfork_release around it
 * (life/threads.c's handlers call them). */
#ifndef LIBTAG_HEAP_H
#define LIBTAG_HEAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "base/base.h"
#include "base/control.h"

/* libtag's own heap (heap.c says how it works, docs/design.md why).  A
 * slice is 64 KiB of the heap's region; spans of slices hold the blocks of
 * one size class, or one large block. */
/* TAG_HEAP_SLICE: tag_abi.h ("heap") */
/* The largest block libtag hands out (the heap's own limit, 64 TiB). */
#define TAG_BLOCK_MAX ((size_t)1 << 46)
#define TAG_HEAP_SMALL_MAX (64u * 1024)   /* larger blocks: a span each */
#define TAG_HEAP_CLASSES   80u            /* 16..128 by 16, then 8 a doubling */
/* span kinds: enum libtag_span_kind (tag_abi.h) */
#define TAG_SPAN_ZERO    1u  /* its memory reads as zeros (fresh, released) */
#define TAG_SPAN_PARTIAL 2u  /* in its class's list of spans with free blocks */
/* One per slice.  Every slice of a span leads back (first_off) to the
 * span's first slice, whose entry describes the span.  The layout is
 * struct libtag_slice's (tag_abi.h: a reader walks the heap by it), with
 * pointers where libtag follows them. */
struct tag_slice {
    uint32_t first_off;     /* slices back to the span's first slice */
    uint32_t slices;        /* first slice: the span's length */
    uint32_t kind;          /* enum libtag_span_kind */
    uint32_t flags;         /* TAG_SPAN_* */
    uint32_t cls;           /* TAG_SPAN_SMALL: its size class */
    uint32_t block_size;    /* TAG_SPAN_SMALL: bytes of one slot */
    uint32_t capacity;      /* slots in the span */
    uint32_t carved;        /* slots handed out at least once: [0, carved) */
    uint32_t nfree;         /* slots in the span's free list */
    uint32_t block_off;     /* TAG_SPAN_LARGE: its block's slot, from the
                               span's start */
    union {
        void *free;         /* TAG_SPAN_SMALL: its free list (class lock) */
        uint64_t large_size;/* TAG_SPAN_LARGE: its block's requested size */
    };
    struct tag_slice *next, *prev;  /* class list / free bin (locks) */
};
/* The heap's global state (heap.c). */
struct tag_heap {
    uintptr_t base;         /* slice 0 */
    uint64_t slices_max;    /* slices the region has room for */
    uint64_t used;          /* slices [0, used) were ever handed out */
    uint64_t committed;     /* slices [0, committed) are read-write */
    struct tag_slice *meta; /* one entry a slice */
    uint64_t key;           /* free blocks' links are xor'ed with it */
    uint64_t large_count, large_bytes;  /* large spans live (page lock) */
    uint64_t broken_links;  /* free lists found overwritten */
};
/* ... laid out as tag_abi.h says */
_Static_assert(sizeof(struct tag_slice) == sizeof(struct libtag_slice), "slice entry");
_Static_assert(offsetof(struct tag_slice, carved) == offsetof(struct libtag_slice, carved), "slice");
_Static_assert(offsetof(struct tag_slice, block_off) == offsetof(struct libtag_slice, block_off),
               "slice");
_Static_assert(offsetof(struct tag_slice, large_size) == offsetof(struct libtag_slice, large_size),
               "slice");
_Static_assert(sizeof(struct tag_heap) == sizeof(struct libtag_heap), "heap");
_Static_assert(offsetof(struct tag_heap, used) == offsetof(struct libtag_heap, used), "heap");
_Static_assert(offsetof(struct tag_heap, meta) == offsetof(struct libtag_heap, meta), "heap");
/* A thread's cache of free blocks, per class: head, a LIFO list of the
 * blocks it freed (count of them, spilled past the class's limit), and
 * bulk, a span's whole free list taken at once (uncounted, never spilled:
 * only allocations drain it).  malloc() takes head first: the blocks
 * freed last are the ones still in the CPU's caches. */
struct tag_heap_cache {
    void *head;
    uint32_t count;
    uint32_t reserved;
    void *bulk;
};
struct tag_heap_stats {
    uint64_t used, free_spans, large_count, large_bytes;
};


extern struct tag_heap _tag_heap;
TAG_COLD void _tag_heap_init(void);
/* Is p in the part of the region the heap has used?  (Arithmetic only.)
 * Forced inline: LTO made it a call in every link the spill and the
 * central lists follow. */
TAG_INLINE int _tag_heap_has(const void *p)
{
    uint64_t used = __atomic_load_n(&_tag_heap.used, __ATOMIC_RELAXED);
    return (uint64_t)((uintptr_t)p - _tag_heap.base) < used * TAG_HEAP_SLICE;
}
/* The class of a slot of n bytes, 1 <= n <= TAG_HEAP_SMALL_MAX: 16..128
 * by 16, then eight a doubling (at most 12.5 % rounding). */
static inline unsigned _tag_heap_class(size_t n)
{
    if (n <= 128)
        return (unsigned)((n + 15) >> 4) - 1;
    unsigned b = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1));
    return 8u + (b - 7u) * 8u + (unsigned)(((n - 1) >> (b - 3)) & 7u);
}
void *_tag_heap_alloc_slow(struct tag_heap_cache *hc, size_t n, size_t align, int zero);
void _tag_heap_free_slow(struct tag_heap_cache *hc, void *p);
TAG_COLD void *_tag_heap_refill(struct tag_heap_cache *hc, unsigned c);
TAG_COLD void _tag_heap_spill(struct tag_heap_cache *hc, unsigned c);
extern uint32_t _tag_heap_cache_limit[TAG_HEAP_CLASSES];
/* Per class, floor(2^64 / slot bytes) + 1: an offset into a span times it,
 * high 64 bits, is the offset's slot (exact for 32-bit offsets: Lemire,
 * Kaser and Kurz, "Faster remainder by direct computation"). */
extern uint64_t _tag_heap_div[TAG_HEAP_CLASSES];
/* A free block's link (its first word, encoded; heap.c). */
TAG_COLD void *_tag_heap_link_broken(const void *block);
TAG_INLINE void *_tag_heap_link_next(void *block)
{
    uint64_t v;
    memcpy(&v, block, sizeof v);
    void *n = (void *)(uintptr_t)(v ^ _tag_heap.key);
    if (TAG_UNLIKELY(n && !_tag_heap_has(n)))
        return _tag_heap_link_broken(block);
    return n;
}
TAG_INLINE void _tag_heap_link_set(void *block, const void *next)
{
    uint64_t v = (uint64_t)(uintptr_t)next ^ _tag_heap.key;
    memcpy(block, &v, sizeof v);
}
/* A block from one class's cache: its LIFO list first, then its bulk
 * list; NULL when both are empty. */
TAG_INLINE void *_tag_heap_cache_pop(struct tag_heap_cache *hc)
{
    void *b = hc->head;
    if (TAG_LIKELY(b != NULL)) {
        hc->head = _tag_heap_link_next(b);
        hc->count--;
        return b;
    }
    b = hc->bulk;
    if (TAG_LIKELY(b != NULL))
        hc->bulk = _tag_heap_link_next(b);
    return b;
}
/* n bytes, 16-aligned, from the calling thread's cache hc (NULL: a thread
 * without one); zeroed if zero.  NULL with errno ENOMEM on exhaustion. */
TAG_INLINE void *_tag_heap_alloc(struct tag_heap_cache *hc, size_t n, int zero)
{
    if (TAG_LIKELY(hc != NULL && n <= TAG_HEAP_SMALL_MAX)) {
        void *b = _tag_heap_cache_pop(&hc[_tag_heap_class(n)]);
        if (TAG_LIKELY(b != NULL)) {
            if (zero)
                memset(b, 0, n);
            return b;
        }
    }
    return _tag_heap_alloc_slow(hc, n, 16, zero);
}
/* The span holding p (p in the used part of the region): its first
 * slice's entry, and where the span starts. */
static inline struct tag_slice *_tag_heap_span(const void *p)
{
    struct tag_slice *s = _tag_heap.meta + ((uintptr_t)p - _tag_heap.base) / TAG_HEAP_SLICE;
    return s - s->first_off;
}
/* The same, and p's offset from the span's start: p's offset in its slice
 * plus the slices before it (three instructions, where the start's
 * address from the entry's index is five and a subtraction). */
TAG_INLINE struct tag_slice *_tag_heap_span_off(const void *p, uint32_t *off)
{
    uint64_t rel = (uint64_t)((uintptr_t)p - _tag_heap.base);
    struct tag_slice *s = _tag_heap.meta + rel / TAG_HEAP_SLICE;
    uint32_t back = s->first_off;
    *off = (uint32_t)(rel % TAG_HEAP_SLICE) + back * (uint32_t)TAG_HEAP_SLICE;
    return s - back;
}
static inline char *_tag_heap_span_start(const struct tag_slice *s)
{
    return (char *)_tag_heap.base + (uint64_t)(s - _tag_heap.meta) * TAG_HEAP_SLICE;
}
/* Give back the block that starts at p (as _tag_heap_alloc or, aligned,
 * _tag_heap_alloc_slow returned it: always a slot's start). */
TAG_INLINE void _tag_heap_free_in(struct tag_heap_cache *hc, struct tag_slice *s, void *p)
{
    if (TAG_LIKELY(hc != NULL && s->kind == TAG_SPAN_SMALL)) {
        unsigned c = s->cls;
        TAG_ASSERT((uint64_t)((char *)p - _tag_heap_span_start(s)) % s->block_size == 0);
        _tag_heap_link_set(p, hc[c].head);
        hc[c].head = p;
        if (TAG_UNLIKELY(++hc[c].count > _tag_heap_cache_limit[c]))
            _tag_heap_spill(&hc[c], c);
        return;
    }
    _tag_heap_free_slow(hc, p);
}
TAG_INLINE void _tag_heap_free(struct tag_heap_cache *hc, void *p)
{
    _tag_heap_free_in(hc, _tag_heap_span(p), p);
}
/* Bytes usable from p to its slot's end. */
size_t _tag_heap_usable(const void *p);
/* Grow a large block in place to bytes (heap.c): 1 if it has room now. */
int _tag_heap_grow(void *p, size_t bytes);
/* Give every block of a thread's caches back (thread exit). */
void _tag_heap_flush(struct tag_heap_cache *hc);
/* malloc_trim: free spans back to the kernel; 1 if any was. */
int _tag_heap_trim(void);
void _tag_heap_stats(struct tag_heap_stats *st);
void _tag_heap_atfork_prepare(void);
void _tag_heap_atfork_release(void);
/* Offset off of span s is a slot's start in a small span: the common case
 * of a tag's place, in one multiply (its offset divisible by the slot
 * size: Lemire et al., n % d == 0 iff n * M < M, mod 2^64).  0 says
 * nothing: a large span, or an aligned block's tag past its slot's start. */
TAG_INLINE int _tag_small_slot_start(const struct tag_slice *s, uint32_t off)
{
    uint64_t m = _tag_heap_div[s->cls];
    return s->kind == TAG_SPAN_SMALL && (uint64_t)off * m < m;
}

#endif /* LIBTAG_HEAP_H */
