/* tag.h - a block's tag (tag.c): the 16 bytes in front of every block
 * that are its whole record (stack, time, thread, size, state, how it was
 * allocated, a check value), its canary, and the free pattern a freed
 * block's payload holds.  The hot paths' bodies are inline here (every
 * malloc writes a tag, every free looks one up), so each stays one inline
 * body in its caller. */
#ifndef LIBTAG_TAG_H
#define LIBTAG_TAG_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __x86_64__
#include <emmintrin.h>  /* SSE2: the free pattern */
#endif
#include "base/base.h"
#include "base/control.h"
#include "base/options.h"
#include "heap/heap.h"

/* What _tag_lookup finds at a pointer. */
enum tag_lookup { TAG_NOT_OURS = 0, TAG_IS_LIVE = 1, TAG_IS_FREED = 2 };
/* 8 bytes of the free pattern; and "no damaged byte" (_tag_pattern_damage). */
#define TAG_PATTERN64 (0x0101010101010101ull * TAG_FREE_PATTERN)
#define TAG_INTACT ((size_t)-1)

static inline struct libtag_tag *_tag_of(const void *user)
{
    return (struct libtag_tag *)((char *)user - sizeof(struct libtag_tag));
}
/* The size of a block of a large span whose tag says TAG_SIZE_BIG (tag.c). */
uint64_t _tag_big_size(uint64_t tag_addr);
/* The requested size of the block whose tag, or a copy of it t, is at
 * tag_addr. */
TAG_INLINE uint64_t _tag_size_at(uint64_t tag_addr, const struct libtag_tag *t)
{
    uint32_t f = tag_size_field(t);
    return TAG_LIKELY(f != TAG_SIZE_BIG) ? f : _tag_big_size(tag_addr);
}
TAG_INLINE uint64_t _tag_size(const struct libtag_tag *t)
{
    return _tag_size_at((uint64_t)(uintptr_t)t, t);
}
static inline uint32_t _tag_state(const struct libtag_tag *t)
{
    return tag_state_of(t);
}
static inline uint32_t _tag_alloc_kind(const struct libtag_tag *t)
{
    return tag_kind_of(t);
}
/* Store a tag: stack and time first, the bits word (with its check) last,
 * so a reader that stops the thread between the stores sees the old bits
 * (0 in a free slot: no block) or the whole new tag. */
TAG_INLINE void _tag_store(struct libtag_tag *t, uint64_t bits, uint32_t stack, uint32_t now)
{
    uint64_t w0 = (uint64_t)now << 32 | stack;
    memcpy(t, &w0, sizeof w0);
    /* from the values, not the fields just stored: a load of fields just
     * stored waits for the stores (perf: 17 % of the quarantine's time sat
     * on such a load once) */
    t->bits = bits | tag_check_words((uint64_t)(uintptr_t)t, _tag_ctl.secret, bits, w0);
}
/* The large-size and forward-record halves of _tag_write_live (tag.c). */
TAG_COLD void _tag_write_big(uint64_t tag_addr, uint64_t size);
TAG_COLD void _tag_write_forward(uint64_t tag_addr, uint32_t pad);
/* Write a live tag and canary for a block of size bytes at user, allocated
 * as kind (enum libtag_alloc_kind); pad: bytes from its slot's start to
 * the tag (0, or an aligned block's).  Inline: once per allocation. */
TAG_INLINE void _tag_write_live(void *user, size_t size, uint32_t pad, uint32_t stack,
                                uint32_t tid, uint32_t now, uint32_t kind)
{
    struct libtag_tag *t = _tag_of(user);
    uint64_t addr = (uint64_t)(uintptr_t)t;
    TAG_ASSERT(((uintptr_t)user & 15) == 0 && kind <= TAG_ALLOC_NEW_ARRAY_ALIGNED);
    if (TAG_UNLIKELY(size >= TAG_SIZE_BIG))
        _tag_write_big(addr, size);
    /* the canary first: a snapshot that stops this thread between the two
     * sees no block yet, or the block whole (a tag without its canary
     * would read as an overflow) */
    uint64_t canary = tag_canary_value(addr, _tag_ctl.secret);
    memcpy((char *)user + size, &canary, sizeof canary);
    __atomic_signal_fence(__ATOMIC_RELEASE);
    _tag_store(t, tag_bits(tid, size, TAG_STATE_LIVE, kind), stack, now);
    TAG_ASSERT(tag_check_of(t) == tag_check_value(addr, _tag_ctl.secret, t));
    /* an aligned block's forward record last, at its slot's start: before
     * the tag it points at is whole, a reader following it would find the
     * slot's old bytes there, a tag written over */
    if (TAG_UNLIKELY(pad != 0)) {
        __atomic_signal_fence(__ATOMIC_RELEASE);
        _tag_write_forward(addr, pad);
    }
}
/* Set bits of the tag's bits word (TAG_FLAG_REPORTED, an alloc kind) and
 * keep the check value in step. */
void _tag_set_bits(void *user, uint64_t clear, uint64_t set);
static inline int _tag_reported(const struct libtag_tag *t)
{
    return (t->bits & TAG_FLAG_REPORTED) != 0;
}
/* Does a tag at tag_addr validate (a block's state, its check)? */
TAG_INLINE int _tag_valid_at(uint64_t tag_addr, const struct libtag_tag *t)
{
    uint32_t state = _tag_state(t);
    return (state == TAG_STATE_LIVE || state == TAG_STATE_FREED) &&
           tag_check_of(t) == tag_check_value(tag_addr, _tag_ctl.secret, t);
}
/* The slot start of the heap block whose tag is at tag_addr, in span s
 * (heap.c's arithmetic: its class's reciprocal), or 0 when s holds no
 * blocks. */
TAG_INLINE uint64_t _tag_slot_in(const struct tag_slice *s, uint64_t tag_addr)
{
    uint64_t start = (uint64_t)(uintptr_t)_tag_heap_span_start(s);
    if (TAG_LIKELY(s->kind == TAG_SPAN_SMALL)) {
        uint32_t off = (uint32_t)(tag_addr - start);
        uint64_t q = (uint64_t)(((unsigned __int128)_tag_heap_div[s->cls] * off) >> 64);
        return start + q * s->block_size;
    }
    return s->kind == TAG_SPAN_LARGE ? start + s->block_off : 0;
}
TAG_INLINE uint64_t _tag_slot_of(uint64_t tag_addr)
{
    return _tag_slot_in(_tag_heap_span((const void *)(uintptr_t)tag_addr), tag_addr);
}
/* Where the tag of the block in the slot [slot, end) is: slot itself, or
 * where its forward record points; 0 for a forward record that does not
 * validate or points past end.  The tag there is the caller's to validate
 * (tag.c). */
uint64_t _tag_slot_tag(uint64_t slot, uint64_t end);
/* Is the tag at tag_addr where its slot says a tag is: at the slot's start,
 * or where the slot's forward record points?  The exact-free half of
 * _tag_lookup (the check value is the other). */
TAG_COLD int _tag_forward_ok(uint64_t slot, uint64_t tag_addr);
TAG_INLINE int _tag_in_place(uint64_t tag_addr)
{
    uint32_t off;
    const struct tag_slice *s = _tag_heap_span_off((const void *)(uintptr_t)tag_addr, &off);
    if (TAG_LIKELY(_tag_small_slot_start(s, off)))
        return 1;
    uint64_t slot = _tag_slot_in(s, tag_addr);
    return slot == tag_addr || _tag_forward_ok(slot, tag_addr);
}
/* Is user a live/freed block of ours?  Its tag must lie in the heap's
 * used region, at its slot's start (arithmetic on the address: that memory
 * is always mapped), and validate there.  Inline: every free() and
 * realloc() starts here. */
TAG_INLINE enum tag_lookup _tag_lookup(const void *user)
{
    const struct libtag_tag *t = _tag_of(user);
    uintptr_t u = (uintptr_t)user;
    uint64_t used = __atomic_load_n(&_tag_heap.used, __ATOMIC_RELAXED) * TAG_HEAP_SLICE;
    uint64_t off = (uint64_t)(u - _tag_heap.base);
    if ((u & 15) != 0 || off < sizeof *t || off > used)
        return TAG_NOT_OURS;
    uint64_t tag_addr = (uint64_t)u - sizeof *t;
    if (!_tag_valid_at(tag_addr, t) || !_tag_in_place(tag_addr))
        return TAG_NOT_OURS;
    return _tag_state(t) == TAG_STATE_LIVE ? TAG_IS_LIVE : TAG_IS_FREED;
}
/* Does a live block's canary hold its value?  Inline, as _tag_lookup. */
TAG_INLINE int _tag_canary_ok(const void *user)
{
    const struct libtag_tag *t = _tag_of(user);
    uint64_t want = tag_canary_value((uint64_t)(uintptr_t)t, _tag_ctl.secret);
    uint64_t have;
    memcpy(&have, (const char *)user + _tag_size(t), sizeof have);
    return have == want;
}
/* The first damaged byte of a live block's canary, as an offset from the
 * canary's start (0..7); the canary must be known to be bad. */
unsigned _tag_canary_damage(const void *user);
/* The free pattern, written and checked with AVX2 where the CPU has it
 * (tag.c: 8 stores or 8 compares for a 256-byte fill, no setup)
 * and inline SSE2 (x86_64's baseline) otherwise or for the short ones: a
 * call to memset and one to memcmp against a page of the pattern cost more
 * (the call, its setup and the length dispatch).  p is 16-aligned
 * (a user pointer); any n works. */
/* tag.c, set once at start: the shortest fill or check done with AVX2 -
 * 32, or SIZE_MAX on a CPU without it (one compare on every fill and
 * check, where n >= 32 and a flag were two) */
extern size_t _tag_avx2_from;
TAG_COLD void _tag_pattern_init(void);
void _tag_pattern_fill_avx2(void *p, size_t n);            /* n >= 32 */
size_t _tag_pattern_damage_avx2(const void *p, size_t n);  /* n >= 32 */
TAG_INLINE void _tag_pattern_fill(void *p, size_t n)
{
    char *c = (char *)p;
    if (TAG_LIKELY(n >= _tag_avx2_from)) {
        _tag_pattern_fill_avx2(p, n);
        return;
    }
    if (TAG_LIKELY(n >= 16)) {
#ifdef __x86_64__
        const __m128i v = _mm_set1_epi8((char)TAG_FREE_PATTERN);
        size_t i = 0;
        for (; i + 16 <= n; i += 16)
            _mm_store_si128((__m128i *)(c + i), v);
        if (i < n)  /* the last 16 bytes, overlapping */
            _mm_storeu_si128((__m128i *)(c + n - 16), v);
#else
        /* two words a turn (a store pair), the last 16 bytes overlapping */
        const uint64_t w = TAG_PATTERN64;
        size_t i = 0;
        for (; i + 16 <= n; i += 16) {
            memcpy(c + i, &w, 8);
            memcpy(c + i + 8, &w, 8);
        }
        if (i < n) {
            memcpy(c + n - 16, &w, 8);
            memcpy(c + n - 8, &w, 8);
        }
#endif
        return;
    }
    uint64_t w = TAG_PATTERN64;
    if (n >= 8) {
        memcpy(c, &w, 8);
        memcpy(c + n - 8, &w, 8);
    } else if (n >= 4) {
        memcpy(c, &w, 4);
        memcpy(c + n - 4, &w, 4);
    } else {
        for (size_t i = 0; i < n; i++)
            c[i] = (char)TAG_FREE_PATTERN;
    }
}
/* The offset of the first byte of p[0..n) that is not TAG_FREE_PATTERN,
 * or TAG_INTACT. */
TAG_COLD size_t _tag_pattern_first_bad(const void *p, size_t n);
TAG_INLINE size_t _tag_pattern_damage(const void *p, size_t n)
{
    const char *c = (const char *)p;
    if (TAG_LIKELY(n >= _tag_avx2_from))
        return _tag_pattern_damage_avx2(p, n);
    if (TAG_LIKELY(n >= 16)) {
#ifdef __x86_64__
        const __m128i v = _mm_set1_epi8((char)TAG_FREE_PATTERN);
        __m128i a = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(c + n - 16)), v);
        for (size_t i = 0; i + 16 <= n; i += 16)
            a = _mm_and_si128(a, _mm_cmpeq_epi8(_mm_load_si128((const __m128i *)(c + i)), v));
        if (TAG_LIKELY(_mm_movemask_epi8(a) == 0xffff))
            return TAG_INTACT;
#else
        uint64_t x, y, d;
        memcpy(&x, c + n - 16, 8);
        memcpy(&y, c + n - 8, 8);
        d = (x ^ TAG_PATTERN64) | (y ^ TAG_PATTERN64);
        for (size_t i = 0; i + 16 <= n; i += 16) {
            memcpy(&x, c + i, 8);
            memcpy(&y, c + i + 8, 8);
            d |= (x ^ TAG_PATTERN64) | (y ^ TAG_PATTERN64);
        }
        if (TAG_LIKELY(d == 0))
            return TAG_INTACT;
#endif
    } else {
        uint64_t x, y;
        if (n >= 8) {
            memcpy(&x, c, 8);
            memcpy(&y, c + n - 8, 8);
            if (TAG_LIKELY(((x ^ TAG_PATTERN64) | (y ^ TAG_PATTERN64)) == 0))
                return TAG_INTACT;
        } else if (n >= 4) {
            uint32_t u, w;
            memcpy(&u, c, 4);
            memcpy(&w, c + n - 4, 4);
            if (TAG_LIKELY(((u ^ (uint32_t)TAG_PATTERN64) | (w ^ (uint32_t)TAG_PATTERN64)) == 0))
                return TAG_INTACT;
        } else {
            size_t i = 0;
            while (i < n && (unsigned char)c[i] == TAG_FREE_PATTERN)
                i++;
            if (i == n)
                return TAG_INTACT;
        }
    }
    return _tag_pattern_first_bad(p, n);
}
/* Bytes of a freed block of size bytes whose payload holds TAG_FREE_PATTERN. */
TAG_INLINE size_t _tag_fill_len(uint64_t size)
{
    return size < _tag_opt.quarantine_fill ? (size_t)size : _tag_opt.quarantine_fill;
}
/* Mark freed and pattern the payload (the free record goes to the ring);
 * size: the block's, as its tag says.  free() marks the tag before the
 * block can be reused by anyone, so a reader never sees a freed block that
 * still claims to be live.  The whole payload up to the fill cap gets the
 * pattern: the free record is kept in the quarantine ring, so the first
 * bytes of an object - a refcount, a vtable pointer, a next pointer, what a
 * dangling pointer writes first - are watched like the rest. */
TAG_INLINE void _tag_write_freed(void *user, uint64_t size)
{
    struct libtag_tag *t = _tag_of(user);
    _tag_pattern_fill(user, _tag_fill_len(size));
    uint64_t bits = (t->bits & ~(TAG_CHECK_MASK | (uint64_t)TAG_STATE_MASK << TAG_STATE_SHIFT)) |
                    (uint64_t)TAG_STATE_FREED << TAG_STATE_SHIFT;
    t->bits = bits | tag_check_words((uint64_t)(uintptr_t)t, _tag_ctl.secret, bits,
                                     tag_stack_time(t));
}
/* The offset of the first byte of a freed block's patterned payload that
 * no longer holds TAG_FREE_PATTERN, or TAG_INTACT.  The tag must be valid;
 * size is the block's.  Async-signal-safe (the snapshot child checks every
 * ring with it). */
TAG_INLINE size_t _tag_freed_damage(const void *user, uint64_t size)
{
    return _tag_pattern_damage(user, _tag_fill_len(size));
}

#endif /* LIBTAG_TAG_H */
