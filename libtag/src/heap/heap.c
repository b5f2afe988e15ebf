/* heap.c - libtag's own heap: the memory every tagged block lives in.
 *
 * Why not glibc's (or mimalloc's): docs/design.md, "The heap".  In short,
 * glibc's chunk headers and bins cost libtag's blocks 1.5-1.7x on an
 * allocation-bound program before libtag did anything, and an allocator
 * whose layout libtag owns answers "is this a block of ours, which one" by
 * arithmetic on the address, which no exported mimalloc or glibc interface
 * does.
 *
 * The layout (a file format: docs/format.md "The heap"):
 *
 *   region: one reserved range (PROT_NONE, no memory), committed read-write
 *           from its start as it is used: one or two mappings in all.
 *   slice:  64 KiB of the region; slice i is region + i * TAG_HEAP_SLICE.
 *   span:   one or more consecutive slices, either free, or holding the
 *           blocks of one size class (slots of block_size bytes from the
 *           span's start), or one large block.
 *   meta:   one struct tag_slice per slice, in a second reserved range:
 *           every slice of a span names the span's first slice, whose entry
 *           describes the span.  A pointer's span is two loads away.
 *
 * Blocks of a size class move between three places, every move O(1):
 *   - a thread's cache (tag_thread_state.heap_cache, no lock): per class a LIFO list
 *     where free() puts them (after libtag's quarantine) and malloc() takes
 *     them, and a bulk list, one span's whole free list taken at once when
 *     both were empty, which only malloc() drains;
 *   - their span's central free list (per class lock): the LIFO list's
 *     older half when it overflows, everything when the thread exits.
 *     Taking a span's whole list, not a batch of it, is what keeps a
 *     refill from following ~32 links through memory freed long ago, one
 *     cache miss after another (lua: 7 % of its time under libtag); each
 *     link is followed by the malloc() that hands the block out, whose
 *     caller is about to touch that line anyway;
 *   - a span with every carved block back in its free list is released to
 *     the slice allocator (page lock), which coalesces free neighbours.
 * Classes: 16..128 bytes by 16, then eight a doubling up to 64 KiB
 * (TAG_HEAP_SMALL_MAX); a thread caches 32 KiB of a class's blocks (none of
 * a class above 32 KiB), and a span is carved a page's worth of blocks at a
 * time.  A larger block is a large span, which realloc grows in place into
 * free slices after it.  What this policy saves on sqlite3's shell:
 * docs/design.md, "The heap's policy on mid-sized blocks".
 * A free block's first word links it: encoded with a per-process key, and
 * checked to lie in the region when it is followed, so an overflow that
 * hit a free block's link is found, not followed.
 *
 * Locks: the page lock (slices), one lock per class (central lists).  The
 * order is class lock, then page lock.  fork(): every lock is taken in
 * prepare and released in both processes (life/threads.c's atfork handlers).  The
 * snapshot child never allocates.  No malloc anywhere here, of course.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "heap/heap.h"

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif

/* ------------------------------------------------------------ classes */

struct tag_class_info {
    uint32_t block_size;   /* slot bytes */
    uint32_t slices;       /* slices per span */
    uint32_t capacity;     /* slots per span */
    uint32_t cache_max;    /* blocks a thread's cache holds at most */
    uint32_t carve;        /* blocks carved at most at once: a page of them */
};
static struct tag_class_info classes[TAG_HEAP_CLASSES];

/* The byte size of class c (see _tag_heap_class). */
static uint32_t class_bytes(unsigned c)
{
    if (c < 8)
        return 16u * (c + 1);
    unsigned b = 7 + (c - 8) / 8, sub = (c - 8) % 8;
    return (1u << b) + (sub + 1) * (1u << (b - 3));
}

/* ---------------------------------------------------------- the region */

struct tag_heap _tag_heap;

static int page_lock;

static void spin_lock(int *l)
{
    for (unsigned spins = 0; __atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE);) {
        tag_arch_pause();
        /* a holder preempted on a machine of few cores: give it the CPU */
        if (++spins % 64 == 0)
            sched_yield();
    }
}

static void spin_unlock(int *l)
{
    __atomic_store_n(l, 0, __ATOMIC_RELEASE);
}

/* Reserve the region and its meta array: 1 TiB, or the largest power of
 * two down to 64 MiB that the kernel grants and that leaves half of an
 * address-space limit (RLIMIT_AS, ulimit -v) to the program's other
 * mappings.  PROT_NONE reservations cost no memory and no commit charge. */
TAG_COLD static int region_init(void)
{
    uint64_t size = 1ull << 40;
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
        while (size > as.rlim_cur / 2 && size > (64ull << 20))
            size >>= 1;
    for (; size >= (64ull << 20); size >>= 1) {
        uint64_t slices = size / TAG_HEAP_SLICE;
        uint64_t meta_bytes = slices * sizeof(struct tag_slice);
        char *r = mmap(NULL, size + TAG_HEAP_SLICE, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r == MAP_FAILED)
            continue;
        char *m = mmap(NULL, meta_bytes, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            munmap(r, size + TAG_HEAP_SLICE);
            continue;
        }
        /* Not in cores: gdb's gcore writes every anonymous mapping whole,
         * and read 1 TiB of zeros into its core before this (the kernel
         * would skip it).  The committed part is dumped again (commit_to). */
        madvise(r, size + TAG_HEAP_SLICE, MADV_DONTDUMP);
        madvise(m, meta_bytes, MADV_DONTDUMP);
        /* named before it is split: the parts committed later then merge
         * into one mapping (same flags, same name), not one a commit */
        prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)m, meta_bytes,
              (unsigned long)"libtag");
        /* slice-aligned start; the part below it stays reserved */
        uintptr_t base = ((uintptr_t)r + TAG_HEAP_SLICE - 1) & ~(uintptr_t)(TAG_HEAP_SLICE - 1);
        _tag_heap.base = base;
        _tag_heap.slices_max = slices;
        _tag_heap.meta = (struct tag_slice *)m;
        return 1;
    }
    return 0;
}

/* Make slices [0, n) usable: commit the region and the meta array up to
 * there, in steps of 4 MiB (64 slices) so growing is rare.  Called with
 * the page lock held. */
static int commit_to(uint64_t n)
{
    if (n <= _tag_heap.committed)
        return 1;
    if (n > _tag_heap.slices_max)
        return 0;
    uint64_t want = (n + 63) & ~(uint64_t)63;
    if (want > _tag_heap.slices_max)
        want = _tag_heap.slices_max;
    uint64_t have = _tag_heap.committed;
    char *lo = (char *)_tag_heap.base + have * TAG_HEAP_SLICE;
    if (mprotect(lo, (want - have) * TAG_HEAP_SLICE, PROT_READ | PROT_WRITE) != 0)
        return 0;
    /* the meta entries of those slices, whole pages */
    uintptr_t m0 = (uintptr_t)(_tag_heap.meta + have) & ~(uintptr_t)(TAG_PAGE_SIZE - 1);
    uintptr_t m1 = ((uintptr_t)(_tag_heap.meta + want) + TAG_PAGE_SIZE - 1) &
                   ~(uintptr_t)(TAG_PAGE_SIZE - 1);
    if (mprotect((void *)m0, m1 - m0, PROT_READ | PROT_WRITE) != 0) {
        mprotect(lo, (want - have) * TAG_HEAP_SLICE, PROT_NONE);
        return 0;
    }
    madvise(lo, (want - have) * TAG_HEAP_SLICE, MADV_DODUMP);
    madvise((void *)m0, m1 - m0, MADV_DODUMP);
    __atomic_store_n(&_tag_heap.committed, want, __ATOMIC_RELEASE);
    return 1;
}

/* ---------------------------------------------------- the slice allocator
 * Free spans sit in bins by length: bin n holds spans of n slices for
 * n < TAG_HEAP_BINS, bin 0 the longer ones.  A free span's first slice
 * entry has kind TAG_SPAN_FREE, its length and its bin links; its last
 * slice entry's first_off leads back to the first, so a span freed next
 * to it can merge with it.  All under the page lock. */

#define BINS 64u
static struct tag_slice *bins[BINS];
static uint64_t bin_mask;  /* bit n: bins[n] not empty */

static inline uint64_t index_of(const struct tag_slice *s)
{
    return (uint64_t)(s - _tag_heap.meta);
}

static void mark_span(struct tag_slice *s, uint64_t n)
{
    /* every slice leads back to the first */
    for (uint64_t k = 1; k < n; k++)
        s[k].first_off = (uint32_t)k;
    s->first_off = 0;
    s->slices = (uint32_t)n;
}

static void bin_push(struct tag_slice *s)
{
    unsigned b = s->slices < BINS ? s->slices : 0;
    s->kind = TAG_SPAN_FREE;
    s->prev = NULL;
    s->next = bins[b];
    if (bins[b])
        bins[b]->prev = s;
    bins[b] = s;
    bin_mask |= 1ull << b;
    /* the last slice leads back to the first (a right neighbour merges) */
    s[s->slices - 1].first_off = s->slices - 1;
}

static void bin_remove(struct tag_slice *s)
{
    unsigned b = s->slices < BINS ? s->slices : 0;
    if (s->prev)
        s->prev->next = s->next;
    else
        bins[b] = s->next;
    if (s->next)
        s->next->prev = s->prev;
    if (!bins[b])
        bin_mask &= ~(1ull << b);
    s->next = s->prev = NULL;
}

/* Called with the page lock held: a span of n slices, or NULL; its slices
 * marked, its kind still TAG_SPAN_FREE.  The caller fills in its entry and
 * then publishes its kind (publish_kind) before the lock is dropped: a
 * neighbour's merge reads kind under the lock (a span whose kind still
 * said free would be merged while in use), and a snapshot may stop this
 * thread at any instruction, the reader trusting every field of a span
 * whose kind says SMALL or LARGE and the memory those fields point at. */
static struct tag_slice *slices_take(uint64_t n)
{
    struct tag_slice *s = NULL;
    uint64_t above = n < BINS ? bin_mask & ~((1ull << n) - 1) & ~1ull : 0;
    if (above) {
        s = bins[__builtin_ctzll(above)];
    } else {
        /* the long ones: first fit */
        for (struct tag_slice *c = bins[0]; c; c = c->next)
            if (c->slices >= n) {
                s = c;
                break;
            }
    }
    if (s) {
        bin_remove(s);
        uint64_t have = s->slices;
        if (have > n) {  /* the rest stays free */
            struct tag_slice *rest = s + n;
            rest->slices = (uint32_t)(have - n);
            rest->first_off = 0;
            rest->flags = s->flags;
            bin_push(rest);
        }
    } else {
        uint64_t at = _tag_heap.used;
        if (!commit_to(at + n))
            return NULL;
        s = _tag_heap.meta + at;
        s->flags = TAG_SPAN_ZERO;  /* fresh memory reads as zeros */
        __atomic_store_n(&_tag_heap.used, at + n, __ATOMIC_RELEASE);
    }
    mark_span(s, n);
    TAG_ASSERT(s->kind == TAG_SPAN_FREE);
    return s;
}

/* The span's kind, after everything a reader of it trusts is written:
 * for a SMALL span its class, slot size, capacity and carved count 0; for
 * a LARGE one its block's offset, and that slot's bits 0 until its tag is
 * written.  The release store keeps the compiler (and the CPU) from
 * moving those writes after it. */
static inline void publish_kind(struct tag_slice *s, uint32_t kind)
{
    __atomic_store_n(&s->kind, kind, __ATOMIC_RELEASE);
}

/* Called with the page lock held: give a span back, merged with free
 * neighbours.  A free span of 2 MiB or more goes back to the kernel
 * (madvise: the pages read as zeros again), so a program that frees a
 * large buffer, or many blocks next to each other, gets its memory back as
 * with glibc's munmap and heap trimming.  So does a span of 8 slices or
 * more on its own (a large block, a span of a class of 128 KiB or more)
 * that is longer than every span released so far, as glibc munmaps a chunk
 * it mapped and then raises its mapping threshold to that chunk's size:
 * kept, such a span stays resident as a hole too short for the next large
 * block of a growing buffer (realloc after realloc: sqlite3's shell peaked
 * with 1.4 MiB of such holes resident), and a buffer of one size freed and
 * taken again and again is not released at every turn (a fault a page at
 * every turn: 45x slower for a 1 MiB buffer written whole).
 */
static uint64_t released_max = 7;  /* slices of the longest span released */
static void slices_give(struct tag_slice *s)
{
    uint64_t i = index_of(s), n = s->slices;
    int zero = (s->flags & TAG_SPAN_ZERO) != 0;
    if (n > released_max && !zero) {
        released_max = n;
        madvise((char *)_tag_heap.base + i * TAG_HEAP_SLICE, n * TAG_HEAP_SLICE, MADV_DONTNEED);
        zero = 1;
    }
    if (i > 0) {
        struct tag_slice *left = s - 1;
        left -= left->first_off;
        if (left->kind == TAG_SPAN_FREE && index_of(left) + left->slices == i) {
            bin_remove(left);
            zero = zero && (left->flags & TAG_SPAN_ZERO);
            n += left->slices;
            s = left;
            i = index_of(s);
        }
    }
    if (i + n < _tag_heap.used) {
        struct tag_slice *right = s + n;
        if (right->kind == TAG_SPAN_FREE && right->first_off == 0) {
            bin_remove(right);
            zero = zero && (right->flags & TAG_SPAN_ZERO);
            n += right->slices;
        }
    }
    if (n * TAG_HEAP_SLICE >= (2u << 20) && !zero) {
        madvise((char *)_tag_heap.base + i * TAG_HEAP_SLICE, n * TAG_HEAP_SLICE, MADV_DONTNEED);
        zero = 1;
    }
    s->slices = (uint32_t)n;
    s->first_off = 0;
    s->flags = zero ? TAG_SPAN_ZERO : 0;
    s->cls = 0;
    s->block_size = 0;
    bin_push(s);
}

/* --------------------------------------------------------- central lists */

struct tag_central {
    int lock;
    struct tag_slice *partial;  /* spans of this class with free blocks */
    struct tag_slice *carving;  /* the span new blocks are carved from */
} __attribute__((aligned(64)));
static struct tag_central central[TAG_HEAP_CLASSES];

/* A free block's link that does not lead into the used region (or to
 * NULL) was written over: the list ends there, and what followed it is
 * lost to the heap (counted, reported once). */
TAG_COLD void *_tag_heap_link_broken(const void *block)
{
    if (__atomic_fetch_add(&_tag_heap.broken_links, 1, __ATOMIC_RELAXED) == 0)
        _tag_log("libtag: a free block's link at %p was overwritten (a write to memory "
                 "no block owns); the blocks after it are not reused",
                 block);
    return NULL;
}

#define link_next _tag_heap_link_next
#define link_set  _tag_heap_link_set

static void partial_push(struct tag_central *c, struct tag_slice *s)
{
    s->prev = NULL;
    s->next = c->partial;
    if (c->partial)
        c->partial->prev = s;
    c->partial = s;
    s->flags |= TAG_SPAN_PARTIAL;
}

static void partial_remove(struct tag_central *c, struct tag_slice *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        c->partial = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->next = s->prev = NULL;
    s->flags &= ~TAG_SPAN_PARTIAL;
}

#define span_start _tag_heap_span_start
#define span_of    _tag_heap_span

/* Link block b after *tail (the list's first block when it is empty). */
static inline void append(void **head, void **tail, void *b)
{
    if (*tail)
        link_set(*tail, b);
    else
        *head = b;
    *tail = b;
}

/* Up to want blocks of class c, linked, into *out; returns how many.
 * whole: a partial span's whole free list instead, if there is one, with
 * no link followed (the caller's allocations will follow them).  Takes the
 * class lock (and the page lock for a new span). */
static unsigned central_take(unsigned c, unsigned want, int whole, void **out)
{
    struct tag_central *ct = &central[c];
    const struct tag_class_info *ci = &classes[c];
    void *head = NULL, *tail = NULL;
    unsigned got = 0;
    spin_lock(&ct->lock);
    while (got < want) {
        struct tag_slice *s = ct->partial;
        if (s && whole && s->free) {
            head = s->free;  /* the list ends in NULL already */
            got = s->nfree;
            s->free = NULL;
            s->nfree = 0;
            partial_remove(ct, s);
            break;
        }
        if (s) {
            /* a span's free list */
            void *b = s->free;
            while (b && got < want) {
                void *n = link_next(b);
                append(&head, &tail, b);
                got++;
                s->nfree--;
                b = n;
            }
            s->free = b;
            if (!b) {
                s->nfree = 0;  /* a broken link lost the rest */
                partial_remove(ct, s);
            }
            continue;
        }
        s = ct->carving;
        if (!s || s->carved == s->capacity) {
            spin_lock(&page_lock);
            s = slices_take(ci->slices);
            if (s) {
                /* the entry may hold another span's fields (a span split
                 * from a longer one keeps what its first slice had) */
                s->cls = c;
                s->block_size = ci->block_size;
                s->capacity = ci->capacity;
                s->carved = 0;
                s->nfree = 0;
                s->free = NULL;
                publish_kind(s, TAG_SPAN_SMALL);
            }
            spin_unlock(&page_lock);
            if (!s)
                break;
            ct->carving = s;
        }
        char *base = span_start(s);
        int fresh = (s->flags & TAG_SPAN_ZERO) != 0;
        /* a page's worth of blocks at a time: a carved block's link is
         * written, its page made resident, and a class a program uses a few
         * times (most of sqlite3's shell's 50) made 3-5 pages resident at
         * its first refill */
        if (want > got + ci->carve)
            want = got + ci->carve;
        while (got < want && s->carved < s->capacity) {
            uint32_t k = s->carved;
            char *b = base + (size_t)k * ci->block_size;
            /* a slot holds no block until one is tagged in it: its tag's
             * bits read 0 (a reused span's memory holds anything) - before
             * the carved count includes it, or a snapshot that stops this
             * thread in between shows the old bytes as a tag written over
             * (the load soak's 16 threads: 1 core in ~250) */
            if (!fresh)
                memset(b + offsetof(struct libtag_tag, bits), 0, sizeof(uint64_t));
            __atomic_store_n(&s->carved, k + 1, __ATOMIC_RELEASE);
            append(&head, &tail, b);
            got++;
        }
    }
    spin_unlock(&ct->lock);
    if (tail)
        link_set(tail, NULL);
    *out = head;
    return got;
}

/* Give a linked list of n blocks of class c back to their spans. */
static void central_give(unsigned c, void *list)
{
    struct tag_central *ct = &central[c];
    spin_lock(&ct->lock);
    while (list) {
        void *b = list;
        list = link_next(b);
        struct tag_slice *s = span_of(b);
        link_set(b, s->free);
        s->free = b;
        s->nfree++;
        if (s->nfree == s->carved && s != ct->carving) {
            /* every block of the span is free: the span goes */
            if (s->flags & TAG_SPAN_PARTIAL)
                partial_remove(ct, s);
            s->flags &= ~TAG_SPAN_ZERO;  /* kind: slices_give, under the lock */
            spin_lock(&page_lock);
            slices_give(s);
            spin_unlock(&page_lock);
        } else if (!(s->flags & TAG_SPAN_PARTIAL)) {
            partial_push(ct, s);
        }
    }
    spin_unlock(&ct->lock);
}

/* ------------------------------------------------------------ the API */

TAG_COLD void _tag_heap_init(void)
{
    for (unsigned c = 0; c < TAG_HEAP_CLASSES; c++) {
        struct tag_class_info *ci = &classes[c];
        uint32_t bs = class_bytes(c);
        /* one slice, or 8 slots for a class above 8 KiB (up to 64 KiB,
         * TAG_HEAP_SMALL_MAX) */
        uint64_t span = bs <= 8192 ? TAG_HEAP_SLICE
                                   : (8ull * bs + TAG_HEAP_SLICE - 1) & ~(uint64_t)(TAG_HEAP_SLICE - 1);
        ci->block_size = bs;
        ci->slices = (uint32_t)(span / TAG_HEAP_SLICE);
        ci->capacity = (uint32_t)(span / bs);
        /* 32 KiB of blocks, at most 256: a class of more than 32 KiB caches
         * none (a free goes to its span), as one cached block would hold
         * its slot's pages resident - up to 3 did, 2.6 MiB of blocks of
         * 40..320 KiB in sqlite3's shell, which uses each such class once */
        uint32_t m = (32u * 1024) / bs;
        ci->cache_max = m > 256 ? 256 : m;
        ci->carve = bs < TAG_PAGE_SIZE ? TAG_PAGE_SIZE / bs : 1;
        _tag_heap_cache_limit[c] = ci->cache_max;
        _tag_heap_div[c] = UINT64_MAX / bs + 1;
    }
    _tag_heap.key = (_tag_ctl.secret * TAG_MIX2) | 1;
    if (!region_init())
        _tag_log("libtag: cannot reserve the heap's address space; allocations fail");
}

/* A block of class c for a thread without a cache. */
static void *take_one(unsigned c)
{
    void *b;
    return central_take(c, 1, 0, &b) ? b : NULL;
}

TAG_COLD void *_tag_heap_refill(struct tag_heap_cache *hc, unsigned c)
{
    /* half the cache, as a span's whole free list when one has free slots;
     * one block alone for a class that caches at most one */
    void *list;
    unsigned want = classes[c].cache_max / 2 + 1;
    if (!central_take(c, want, want > 1, &list))
        return NULL;
    void *b = list;
    hc->bulk = link_next(b);
    return b;
}

TAG_COLD void _tag_heap_spill(struct tag_heap_cache *hc, unsigned c)
{
    /* keep the newest half (the head), give the older half back */
    unsigned keep = classes[c].cache_max / 2;
    if (keep == 0) {  /* a class that caches one block or none */
        void *all = hc->head;
        hc->head = NULL;
        hc->count = 0;
        central_give(c, all);
        return;
    }
    void *b = hc->head;
    for (unsigned k = 1; k < keep && b; k++)
        b = link_next(b);
    if (!b)
        return;
    void *rest = link_next(b);
    link_set(b, NULL);
    hc->count = keep;
    if (rest)
        central_give(c, rest);
}

uint32_t _tag_heap_cache_limit[TAG_HEAP_CLASSES];
uint64_t _tag_heap_div[TAG_HEAP_CLASSES];

void _tag_heap_flush(struct tag_heap_cache *hc)
{
    for (unsigned c = 0; c < TAG_HEAP_CLASSES; c++) {
        if (hc[c].head)
            central_give(c, hc[c].head);
        if (hc[c].bulk)
            central_give(c, hc[c].bulk);
        hc[c].head = hc[c].bulk = NULL;
        hc[c].count = 0;
    }
}

/* A large block: a span of its own.  *zeroed says whether it reads as
 * zeros already (fresh or released pages: calloc need not touch them). */
static void *large_alloc(size_t bytes, size_t align, int *zeroed)
{
    uint64_t extra = align > TAG_HEAP_SLICE ? align - TAG_HEAP_SLICE : 0;
    uint64_t n = (bytes + extra + TAG_HEAP_SLICE - 1) / TAG_HEAP_SLICE;
    if (bytes > TAG_BLOCK_MAX || n > _tag_heap.slices_max)
        return NULL;
    spin_lock(&page_lock);
    struct tag_slice *s = slices_take(n);
    uintptr_t p = 0;
    if (s) {
        s->cls = 0;
        s->block_size = 0;
        s->capacity = 1;
        s->carved = 1;
        s->nfree = 0;
        s->large_size = 0;
        p = (uintptr_t)span_start(s);
        if (align > TAG_HEAP_SLICE)
            p = (p + align - 1) & ~(uintptr_t)(align - 1);
        s->block_off = (uint32_t)(p - (uintptr_t)span_start(s));
        *zeroed = (s->flags & TAG_SPAN_ZERO) != 0;
        s->flags &= ~TAG_SPAN_ZERO;
        /* no block in the slot until the caller tags one: a reused span
         * holds old bytes there, which a snapshot taken before the tag is
         * written would show as a tag written over */
        if (!*zeroed)
            memset((char *)p + offsetof(struct libtag_tag, bits), 0, sizeof(uint64_t));
        publish_kind(s, TAG_SPAN_LARGE);
        _tag_heap.large_count++;
        _tag_heap.large_bytes += n * TAG_HEAP_SLICE;
    }
    spin_unlock(&page_lock);
    return (void *)p;
}

/* Grow the large block at p (a large span's start) to bytes in place, with
 * the free slices right after its span or, at the used part's end, fresh
 * ones: 1 if it now has room for them.  What glibc's mremap does for a
 * mapped chunk: a buffer grown realloc after realloc (sqlite3's shell, 64
 * KiB to 2 MiB) otherwise has its old block and its copy resident at once,
 * 1 MiB above glibc's peak. */
int _tag_heap_grow(void *p, size_t bytes)
{
    struct tag_slice *s = span_of(p);
    if (s->kind != TAG_SPAN_LARGE || (char *)p != span_start(s) || bytes > TAG_BLOCK_MAX)
        return 0;
    uint64_t n = s->slices, need = (bytes + TAG_HEAP_SLICE - 1) / TAG_HEAP_SLICE;
    if (need <= n)
        return 1;
    int ok = 0;
    spin_lock(&page_lock);
    uint64_t i = index_of(s);
    if (i + n == _tag_heap.used) {
        if (commit_to(i + need)) {
            __atomic_store_n(&_tag_heap.used, i + need, __ATOMIC_RELEASE);
            ok = 1;
        }
    } else {
        struct tag_slice *right = s + n;
        if (right->kind == TAG_SPAN_FREE && n + right->slices >= need) {
            bin_remove(right);
            uint64_t rest = n + right->slices - need;
            if (rest) {
                struct tag_slice *r = s + need;
                r->slices = (uint32_t)rest;
                r->first_off = 0;
                r->flags = right->flags;
                bin_push(r);
            }
            ok = 1;
        }
    }
    if (ok) {
        mark_span(s, need);
        _tag_heap.large_bytes += (need - n) * TAG_HEAP_SLICE;
    }
    spin_unlock(&page_lock);
    return ok;
}

static void large_free(struct tag_slice *s)
{
    spin_lock(&page_lock);
    _tag_heap.large_count--;
    _tag_heap.large_bytes -= (uint64_t)s->slices * TAG_HEAP_SLICE;
    slices_give(s);
    spin_unlock(&page_lock);
}

/* The class of a request of n bytes aligned to align (TAG_HEAP_CLASSES:
 * a large span).  An aligned request takes the first class that fits whose
 * slot size is a multiple of align: spans start on a slice, so every slot of
 * such a class is aligned and the pointer handed out is a slot's start, as
 * _tag_heap_free expects of every pointer it is given (an interior pointer
 * there would be cached as a slot: the next block would overrun its slot). */
static unsigned class_for(size_t n, size_t align)
{
    if (n > TAG_HEAP_SMALL_MAX || align > TAG_HEAP_SLICE)
        return TAG_HEAP_CLASSES;
    unsigned c = _tag_heap_class(n);
    while (c < TAG_HEAP_CLASSES && classes[c].block_size % align != 0)
        c++;
    return c;
}

void *_tag_heap_alloc_slow(struct tag_heap_cache *hc, size_t n, size_t align, int zero)
{
    if (TAG_UNLIKELY(!_tag_heap.meta)) {
        errno = ENOMEM;
        return NULL;
    }
    unsigned c = class_for(n, align);
    void *b;
    int zeroed = 0;
    if (c == TAG_HEAP_CLASSES) {
        b = large_alloc(n, align, &zeroed);
        if (b && zero && !zeroed)
            memset(b, 0, n);
        if (b)
            return b;
    } else {
        /* the cache first: an aligned allocation's fast path skipped it */
        b = hc ? _tag_heap_cache_pop(&hc[c]) : take_one(c);
        if (hc && !b)
            b = _tag_heap_refill(&hc[c], c);
    }
    if (!b) {
        errno = ENOMEM;
        return NULL;
    }
    TAG_ASSERT(((uintptr_t)b & (align - 1)) == 0);
    if (zero)
        memset(b, 0, n);
    return b;
}

void _tag_heap_free_slow(struct tag_heap_cache *hc, void *p)
{
    struct tag_slice *s = span_of(p);
    if (s->kind == TAG_SPAN_LARGE) {
        large_free(s);
        return;
    }
    /* a small block of a thread without a cache (_tag_heap_free takes
     * every other): straight to its span */
    TAG_ASSERT(s->kind == TAG_SPAN_SMALL && hc == NULL);
    TAG_ASSERT((uint64_t)((char *)p - span_start(s)) % s->block_size == 0);
    (void)hc;
    link_set(p, NULL);
    central_give(s->cls, p);
}

size_t _tag_heap_usable(const void *p)
{
    struct tag_slice *s = span_of(p);
    char *start = span_start(s);
    if (s->kind == TAG_SPAN_LARGE)
        return (size_t)s->slices * TAG_HEAP_SLICE - (size_t)((const char *)p - start);
    uint64_t off = (uint64_t)((const char *)p - start);
    return s->block_size - off % s->block_size;
}

/* ------------------------------------------------------------- mallinfo */

void _tag_heap_stats(struct tag_heap_stats *st)
{
    spin_lock(&page_lock);
    st->used = _tag_heap.used * TAG_HEAP_SLICE;
    uint64_t free_spans = 0;
    for (unsigned b = 0; b < BINS; b++)
        for (struct tag_slice *s = bins[b]; s; s = s->next)
            free_spans++;
    st->free_spans = free_spans;
    st->large_count = _tag_heap.large_count;
    st->large_bytes = _tag_heap.large_bytes;
    spin_unlock(&page_lock);
}

/* malloc_trim: every free span goes back to the kernel. */
int _tag_heap_trim(void)
{
    int released = 0;
    spin_lock(&page_lock);
    for (unsigned b = 0; b < BINS; b++)
        for (struct tag_slice *s = bins[b]; s; s = s->next) {
            if (s->flags & TAG_SPAN_ZERO)
                continue;
            madvise(span_start(s), (size_t)s->slices * TAG_HEAP_SLICE, MADV_DONTNEED);
            s->flags |= TAG_SPAN_ZERO;
            released = 1;
        }
    spin_unlock(&page_lock);
    return released;
}

/* ----------------------------------------------------------------- fork */

void _tag_heap_atfork_prepare(void)
{
    for (unsigned c = 0; c < TAG_HEAP_CLASSES; c++)
        spin_lock(&central[c].lock);
    spin_lock(&page_lock);
}

void _tag_heap_atfork_release(void)
{
    spin_unlock(&page_lock);
    for (unsigned c = 0; c < TAG_HEAP_CLASSES; c++)
        spin_unlock(&central[c].lock);
}
