/* quarantine.c - freed blocks wait here before the real allocator gets them.
 *
 * While a block waits, its tag says "freed", its payload holds a pattern,
 * and its free record (who freed it, when) sits in the ring entry beside
 * the pointer - in libtag's own guard-fenced memory, out of reach of a
 * write through a dangling pointer.  So a reader can answer "freed by whom"
 * for a dangling pointer, a second free() is a certain double free, and a
 * changed pattern is a write after free.  The pattern is checked when the
 * block leaves (eviction), when its thread exits, when the process exits
 * (libtag's destructor flushes the exiting thread's ring) and in every
 * snapshot (the fork child checks every ring and records what it finds).
 *
 * Each thread has its own ring (struct libtag_quarantine_ring, tag_abi.h),
 * mapped by libtag, not malloc'd, with a byte budget (LIBTAG_QUARANTINE per
 * thread), so free() takes no shared lock.  Only the owning thread writes
 * its ring; head and count change in an order that keeps the range
 * [head, head + count) naming blocks still held at every instant, because
 * a snapshot may stop the thread anywhere and readers trust that range.
 */
#include <string.h>
#include <sys/uio.h>

#include "base/base.h"
#include "base/control.h"
#include "base/options.h"
#include "base/prim.h"
#include "heap/heap.h"
#include "stacks/thread.h"
#include "alloc/anomaly.h"
#include "alloc/damage.h"
#include "alloc/quarantine.h"
#include "alloc/tag.h"

#define RING_SLOTS TAG_QUARANTINE_SLOTS
#define PREFETCH_AHEAD 8  /* evictions: evict_one */

/* Inline in the eviction, which runs once a free(): a call there cost
 * ~15 instructions a pair of saves, restores and the call itself.  hc:
 * the releasing thread's heap cache, NULL for a thread without a state
 * (an eviction always has one: no test of it there). */
TAG_INLINE void real_release(struct tag_heap_cache *hc, void *user)
{
    struct libtag_tag *t = _tag_of(user);
    TAG_ASSERT(_tag_valid_at((uint64_t)(uintptr_t)t, t) && _tag_state(t) == TAG_STATE_FREED);
    if (TAG_UNLIKELY(_tag_reported(t))) {
        /* Its canary or its tag was damaged: the write that did it may
         * have gone further, into memory the heap would hand out again.
         * Keep it. */
        _tag_leak_damaged(_tag_size(t));
        return;
    }
    /* No tag may outlive its block: a reader walking the slots would take
     * it for one.  The tag's bits go to 0 (state NONE), and so do an
     * aligned block's forward record's at the slot's start; the heap then
     * writes its free-list link over the slot's first 8 bytes. */
    uint64_t tag_addr = (uint64_t)(uintptr_t)t;
    uint32_t off;
    struct tag_slice *s = _tag_heap_span_off(t, &off);
    /* a slot's start, the common case, in one multiply and compare
     * (_tag_slot_in computes the slot: two multiplies) */
    uint64_t slot = TAG_LIKELY(_tag_small_slot_start(s, off)) ? tag_addr : _tag_slot_in(s, tag_addr);
    t->bits = 0;
    if (TAG_UNLIKELY(slot != tag_addr))
        ((struct libtag_tag *)(uintptr_t)slot)->bits = 0;
    /* the bits first, then the link over the tag's first word: a snapshot
     * that stops this thread in between sees no block, not a torn tag */
    __atomic_signal_fence(__ATOMIC_RELEASE);
    _tag_heap_free_in(hc, s, (void *)(uintptr_t)slot);
}

void _tag_real_release(struct tag_thread_state *owner, void *user)
{
    real_release(owner ? owner->heap_cache : NULL, user);
}

static TAG_COLD void report_uaf(void *user, size_t off, const struct libtag_free_rec *rec)
{
    struct tag_report r = {
        .kind = TAG_ANOMALY_USE_AFTER_FREE,
        .address = (char *)user + off,
        .block = user,
        .rec = rec,
    };
    _tag_anomaly(&r, __builtin_return_address(0), __builtin_frame_address(0));
}

/* A quarantined block whose tag no longer validates: written from below
 * (an underflow through a dangling pointer) or by an overflow of the block
 * before.  Reported and leaked; returns the bytes to take off the budget
 * (0 when its size is lost with its tag). */
static TAG_COLD uint64_t evict_damaged(struct tag_thread_state *t, void *user,
                                       const struct libtag_free_rec *rec)
{
    void *ret = __builtin_return_address(0), *frame = __builtin_frame_address(0);
    enum tag_damage d = _tag_damaged(user, rec, ret, frame);
    if (d == TAG_DAMAGE_REPAIRED) {
        /* restored with TAG_FLAG_REPORTED: its size is known again, and
         * _tag_real_release keeps it from glibc */
        uint64_t size = _tag_size(_tag_of(user));
        _tag_real_release(t, user);
        return size;
    }
    if (d == TAG_DAMAGE_NONE) {
        /* nothing before it overflowed and its tag cannot be restored: it
         * was written below its start after it was freed */
        struct tag_report r = {
            .kind = TAG_ANOMALY_HEAP_UNDERFLOW,
            .address = user,
            .block = user,
            .tag = _tag_of(user),
            .rec = rec,
        };
        _tag_anomaly(&r, ret, frame);
    }
    _tag_leak_damaged(0);
    return 0;
}

/* The oldest block leaves: checked, then handed back.  Its lines were
 * written at free() and are read here a thousand frees or more later, so
 * its tag is usually a cache miss; the tag line of the block
 * PREFETCH_AHEAD evictions ahead is prefetched to hide it.  The fill stays
 * in ordinary stores: with non-temporal ones the check reads from DRAM.
 * The figures: docs/design.md, "The quarantine: 1 MiB a thread, 4 KiB
 * filled". */
TAG_INLINE void evict_one(struct tag_thread_state *owner, struct libtag_quarantine_ring *q)
{
    uint32_t head = q->head, count = q->count;
    TAG_ASSERT(count > 0 && count <= RING_SLOTS && head < RING_SLOTS);
    const struct libtag_qentry *e = &q->e[head];
    void *user = (void *)(uintptr_t)e->user;
    /* count first: in between, the range lacks the newest entry (still
     * held, so harmless); never does it include a block handed back.  The
     * entry itself stays as it is until a later put reuses the slot. */
    __atomic_store_n(&q->count, count - 1, __ATOMIC_RELEASE);
    __atomic_store_n(&q->head, (head + 1) % RING_SLOTS, __ATOMIC_RELEASE);
    struct libtag_tag *t = _tag_of(user);
    if (count > PREFETCH_AHEAD)
        __builtin_prefetch((const char *)(uintptr_t)q->e[(head + PREFETCH_AHEAD) % RING_SLOTS].user -
                           sizeof(struct libtag_tag));
    uint64_t size;
    /* _tag_valid_at, its state test narrowed to FREED */
    if (TAG_LIKELY(_tag_state(t) == TAG_STATE_FREED &&
                   tag_check_of(t) == tag_check_value((uint64_t)(uintptr_t)t, _tag_ctl.secret, t))) {
        size = _tag_size(t);
        size_t off = _tag_freed_damage(user, size);
        if (TAG_UNLIKELY(off != TAG_INTACT)) {
            struct libtag_free_rec rec = e->rec;
            report_uaf(user, off, &rec);
        }
        real_release(owner->heap_cache, user);
    } else {
        struct libtag_free_rec rec = e->rec;
        size = evict_damaged(owner, user, &rec);
    }
    uint64_t bytes = q->bytes;
    q->bytes = bytes - (size < bytes ? size : bytes);
}

static TAG_NOINLINE void evict_all(struct tag_thread_state *t, struct libtag_quarantine_ring *q)
{
    while (q->count)
        evict_one(t, q);
}

static struct libtag_quarantine_ring *ring_new(struct tag_thread_state *t)
{
    void *p = _tag_map(sizeof(struct libtag_quarantine_ring), 0);
    if (p == NULL)
        return NULL;
    t->quarantine = p;
    t->rec->quarantine = (uint64_t)(uintptr_t)p;  /* readers skip it */
    return p;
}

/* The evictions of a put (the put itself is inline in free(),
 * alloc/quarantine.h).  Out of line, so that only q and budget stay live
 * across the calls in the eviction. */
void _tag_quarantine_evict_one(struct tag_thread_state *t, struct libtag_quarantine_ring *q)
{
    evict_one(t, q);
}

void _tag_quarantine_trim(struct tag_thread_state *t, struct libtag_quarantine_ring *q, uint64_t budget)
{
    /* the blocks the put's own went past the budget, never that one: it
     * alone fits (_tag_quarantine_slow releases a larger one), and the
     * loop stops before it even when q->bytes overstates the ring (a
     * damaged block whose size was lost stays counted, so the put may find
     * the budget exceeded with its own block alone in the ring) */
    while (q->count > 1 && q->bytes > budget)
        evict_one(t, q);
}

/* The put's rare cases: no ring yet (mapped now), the thread is exiting,
 * the block is larger than the whole budget, or no ring can be mapped.
 * Returns the ring to put the block in, or NULL when it was released. */
struct libtag_quarantine_ring *_tag_quarantine_slow(struct tag_thread_state *t, void *user, uint64_t size)
{
    struct libtag_quarantine_ring *q = t->quarantine;
    if (!t->exiting && size <= _tag_opt.quarantine_bytes && (q || (q = ring_new(t))))
        return q;
    _tag_real_release(t, user);
    return NULL;
}

void _tag_quarantine_flush(struct tag_thread_state *t)
{
    struct libtag_quarantine_ring *q = t->quarantine;
    if (q)
        evict_all(t, q);
}

/* Called once, when the thread exits (life/threads.c sets t->exiting right after,
 * so later frees of this thread bypass the quarantine).  The ring is mapped
 * per thread: unmap it too, or every thread that ever freed a block leaks
 * its ring and a program that runs many short threads grows without bound.
 * Another thread reading this ring (_tag_quarantine_find) copies it with
 * process_vm_readv, so the unmap cannot fault it. */
void _tag_quarantine_drain(struct tag_thread_state *t)
{
    struct libtag_quarantine_ring *q = t->quarantine;
    _tag_quarantine_flush(t);
    if (q) {
        t->quarantine = NULL;
        t->rec->quarantine = 0;
        _tag_unmap(q, sizeof *q);
    }
}

/* The threads' rings, as the thread records name them. */
static const struct libtag_thread *records(uint32_t *n)
{
    *n = __atomic_load_n(&_tag_ctl.thread_count, __ATOMIC_ACQUIRE);
    if (*n > _tag_ctl.thread_capacity)
        *n = _tag_ctl.thread_capacity;
    return (const struct libtag_thread *)(uintptr_t)_tag_ctl.threads;
}

int _tag_quarantine_find(const void *user, struct libtag_free_rec *out)
{
    uint32_t n;
    const struct libtag_thread *r = records(&n);
    struct libtag_qentry buf[170];  /* 4 KiB of entries a copy */
    for (uint32_t i = 0; i < n; i++) {
        uint64_t ring = __atomic_load_n(&r[i].quarantine, __ATOMIC_ACQUIRE);
        if (!ring)
            continue;
        struct libtag_quarantine_ring *q = (struct libtag_quarantine_ring *)(uintptr_t)ring;
        for (uint32_t k = 0; k < RING_SLOTS; k += 170) {
            uint32_t m = RING_SLOTS - k < 170 ? RING_SLOTS - k : 170;
            struct iovec local = {buf, m * sizeof buf[0]}, remote = {&q->e[k], m * sizeof buf[0]};
            if (_tag_copy_own(&local, &remote, 1) != 1 || local.iov_len == 0)
                break;  /* unmapped under us (the thread exited) */
            for (uint32_t j = 0; j < m; j++)
                if (buf[j].user == (uint64_t)(uintptr_t)user) {
                    *out = buf[j].rec;
                    return 1;
                }
        }
    }
    return 0;
}

/* In the snapshot child: one thread, every other thread frozen where it
 * was, so every ring's [head, head + count) names blocks still held (see
 * the top of this file).  What a dangling pointer wrote since a block was
 * freed is recorded in this copy of the control block: the count in
 * latent_uaf, and the first one as the anomaly when none was recorded
 * before (the snapshot then shows it as a use-after-free). */
void _tag_quarantine_check_all(void)
{
    uint32_t n;
    const struct libtag_thread *r = records(&n);
    for (uint32_t i = 0; i < n; i++) {
        const struct libtag_quarantine_ring *q =
            (const struct libtag_quarantine_ring *)(uintptr_t)r[i].quarantine;
        if (!q)
            continue;
        for (uint32_t k = 0; k < q->count && k < RING_SLOTS; k++) {
            const struct libtag_qentry *e = &q->e[(q->head + k) % RING_SLOTS];
            const void *user = (const void *)(uintptr_t)e->user;
            const struct libtag_tag *t = _tag_of(user);
            if (!_tag_valid_at((uint64_t)(uintptr_t)t, t) || _tag_state(t) != TAG_STATE_FREED)
                continue;  /* a damaged tag: its thread reports it at eviction */
            size_t off = _tag_freed_damage(user, _tag_size(t));
            if (off == TAG_INTACT)
                continue;
            if (_tag_ctl.latent_uaf++ == 0 && _tag_ctl.anomaly.kind == TAG_ANOMALY_NONE) {
                struct tag_report rep = {.kind = TAG_ANOMALY_USE_AFTER_FREE,
                                         .address = (const char *)user + off, .block = user,
                                         .tag = t, .rec = &e->rec};
                _tag_anomaly_record(&rep, _tag_ctl.snapshot_tid, 0,
                                    (uint32_t)_tag_ctl.snapshot_time_ms);
                _tag_ctl.anomaly_count++;
            }
        }
    }
}
