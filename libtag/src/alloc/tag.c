/* tag.c - placing, checking and retiring the tag in front of each block.
 * See tag_abi.h for the layout; every write here keeps the check value in
 * step with the fields so a reader of raw memory can trust a tag that
 * validates and reject one that an overflow has touched. */
#include <errno.h>
#include <string.h>
#ifdef __x86_64__
#include <immintrin.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "heap/heap.h"
#include "alloc/tag.h"

void _tag_set_bits(void *user, uint64_t clear, uint64_t set)
{
    struct libtag_tag *t = _tag_of(user);
    uint64_t bits = (t->bits & ~(clear | TAG_CHECK_MASK)) | set;
    t->bits = bits | tag_check_words((uint64_t)(uintptr_t)t, _tag_ctl.secret, bits,
                                     tag_stack_time(t));
}

/* A block of 1 MiB or more lives alone in a large span (heap.c), whose
 * entry keeps its size: the tag's 20-bit field says TAG_SIZE_BIG. */
uint64_t _tag_big_size(uint64_t tag_addr)
{
    if (!_tag_heap_has((const void *)(uintptr_t)tag_addr))
        return 0;  /* not a heap block (a guarded one is never this big) */
    const struct tag_slice *s = _tag_heap_span((const void *)(uintptr_t)tag_addr);
    return s->kind == TAG_SPAN_LARGE ? s->large_size : 0;
}

TAG_COLD void _tag_write_big(uint64_t tag_addr, uint64_t size)
{
    if (!_tag_heap_has((const void *)(uintptr_t)tag_addr))
        return;
    struct tag_slice *s = _tag_heap_span((const void *)(uintptr_t)tag_addr);
    TAG_ASSERT(s->kind == TAG_SPAN_LARGE);
    s->large_size = size;
}

/* An aligned block's slot starts with a forward record: a tag of state
 * TAG_STATE_FORWARD whose alloc_stack is pad, checked as any tag. */
TAG_COLD void _tag_write_forward(uint64_t tag_addr, uint32_t pad)
{
    _tag_store((struct libtag_tag *)(uintptr_t)(tag_addr - pad),
               (uint64_t)TAG_STATE_FORWARD << TAG_STATE_SHIFT, pad, 0);
}

uint64_t _tag_slot_tag(uint64_t slot, uint64_t end)
{
    const struct libtag_tag *f = (const struct libtag_tag *)(uintptr_t)slot;
    if (tag_state_of(f) != TAG_STATE_FORWARD)
        return slot;
    if (tag_check_of(f) != tag_check_value(slot, _tag_ctl.secret, f) || f->alloc_stack >= end - slot)
        return 0;
    return slot + f->alloc_stack;
}

TAG_COLD int _tag_forward_ok(uint64_t slot, uint64_t tag_addr)
{
    return slot != 0 && slot < tag_addr && _tag_slot_tag(slot, tag_addr + 1) == tag_addr;
}

/* The first damaged canary byte (0..7) of a block whose canary is bad. */
unsigned _tag_canary_damage(const void *user)
{
    const struct libtag_tag *t = _tag_of(user);
    uint64_t want = tag_canary_value((uint64_t)(uintptr_t)t, _tag_ctl.secret);
    const unsigned char *have = (const unsigned char *)user + _tag_size(t);
    unsigned i = 0;
    while (i < TAG_CANARY_SIZE - 1 && have[i] == (unsigned char)(want >> (8 * i)))
        i++;
    return i;
}

/* The slow end of _tag_pattern_damage: it found a difference. */
size_t _tag_pattern_first_bad(const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != TAG_FREE_PATTERN)
            return i;
    return TAG_INTACT;
}

/* The AVX2 halves of _tag_pattern_fill and _tag_pattern_damage, for
 * n >= 32: 32 bytes a store or compare, the last 32 overlapping.  Chosen
 * at start (_tag_avx2_from, from cpuid) so one build runs on every x86_64;
 * the function is out of line because code built for AVX2 cannot be
 * inlined into code that is not. */
size_t _tag_avx2_from = SIZE_MAX;

#ifdef __x86_64__
TAG_COLD void _tag_pattern_init(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        _tag_avx2_from = 32;
}

/* Unrolled: 2 stores or compares up to 64 bytes, 4 up to 128, then 128
 * bytes a loop turn and the last 128 overlapping - the default 256-byte
 * fill is 8 of each and one turn (callgrind: the one-a-turn loops cost
 * ~30 and ~35 instructions a block on allocbench, these ~14 and ~20). */
#define ST(off) _mm256_storeu_si256((__m256i *)(c + (off)), v)
__attribute__((target("avx2"))) void _tag_pattern_fill_avx2(void *p, size_t n)
{
    char *c = p;
    const __m256i v = _mm256_set1_epi8((char)TAG_FREE_PATTERN);
    if (n <= 64) {
        ST(0);
        ST(n - 32);
        return;
    }
    if (n > 128) {
        for (size_t i = 0; i + 128 < n; i += 128) {
            ST(i);
            ST(i + 32);
            ST(i + 64);
            ST(i + 96);
        }
        ST(n - 128);
        ST(n - 96);
    } else {
        ST(0);
        ST(32);
    }
    ST(n - 64);
    ST(n - 32);
}
#undef ST

#define EQ(off) _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(c + (off))), v)
__attribute__((target("avx2"))) size_t _tag_pattern_damage_avx2(const void *p, size_t n)
{
    const char *c = p;
    const __m256i v = _mm256_set1_epi8((char)TAG_FREE_PATTERN);
    __m256i a = _mm256_and_si256(EQ(0), EQ(n - 32));
    if (n > 64) {
        a = _mm256_and_si256(a, EQ(n - 64));
        if (n > 128) {
            for (size_t i = 0; i + 128 < n; i += 128)
                a = _mm256_and_si256(_mm256_and_si256(a, _mm256_and_si256(EQ(i), EQ(i + 32))),
                                     _mm256_and_si256(EQ(i + 64), EQ(i + 96)));
            a = _mm256_and_si256(a, _mm256_and_si256(EQ(n - 128), EQ(n - 96)));
        } else {
            a = _mm256_and_si256(a, EQ(32));
        }
    }
    if (TAG_LIKELY(_mm256_movemask_epi8(a) == -1))
        return TAG_INTACT;
    return _tag_pattern_first_bad(p, n);
}
#undef EQ
#else
/* No AVX2 (aarch64): the plain halves in tag.h do every length. */
TAG_COLD void _tag_pattern_init(void)
{
}
void _tag_pattern_fill_avx2(void *p, size_t n)
{
    memset(p, TAG_FREE_PATTERN, n);
}
size_t _tag_pattern_damage_avx2(const void *p, size_t n)
{
    return _tag_pattern_first_bad(p, n);
}
#endif
