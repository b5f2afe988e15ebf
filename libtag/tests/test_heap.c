/* test_heap.c - libtag's heap alone (src/heap/heap.h, CMake's libtag_heap):
 * its size classes, a thread cache's LIFO order, blocks that do not
 * overlap and sit at their slots' starts, the arithmetic that answers
 * "a block of ours, which slot" (the free path's and the tag lookup's),
 * zeroed blocks, large and aligned blocks and growth in place, a
 * thread's cache flushed back, and a free block's link that was written
 * over found instead of followed.  One thread: the heap's threads, fork
 * and snapshots are tests/integration's (test_heap_stress.py,
 * test_heap_publish.py), under libtag. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heap/heap.h"

#include "check.h"

static struct tag_heap_cache cache[TAG_HEAP_CLASSES];

/* the class sizes: 16..128 by 16, then eight a doubling up to 64 KiB */
static void classes(void)
{
    CHECK(_tag_heap_class(1) == 0);
    CHECK(_tag_heap_class(16) == 0);
    CHECK(_tag_heap_class(17) == 1);
    CHECK(_tag_heap_class(128) == 7);
    CHECK(_tag_heap_class(129) == 8);
    CHECK(_tag_heap_class(TAG_HEAP_SMALL_MAX) == TAG_HEAP_CLASSES - 1);
    for (size_t n = 1; n < TAG_HEAP_SMALL_MAX; n++)
        CHECK(_tag_heap_class(n) <= _tag_heap_class(n + 1));
}

/* Is p a block of ours, at its slot's start, by the arithmetic alone? */
static int slot_start(const void *p)
{
    uint32_t off;
    const struct tag_slice *s = _tag_heap_span_off(p, &off);
    return _tag_heap_has(p) && _tag_small_slot_start(s, off);
}

/* Blocks of every small size: apart, 16-aligned, their slots' starts (and
 * a byte in is not), usable to their class's size; then LIFO from the
 * cache. */
static void small_blocks(void)
{
    enum { N = 64 };
    static const size_t sizes[] = {1, 16, 24, 100, 128, 129, 1000, 4096, 5000, 40000, TAG_HEAP_SMALL_MAX};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        char *b[N];
        for (int i = 0; i < N; i++) {
            b[i] = _tag_heap_alloc(cache, n, 0);
            CHECK(b[i] != NULL);
            CHECK(((uintptr_t)b[i] & 15) == 0);
            CHECK(slot_start(b[i]));
            CHECK(!slot_start(b[i] + 16) || _tag_heap_usable(b[i]) == 16);
            CHECK(_tag_heap_span(b[i])->kind == TAG_SPAN_SMALL);
            CHECK(_tag_heap_usable(b[i]) >= n);
            CHECK(_tag_heap_usable(b[i]) == _tag_heap_span(b[i])->block_size);
            memset(b[i], i, n);
        }
        for (int i = 0; i < N; i++)
            for (size_t j = 0; j < n; j += 61)
                CHECK(b[i][j] == (char)i);  /* no other block wrote here */
        for (int i = 0; i < N; i++)
            _tag_heap_free(cache, b[i]);
        if (n <= 32 * 1024)  /* a class above 32 KiB caches nothing */
            CHECK(_tag_heap_alloc(cache, n, 0) == b[N - 1]);  /* the last freed first */
        else
            CHECK(_tag_heap_alloc(cache, n, 0) != NULL);
    }
}

/* zero: a block that was written and freed comes back zeroed */
static void zeroed(void)
{
    char *p = _tag_heap_alloc(cache, 200, 0);
    memset(p, 0xab, 200);
    _tag_heap_free(cache, p);
    char *q = _tag_heap_alloc(cache, 200, 1);
    CHECK(q == p);
    for (int i = 0; i < 200; i++)
        CHECK(q[i] == 0);
    _tag_heap_free(cache, q);
}

/* A large block: a span of its own, from its start; it grows in place
 * into the free slices after it; aligned blocks land aligned. */
static void large_blocks(void)
{
    size_t n = 1u << 20;
    char *p = _tag_heap_alloc(cache, n, 1);
    CHECK(p != NULL);
    struct tag_slice *s = _tag_heap_span(p);
    CHECK(s->kind == TAG_SPAN_LARGE);
    CHECK(_tag_heap_span_start(s) + s->block_off == p);
    CHECK(_tag_heap_usable(p) >= n);
    CHECK(p[0] == 0 && p[n - 1] == 0);
    memset(p, 0x5a, n);
    if (_tag_heap_grow(p, 4 * n)) {  /* room after it: it is the last span */
        CHECK(_tag_heap_usable(p) >= 4 * n);
        CHECK(p[n - 1] == 0x5a);
    }
    struct tag_heap_stats st;
    _tag_heap_stats(&st);
    CHECK(st.large_count == 1);
    _tag_heap_free(cache, p);
    _tag_heap_stats(&st);
    CHECK(st.large_count == 0);

    static const size_t aligns[] = {32, 64, 256, 4096, 65536, 1u << 20};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        void *a = _tag_heap_alloc_slow(cache, 100, aligns[k], 0);
        CHECK(a != NULL);
        CHECK(((uintptr_t)a & (aligns[k] - 1)) == 0);
        CHECK(_tag_heap_usable(a) >= 100);
        _tag_heap_free(cache, a);
    }
}

/* A thread's exit: every cached block goes back to its span. */
static void flush(void)
{
    void *p = _tag_heap_alloc(cache, 48, 0);
    _tag_heap_free(cache, p);
    CHECK(cache[_tag_heap_class(48)].count > 0);
    _tag_heap_flush(cache);
    for (unsigned c = 0; c < TAG_HEAP_CLASSES; c++)
        CHECK(cache[c].head == NULL && cache[c].bulk == NULL && cache[c].count == 0);
    CHECK(_tag_heap_alloc(cache, 48, 0) != NULL);  /* refilled from the spans */
}

/* A free block whose link was written over (an overflow into freed
 * memory): the list ends there, the heap counts it and says so once, and
 * the next allocation is a good block, not the address written. */
static void broken_link(void)
{
    size_t n = 80;
    void *a = _tag_heap_alloc(cache, n, 0);
    void *b = _tag_heap_alloc(cache, n, 0);
    _tag_heap_free(cache, a);
    _tag_heap_free(cache, b);  /* b links to a */
    uint64_t bad = 0x4141414141414141ull;
    memcpy(b, &bad, sizeof bad);
    uint64_t before = _tag_heap.broken_links;
    fprintf(stderr, "test_heap: a link written over on purpose; the heap's line follows\n");
    void *c = _tag_heap_alloc(cache, n, 0);
    CHECK(c == b);
    CHECK(_tag_heap.broken_links == before + 1);
    void *d = _tag_heap_alloc(cache, n, 0);
    CHECK(d != NULL && d != (void *)(uintptr_t)bad && slot_start(d));
}

int main(void)
{
    _tag_ctl.secret = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)&checks;
    _tag_heap_init();
    CHECK(_tag_heap.meta != NULL);
    classes();
    small_blocks();
    zeroed();
    large_blocks();
    flush();
    broken_link();
    printf("test_heap: %d checks held\n", checks);
    return 0;
}
