/* interpose.c - the malloc family, and nothing else.
 *
 * Each function behaves as glibc's does toward the program (the tests run
 * the same probe with and without libtag and compare): NULL + ENOMEM on
 * exhaustion or overflow, EINVAL from posix_memalign for a bad alignment
 * with *memptr untouched, realloc(p, 0) frees and returns NULL, free()
 * keeps errno.  The memory comes from libtag's own heap (heap.c), which
 * needs nothing from libc: no dlsym(), no bootstrap arena.
 *
 * Every entry point is built with frame pointers so the fallback stack walk
 * can start from its frame.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "base/options.h"
#include "heap/heap.h"
#include "stacks/stack_table.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"
#include "alloc/alloc.h"
#include "alloc/anomaly.h"
#include "alloc/damage.h"
#include "alloc/foreign.h"
#include "alloc/guard.h"
#include "alloc/quarantine.h"
#include "alloc/sweep.h"
#include "alloc/tag.h"

#define OVERHEAD (sizeof(struct libtag_tag) + TAG_CANARY_SIZE)

/* The heap allocation for a block of size bytes aligned to align (a power
 * of two >= 16), from the thread's cache hc (NULL: none): returns the user
 * pointer (the tag in front of it, the canary after it) and its pad, or
 * NULL with errno as glibc (ENOMEM). */
TAG_INLINE char *alloc_block(struct tag_heap_cache *hc, size_t size, size_t align, int zero,
                             uint32_t *pad)
{
    size_t payload = size < TAG_MIN_PAYLOAD ? TAG_MIN_PAYLOAD : size;
    if (TAG_UNLIKELY(payload > TAG_BLOCK_MAX - OVERHEAD - align)) {
        errno = ENOMEM;
        return NULL;
    }
    char *raw;
    if (TAG_LIKELY(align <= 16)) {
        raw = _tag_heap_alloc(hc, OVERHEAD + payload, zero);
        if (TAG_UNLIKELY(!raw))
            return NULL;
        *pad = 0;
        return raw + sizeof(struct libtag_tag);
    }
    /* raw is align-aligned; the tag sits just below the next boundary. */
    if (TAG_UNLIKELY(align > UINT32_MAX)) {
        errno = ENOMEM;
        return NULL;
    }
    raw = _tag_heap_alloc_slow(hc, align + payload + TAG_CANARY_SIZE, align, 0);
    if (TAG_UNLIKELY(!raw))
        return NULL;
    *pad = (uint32_t)(align - sizeof(struct libtag_tag));
    if (zero)
        memset(raw + align, 0, payload);
    return raw + align;
}

static TAG_COLD void *alloc_stateless(size_t size, size_t align, int zero, uint32_t kind);

/* _tag_alloc's work once the stack is known (t's own). */
TAG_INLINE void *alloc_at(struct tag_thread_state *t, size_t size, size_t align, int zero, uint32_t kind,
                          uint32_t stack)
{
    int sampled = --t->guard_countdown <= 0;
    if (TAG_UNLIKELY(sampled) || _tag_guard_new_site(stack)) {  /* guard.c */
        void *g = _tag_guard_alloc(t, size, align, zero, kind, stack, sampled);
        if (g)
            return g;
    }
    uint32_t pad;
    char *user = alloc_block(t->heap_cache, size, align, zero, &pad);
    if (TAG_UNLIKELY(!user))
        return NULL;
    _tag_write_live(user, size, pad, stack, t->tid, _tag_now_ms(), kind);
    _tag_stats_alloc(t, stack, size, user);
    if (_tag_opt.sweep_every)
        _tag_sweep_remember(t, user);
    _tag_count(t, 0, size);
    return user;
}

/* Allocate size bytes aligned to align (a power of two >= 16), tag them
 * as kind (enum libtag_alloc_kind) with the stack seen from ret/frame. */
void *_tag_alloc(size_t size, size_t align, int zero, uint32_t kind, void *ret, void *frame)
{
    _tag_ensure_init();
    struct tag_thread_state *t = _tag_self();
    if (TAG_UNLIKELY(t == NULL))
        return alloc_stateless(size, align, zero, kind);
    return alloc_at(t, size, align, zero, kind, _tag_capture(t, ret, frame));
}

/* ------------------------------------------------------------ rare cases */

/* An allocation of a thread without a state of its own (its mapping
 * failed, or it is past its exit hook: see _tag_thread_register): tagged
 * as any other, with stack 0 (no capture, which needs the state). */
static TAG_COLD void *alloc_stateless(size_t size, size_t align, int zero, uint32_t kind)
{
    uint32_t pad;
    char *user = alloc_block(NULL, size, align, zero, &pad);
    if (!user)
        return NULL;
    _tag_write_live(user, size, pad, 0, _tag_tls.tid, _tag_now_ms(), kind);
    _tag_stats_alloc(NULL, 0, size, user);
    _tag_count(NULL, 0, size);
    return user;
}

static TAG_COLD void report_overflow(void *ptr, void *ret, void *frame)
{
    struct libtag_tag copy = *_tag_of(ptr);
    /* marked first: a sweep racing this free reports it no second time */
    _tag_set_bits(ptr, 0, TAG_FLAG_REPORTED);
    struct tag_report r = {
        .kind = TAG_ANOMALY_HEAP_OVERFLOW,
        .address = (char *)ptr + _tag_size(_tag_of(ptr)) + _tag_canary_damage(ptr),
        .block = ptr,
        .tag = &copy,
    };
    _tag_anomaly(&r, ret, frame);
}

static TAG_COLD void report_double_free(void *ptr, void *ret, void *frame)
{
    struct libtag_free_rec rec;
    struct tag_report r = {
        .kind = TAG_ANOMALY_DOUBLE_FREE,
        .address = ptr,
        .block = ptr,
        .rec = _tag_quarantine_find(ptr, &rec) ? &rec : NULL,
    };
    _tag_anomaly(&r, ret, frame);
}

/* The tag in front of ptr does not validate: a smashed header (see
 * damage.c) or not a block of ours.  Returns what check_block returns. */
static TAG_COLD int damaged_or_invalid(void *ptr, uint32_t dealloc, void *ret, void *frame)
{
    switch (_tag_damaged(ptr, NULL, ret, frame)) {
    case TAG_DAMAGE_REPAIRED:
        if (_tag_lookup(ptr) != TAG_IS_LIVE)
            return 0;  /* a freed block: still in the quarantine */
        if (_tag_alloc_kind(_tag_of(ptr)) != dealloc)
            _tag_report_mismatch(ptr, dealloc, ret, frame);
        return 1;      /* restored, marked: freed now, leaked later */
    case TAG_DAMAGE_KNOWN:
        _tag_leak_damaged(0);
        return 0;
    default: {
        struct tag_report r = {.kind = TAG_ANOMALY_INVALID_FREE, .address = ptr};
        _tag_anomaly(&r, ret, frame);
        return 0;
    }
    }
}

/* Validate ptr as a block we handed out, released as dealloc expects; on
 * a failure that leaves the block unusable, report it and return 0 so the
 * caller skips the operation; -1: a block of glibc's from before an attach
 * (attach.c), for the caller to hand to glibc. */
TAG_INLINE int check_block(void *ptr, uint32_t dealloc, void *ret, void *frame)
{
    switch (_tag_lookup(ptr)) {
    case TAG_IS_LIVE: {
        const struct libtag_tag *t = _tag_of(ptr);
        if (TAG_UNLIKELY(!_tag_canary_ok(ptr)) && !_tag_reported(t))
            report_overflow(ptr, ret, frame);  /* then free it: leaked later */
        if (TAG_UNLIKELY(_tag_alloc_kind(t) != dealloc))
            _tag_report_mismatch(ptr, dealloc, ret, frame);  /* then release it */
        return 1;
    }
    case TAG_IS_FREED:
        report_double_free(ptr, ret, frame);
        return 0;
    default:
        if (_tag_foreign(ptr))
            return -1;  /* glibc's, from before an attach: the caller hands it over */
        return damaged_or_invalid(ptr, dealloc, ret, frame);
    }
}

/* A free of a thread without a state of its own: checked as any other,
 * handed back at once (no quarantine, which is the state's). */
static TAG_COLD void free_stateless(void *ptr, uint32_t dealloc, void *ret, void *frame)
{
    if (_tag_guarded(ptr)) {
        _tag_guard_free(NULL, ptr, dealloc, ret, frame);
        return;
    }
    int ok = check_block(ptr, dealloc, ret, frame);
    if (ok != 1) {
        if (ok < 0)
            _tag_foreign_free(ptr);
        return;
    }
    struct libtag_tag *tg = _tag_of(ptr);
    uint64_t size = _tag_size(tg);
    _tag_stats_free(NULL, tg->alloc_stack, size, ptr);
    _tag_write_freed(ptr, size);
    _tag_count(NULL, 1, size);
    _tag_real_release(NULL, ptr);
}

/* _tag_free's work once ptr is checked (a block of ours, not guarded) and
 * the stack is known: into t's quarantine. */
TAG_INLINE void free_at(struct tag_thread_state *t, void *ptr, uint32_t stack)
{
    uint64_t size = _tag_size(_tag_of(ptr));
    _tag_stats_free(t, _tag_of(ptr)->alloc_stack, size, ptr);
    _tag_write_freed(ptr, size);
    _tag_count(t, 1, size);
    if (TAG_UNLIKELY(__atomic_load_n(&_tag_snapshot_pending, __ATOMIC_RELAXED)) &&
        (++t->frees & 1023) == 0)
        _tag_snapshot_reap();
    _tag_quarantine_put(t, ptr, size, stack, _tag_now_ms());  /* last: see there */
}

void _tag_free(void *ptr, uint32_t dealloc, void *ret, void *frame)
{
    _tag_ensure_init();
    struct tag_thread_state *t = _tag_self();
    if (TAG_UNLIKELY(t == NULL)) {
        free_stateless(ptr, dealloc, ret, frame);
        return;
    }
    if (TAG_UNLIKELY(_tag_guarded(ptr))) {  /* guard.c: a guarded slot */
        _tag_guard_free(t, ptr, dealloc, ret, frame);
        return;
    }
    int ok = check_block(ptr, dealloc, ret, frame);
    if (TAG_UNLIKELY(ok != 1)) {
        if (ok < 0)
            _tag_foreign_free(ptr);
        return;
    }
    free_at(t, ptr, _tag_capture(t, ret, frame));
}

#define RET   __builtin_return_address(0)
#define FRAME __builtin_frame_address(0)

TAG_EXPORT void *malloc(size_t size)
{
    return _tag_alloc(size, 16, 0, TAG_ALLOC_MALLOC, RET, FRAME);
}

TAG_EXPORT void free(void *ptr)
{
    if (!ptr)
        return;
    /* POSIX.1-2024: free() does not change errno */
    int *e = _tag_tls.errno_at;
    if (TAG_UNLIKELY(!e))
        e = _tag_tls.errno_at = &errno;
    int saved = *e;
    _tag_free(ptr, TAG_ALLOC_MALLOC, RET, FRAME);
    *e = saved;
}

TAG_EXPORT void *calloc(size_t nmemb, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(nmemb, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return _tag_alloc(total, 16, 1, TAG_ALLOC_MALLOC, RET, FRAME);
}

/* realloc within the block's own slot, as glibc does when the chunk has
 * room: when the new size fits the slot and still uses more than half of
 * it (a block that shrank to a fraction of its slot moves, so the slot's
 * memory comes back).  The block is tagged anew - the realloc is its newest
 * allocation: its stack, its time - and counted as a free of the old size
 * and an allocation of the new one, as a move is.  Not for an aligned block
 * (pad) or one whose damage was reported.  NULL: it must move. */
static void *realloc_in_place(struct tag_thread_state *t, void *ptr, size_t size, uint32_t stack)
{
    struct libtag_tag *tg = _tag_of(ptr);
    uint64_t tag_addr = (uint64_t)(uintptr_t)tg;
    const struct tag_slice *s = _tag_heap_span(tg);
    if (_tag_reported(tg) || _tag_slot_in(s, tag_addr) != tag_addr)
        return NULL;
    size_t payload = size < TAG_MIN_PAYLOAD ? TAG_MIN_PAYLOAD : size;
    /* the slot's bytes: a small span's slot size, the tag being at its
     * slot's start (_tag_heap_usable's divide would say the same) */
    size_t room = s->kind == TAG_SPAN_SMALL ? s->block_size : _tag_heap_usable(tg);
    if (size > TAG_BLOCK_MAX - OVERHEAD)
        return NULL;
    /* a large block grows in place when the slices after it are free */
    if (payload + OVERHEAD > room && payload + OVERHEAD > TAG_HEAP_SMALL_MAX &&
        _tag_heap_grow(tg, payload + OVERHEAD))
        room = _tag_heap_usable(tg);
    if (payload + OVERHEAD > room || 2 * (payload + OVERHEAD) <= room)
        return NULL;
    uint64_t old_size = _tag_size(tg);
    _tag_stats_free(t, tg->alloc_stack, old_size, ptr);
    _tag_count(t, 1, old_size);
    /* no block for an instant rather than a torn tag: a snapshot that
     * stops this thread between the tag's two stores would see the new
     * stack and time under the old bits, a tag that no longer validates */
    __atomic_store_n(&tg->bits, 0, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_RELEASE);
    _tag_write_live(ptr, size, 0, stack, t->tid, _tag_now_ms(), TAG_ALLOC_MALLOC);
    _tag_stats_alloc(t, stack, size, ptr);
    _tag_count(t, 0, size);
    return ptr;
}

static void *tag_realloc(void *ptr, size_t size, void *ret, void *frame)
{
    if (!ptr)
        return _tag_alloc(size, 16, 0, TAG_ALLOC_MALLOC, ret, frame);
    if (size == 0) {
        /* glibc (REALLOC_ZERO_BYTES_FREES): free and return NULL */
        int saved = errno;
        _tag_free(ptr, TAG_ALLOC_MALLOC, ret, frame);
        errno = saved;
        return NULL;
    }
    _tag_ensure_init();
    int ok = _tag_guarded(ptr) ? _tag_guard_check(ptr, TAG_ALLOC_MALLOC, ret, frame)  /* guard.c */
                               : check_block(ptr, TAG_ALLOC_MALLOC, ret, frame);
    if (ok != 1) {
        if (ok < 0)
            return _tag_foreign_realloc(ptr, size);  /* stays glibc's */
        errno = ENOMEM;
        return NULL;
    }
    /* a guarded block, or a thread without a state: through _tag_alloc and
     * _tag_free, which know those; else one capture: the realloc's stack
     * is the new block's allocation and the old one's free (in place: its
     * new allocation) */
    struct tag_thread_state *t = _tag_guarded(ptr) ? NULL : _tag_self();
    uint32_t stack = 0;
    if (t) {
        stack = _tag_capture(t, ret, frame);
        void *same = realloc_in_place(t, ptr, size, stack);
        if (same)
            return same;
    }
    /* Move: the old block goes through the quarantine as a free() would,
     * so a stale pointer to it is caught like any other dangling pointer.
     * Checked once, by check_block above (the guard's check for a guarded
     * one); its kind no longer matters (a realloc of a new'd block is
     * released as it was made). */
    size_t old_size = (size_t)_tag_size(_tag_of(ptr));
    void *p = t ? alloc_at(t, size, 16, 0, TAG_ALLOC_MALLOC, stack)
                : _tag_alloc(size, 16, 0, TAG_ALLOC_MALLOC, ret, frame);
    if (!p)
        return NULL;  /* the old block is left untouched */
    memcpy(p, ptr, old_size < size ? old_size : size);
    int saved = errno;
    if (t)
        free_at(t, ptr, stack);
    else
        _tag_free(ptr, _tag_alloc_kind(_tag_of(ptr)), ret, frame);
    errno = saved;
    return p;
}

TAG_EXPORT void *realloc(void *ptr, size_t size)
{
    return tag_realloc(ptr, size, RET, FRAME);
}

TAG_EXPORT void *reallocarray(void *ptr, size_t nmemb, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(nmemb, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return tag_realloc(ptr, total, RET, FRAME);
}

/* glibc's memalign: an alignment that is not a power of two is rounded up
 * to one; one above SIZE_MAX/2 + 1 fails with EINVAL. */
void *_tag_memalign(size_t align, size_t size, uint32_t kind, void *ret, void *frame)
{
    if (align <= 16)
        return _tag_alloc(size, 16, 0, kind, ret, frame);
    if (align > SIZE_MAX / 2 + 1) {
        errno = EINVAL;
        return NULL;
    }
    if (align & (align - 1)) {
        size_t a = 32;
        while (a < align)
            a <<= 1;
        align = a;
    }
    return _tag_alloc(size, align, 0, kind, ret, frame);
}

TAG_EXPORT void *memalign(size_t align, size_t size)
{
    return _tag_memalign(align, size, TAG_ALLOC_MALLOC, RET, FRAME);
}

/* glibc 2.36 aligned_alloc is memalign (C17's stricter checks came with
 * glibc 2.38); behave as the glibc we run on. */
TAG_EXPORT void *aligned_alloc(size_t align, size_t size)
{
    return _tag_memalign(align, size, TAG_ALLOC_MALLOC, RET, FRAME);
}

TAG_EXPORT int posix_memalign(void **memptr, size_t align, size_t size)
{
    if (align % sizeof(void *) != 0 || (align & (align - 1)) != 0 || align == 0)
        return EINVAL;
    void *p = _tag_memalign(align, size, TAG_ALLOC_MALLOC, RET, FRAME);
    if (!p)
        return errno ? errno : ENOMEM;  /* glibc leaves errno set too */
    *memptr = p;
    return 0;
}

TAG_EXPORT void *valloc(size_t size)
{
    return _tag_memalign((size_t)sysconf(_SC_PAGESIZE), size, TAG_ALLOC_MALLOC, RET, FRAME);
}

TAG_EXPORT void *pvalloc(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > SIZE_MAX - page) {
        errno = ENOMEM;
        return NULL;
    }
    return _tag_memalign(page, (size + page - 1) & ~(page - 1), TAG_ALLOC_MALLOC, RET, FRAME);
}

/* The user's view: the bytes the program asked for.  Writing past them is
 * what the canary catches, so libtag does not advertise glibc's slack. */
TAG_EXPORT size_t malloc_usable_size(void *ptr)
{
    if (!ptr)
        return 0;
    _tag_ensure_init();
    if (_tag_guarded(ptr))  /* guard.c */
        return _tag_guard_usable(ptr);
    if (_tag_lookup(ptr) != TAG_IS_LIVE)
        return _tag_foreign(ptr) ? _tag_foreign_usable(ptr) : 0;
    return (size_t)_tag_size(_tag_of(ptr));
}


/* ------------------------------------------------- the heap's own reports
 * glibc's malloc_trim, mallinfo2, mallopt, malloc_stats and malloc_info
 * would describe glibc's arenas, which hold none of the program's blocks
 * under libtag: these describe libtag's heap in the same fields.  Bytes in
 * use are the requested bytes of the live blocks (the threads' counters),
 * as malloc_usable_size reports them. */
#include <malloc.h>
#include <stdio.h>

#include "libtag.h"

TAG_EXPORT int malloc_trim(size_t pad)
{
    (void)pad;
    _tag_ensure_init();
    return _tag_heap_trim();
}

TAG_EXPORT struct mallinfo2 mallinfo2(void)
{
    _tag_ensure_init();
    struct tag_heap_stats st;
    _tag_heap_stats(&st);
    struct libtag_stats counters;
    libtag_stats(&counters);
    uint64_t live = counters.live_bytes;
    struct mallinfo2 m;
    memset(&m, 0, sizeof m);
    m.arena = st.used;                  /* bytes of the heap in use by spans */
    m.ordblks = st.free_spans;          /* free spans */
    m.hblks = st.large_count;           /* large blocks (a span each) */
    m.hblkhd = st.large_bytes;
    m.uordblks = live;
    m.fordblks = st.used > live ? st.used - live : 0;
    m.keepcost = 0;
    return m;
}

TAG_EXPORT struct mallinfo mallinfo(void)
{
    struct mallinfo2 m2 = mallinfo2();
    struct mallinfo m;
    memset(&m, 0, sizeof m);
    m.arena = (int)m2.arena;
    m.ordblks = (int)m2.ordblks;
    m.hblks = (int)m2.hblks;
    m.hblkhd = (int)m2.hblkhd;
    m.uordblks = (int)m2.uordblks;
    m.fordblks = (int)m2.fordblks;
    return m;
}

/* Every parameter is accepted; libtag's heap has none of glibc's to tune
 * (M_MXFAST out of glibc's range fails as there). */
TAG_EXPORT int mallopt(int param, int value)
{
    if (param == M_MXFAST && (value < 0 || value > 160))
        return 0;
    return 1;
}

TAG_EXPORT void malloc_stats(void)
{
    struct mallinfo2 m = mallinfo2();
    char buf[512];
    size_t n = _tag_format(buf, sizeof buf,
                           "Arena 0:\nsystem bytes     = %lu\nin use bytes     = %lu\n"
                           "Total (incl. mmap):\nsystem bytes     = %lu\nin use bytes     = %lu\n"
                           "max mmap regions = %lu\nmax mmap bytes   = %lu\n",
                           (unsigned long)m.arena, (unsigned long)m.uordblks,
                           (unsigned long)m.arena, (unsigned long)m.uordblks,
                           (unsigned long)m.hblks, (unsigned long)m.hblkhd);
    ssize_t w = write(2, buf, n);
    (void)w;
}

TAG_EXPORT int malloc_info(int options, FILE *fp)
{
    if (options != 0) {
        errno = EINVAL;
        return -1;
    }
    struct mallinfo2 m = mallinfo2();
    fprintf(fp,
            "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n</sizes>\n"
            "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
            "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n"
            "<system type=\"current\" size=\"%zu\"/>\n<system type=\"max\" size=\"%zu\"/>\n"
            "<aspace type=\"total\" size=\"%zu\"/>\n<aspace type=\"mprotect\" size=\"%zu\"/>\n"
            "</heap>\n"
            "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
            "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n"
            "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n"
            "<system type=\"current\" size=\"%zu\"/>\n<system type=\"max\" size=\"%zu\"/>\n"
            "<aspace type=\"total\" size=\"%zu\"/>\n<aspace type=\"mprotect\" size=\"%zu\"/>\n"
            "</malloc>\n",
            m.ordblks, m.fordblks, m.arena, m.arena, m.arena, m.arena,
            m.ordblks, m.fordblks, m.hblks, m.hblkhd, m.arena, m.arena, m.arena, m.arena);
    return 0;
}

/* The hidden names of the malloc family above (alloc/alloc.h) */
extern __typeof(malloc) _tag_malloc_self __attribute__((alias("malloc"), copy(malloc)));
extern __typeof(free) _tag_free_self __attribute__((alias("free"), copy(free)));
extern __typeof(calloc) _tag_calloc_self __attribute__((alias("calloc"), copy(calloc)));
extern __typeof(realloc) _tag_realloc_self __attribute__((alias("realloc"), copy(realloc)));
extern __typeof(reallocarray) _tag_reallocarray_self __attribute__((alias("reallocarray"), copy(reallocarray)));
extern __typeof(memalign) _tag_memalign_self __attribute__((alias("memalign"), copy(memalign)));
extern __typeof(aligned_alloc) _tag_aligned_alloc_self __attribute__((alias("aligned_alloc"), copy(aligned_alloc)));
extern __typeof(posix_memalign) _tag_posix_memalign_self __attribute__((alias("posix_memalign"), copy(posix_memalign)));
extern __typeof(valloc) _tag_valloc_self __attribute__((alias("valloc"), copy(valloc)));
extern __typeof(pvalloc) _tag_pvalloc_self __attribute__((alias("pvalloc"), copy(pvalloc)));
extern __typeof(malloc_usable_size) _tag_malloc_usable_size_self
    __attribute__((alias("malloc_usable_size"), copy(malloc_usable_size)));
