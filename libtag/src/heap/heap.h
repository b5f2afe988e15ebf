/* heap.h - libtag's heap (heap.c): its interface, with the hot paths'
 * inline bodies (a thread cache's pop and push, a pointer's span, a slot's
 * start), so each stays one inline body in its caller.  libtag_internal.h
 * includes it where heap.c's section was; a program that uses the heap
 * alone includes just this and links CMake's libtag_heap target
 * (libtag/CMakeLists.txt): libtag/tests' unit tests and bench/'s floors.
 *
 * What heap.c takes from the rest of libtag, all of it declared here (a
 * program that uses the heap alone gets it from libtag/alone/heap_alone.c):
 *   _tag_ctl.secret  read once by _tag_heap_init: the free links' key;
 *   _tag_log         two lines: a free block's link found written over, the
 *                    region not reserved;
 *   _tag_fatal       a TAG_ASSERT that fails (the debug build).
 * fork(): _tag_heap_atfork_prepare and _tag_heap_atfork_release around it
 * (thread.c's handlers call them). */
#ifndef LIBTAG_HEAP_H
#define LIBTAG_HEAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "stacks/thread.h"

extern struct libtag_control _tag_ctl;
void _tag_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void _tag_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

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
