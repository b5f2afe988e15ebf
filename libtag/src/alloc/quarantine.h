/* quarantine.h - a thread's quarantine (quarantine.c): the ring its freed
 * blocks wait in, patterned, until its byte budget pushes them out; each
 * is checked for writes after free on the way out.  The put is inline
 * here: once per free. */
#ifndef LIBTAG_QUARANTINE_H
#define LIBTAG_QUARANTINE_H

#include <stdint.h>
#include "base/base.h"
#include "base/control.h"
#include "base/options.h"
#include "stacks/thread.h"
#include "alloc/tag.h"

/* Evict (check, then really free) the oldest blocks of q: one
 * (_tag_quarantine_evict_one: the ring is full), or as many as take its
 * bytes back within budget, the newest block excepted (_trim). */
void _tag_quarantine_evict_one(struct tag_thread_state *t, struct libtag_quarantine_ring *q);
void _tag_quarantine_trim(struct tag_thread_state *t, struct libtag_quarantine_ring *q, uint64_t budget);
/* The rare cases of a put: the ring to put user in, or NULL when it was
 * released directly (the thread exits, it exceeds the budget, no ring). */
TAG_COLD struct libtag_quarantine_ring *_tag_quarantine_slow(struct tag_thread_state *t, void *user,
                                                             uint64_t size);
/* Put a freed block of size bytes (freed by this thread, now, from
 * free_stack) and its free record in the calling thread's quarantine;
 * then evict the oldest blocks beyond the budget.  Inline: once per free.
 * The eviction comes last, after the entry is written, so that the caller
 * keeps nothing across it: the put is free()'s last act, and an eviction -
 * one a free(), once the budget is full - is a tail jump to
 * _tag_quarantine_trim with two arguments (evicting first, free() kept the
 * entry's fields across the call: ~15 instructions a free in saves and
 * reloads; inlined, the eviction loop's calls cost more spills than that
 * on allocbench).  The same blocks leave: the newest is never one of them,
 * since it alone fits the budget.  head and count change so that [head,
 * head + count) names only blocks still held, at every instant (see
 * quarantine.c). */
TAG_INLINE void _tag_quarantine_put(struct tag_thread_state *t, void *user, uint64_t size,
                                    uint32_t free_stack, uint32_t now)
{
    struct libtag_quarantine_ring *q = t->quarantine;
    uint64_t budget = _tag_opt.quarantine_bytes;
    TAG_ASSERT(size == _tag_size(_tag_of(user)));
    /* an exiting thread has no ring (drained: _tag_quarantine_drain),
     * and _tag_quarantine_slow maps none for it */
    TAG_ASSERT(!t->exiting || !q);
    if (TAG_UNLIKELY(!q || size > budget)) {
        if (!(q = _tag_quarantine_slow(t, user, size)))
            return;
    }
    uint32_t count = q->count;
    if (TAG_UNLIKELY(count == TAG_QUARANTINE_SLOTS)) {
        _tag_quarantine_evict_one(t, q);
        count = q->count;
    }
    TAG_ASSERT(count < TAG_QUARANTINE_SLOTS);
    TAG_ASSERT(_tag_state(_tag_of(user)) == TAG_STATE_FREED);
    struct libtag_qentry *e = &q->e[(q->head + count) % TAG_QUARANTINE_SLOTS];
    uint64_t tag_addr = (uint64_t)(uintptr_t)user - sizeof(struct libtag_tag);
    uint32_t tid = t->tid;
    e->user = (uint64_t)(uintptr_t)user;
    e->rec.free_stack = free_stack;
    e->rec.free_tid = tid;
    e->rec.free_time = now;
    e->rec.check = free_rec_check_fields(tag_addr, _tag_ctl.secret, free_stack, tid, now);
    TAG_ASSERT(e->rec.check == free_rec_check_value(tag_addr, _tag_ctl.secret, &e->rec));
    uint64_t bytes = q->bytes + size;
    q->bytes = bytes;
    /* the entry is complete before the range includes it */
    __atomic_store_n(&q->count, count + 1, __ATOMIC_RELEASE);
    if (bytes > budget)
        _tag_quarantine_trim(t, q, budget);
}
/* Check and hand back every block of the thread's quarantine; drain also
 * unmaps the ring (thread exit), flush keeps it (process exit). */
void _tag_quarantine_flush(struct tag_thread_state *t);
void _tag_quarantine_drain(struct tag_thread_state *t);
/* The free record of a quarantined block, from whichever thread's ring
 * holds it; 0 if none does.  Rare path (reads rings with _tag_copy_own). */
TAG_COLD int _tag_quarantine_find(const void *user, struct libtag_free_rec *out);
/* In the snapshot child: check every quarantined block's pattern, record
 * what is found in the control block.  No locks, no malloc. */
TAG_COLD void _tag_quarantine_check_all(void);
/* Hand a block back to the real allocator, or leak it when its tag says it
 * was damaged (TAG_FLAG_REPORTED). */
void _tag_real_release(struct tag_thread_state *t, void *user);

#endif /* LIBTAG_QUARANTINE_H */
