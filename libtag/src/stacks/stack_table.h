/* stack_table.h - the stack table (stack_table.c): the trie of (parent,
 * kind, pc) nodes a stack id names, its per-thread cache in front, and the
 * per-stack counters kept on every allocation and free. */
#ifndef LIBTAG_STACK_TABLE_H
#define LIBTAG_STACK_TABLE_H

#include <stdint.h>
#include "base/base.h"
#include "stacks/thread.h"

void _tag_stack_table_init(uint32_t capacity);
/* Intern (parent, kind, pc) and return its id.  Lock-free on hits; inserts
 * take the table lock.  Returns 0 (the root) and counts stack_full when the
 * table is full.  The caller has missed the per-thread cache entry c. */
TAG_COLD uint32_t _tag_intern_slow(struct tag_thread_state *t, uint32_t parent, uint32_t kind,
                                   uint64_t pc, unsigned c);

/* The per-thread cache in front of the table: a capture does several of
 * these per allocation, so the hit path is a few shifts and compares,
 * inlined (callgrind: the out-of-line version with a multiplicative hash
 * was a fifth of all instructions under allocbench). */
static inline uint32_t _tag_intern(struct tag_thread_state *t, uint32_t parent, uint32_t kind,
                                   uint64_t pc)
{
    unsigned c = (unsigned)((pc >> 2) ^ (pc >> 9) ^ (parent * 7u) ^ kind) & 255u;
    uint32_t pk = parent | kind << 30;  /* ids stay below 2^28 (options.c) */
    if (TAG_LIKELY(t->cache[c].pc == pc && t->cache[c].parent_kind == pk && t->cache[c].id))
        return t->cache[c].id;
    return _tag_intern_slow(t, parent, kind, pc, c);
}
/* Per allocation stack counters (tag_abi.h, "per-stack counters"), kept on
 * every allocation and free: counted in the calling thread's shard, which
 * no other thread writes, so a hot stack's counters move between no cores
 * however many threads allocate from it (with one shared entry written by
 * every thread, as before, two threads allocating from one stack cost
 * allocbench 2.7x: issue 42).  A temporary is a block freed by the thread
 * that allocated it before that thread allocated anything else
 * (heaptrack's definition).  LIBTAG_STACK_STATS=0: none kept (_tag_stats
 * NULL, control stack_stats 0).
 *
 * The adds the reader sums are each one read-modify-write instruction
 * (inline asm, so the compiler cannot split it): a signal handler that
 * allocates in the same thread finds each either done or not begun, and
 * so does a snapshot.  No lock prefix: only this thread writes the line.
 * The peak is an estimate that needs a shared write only when a shard's
 * live bytes moved TAG_SHARD_SLACK since its last one (_tag_shard_flush;
 * docs/shared_writes.md lists every shared write that is left). */
extern struct libtag_stack_stats *_tag_stats;  /* [capacity]: the shared entries */
extern uint32_t *_tag_stats_slots;  /* [capacity]: stack id -> entry number */
/* The entry number of a stack that allocates now, given on its first
 * allocation; 0 when none is left (stack_table.c).  Async-signal-safe. */
TAG_COLD uint32_t _tag_stats_new(uint32_t stack);
/* This thread's counters of stack, their chunk mapped if it is not yet.
 * When it cannot have them (no entry number left, no chunk), the
 * allocation (or free, is_free) of size bytes is counted in the shared
 * entry here, and the thread's scratch entry is returned, whose counts go
 * nowhere: the fast path tests nothing more.  Async-signal-safe. */
TAG_COLD struct libtag_stack_shard *_tag_shard_slow(struct tag_thread_state *t, uint32_t stack,
                                                    uint64_t size, int is_free);
/* s's live bytes left [lo, hi]: add what it moved since to the shared
 * entry's estimate, and take a new base, hi, lo and peak. */
TAG_COLD void _tag_shard_flush(struct libtag_stack_shard *s, uint32_t stack);
/* An allocation (or a free) counted in the shared entry, with atomics: a
 * thread without a state or without a shard.  Temporaries are not. */
TAG_COLD void _tag_stats_shared(uint32_t stack, uint64_t size, int is_free);
/* Entry numbers start at TAG_SHARD_ENTRIES, so entry 0 ("none yet") finds
 * directory slot 0 empty, and a directory slot holds its chunk's address
 * minus its first entry's offset: the lookup makes one test. */
TAG_INLINE struct libtag_stack_shard *_tag_shard_of(struct tag_thread_state *t, uint32_t stack,
                                                    uint64_t size, int is_free)
{
    uint32_t e = __atomic_load_n(&_tag_stats_slots[stack], __ATOMIC_RELAXED);
    uintptr_t c = t->shard_dir[e >> TAG_SHARD_SHIFT];
    if (TAG_LIKELY(c != 0))
        return (struct libtag_stack_shard *)(c + (uintptr_t)e * sizeof(struct libtag_stack_shard));
    return _tag_shard_slow(t, stack, size, is_free);
}
/* One uninterruptible update (base/arch.h): a snapshot's signal handler on
 * this thread sees it done or not. */
TAG_INLINE void _tag_stat_add(uint64_t *p, uint64_t v)
{
    tag_arch_add_u64(p, v);
}
TAG_INLINE void _tag_stat_sub(uint64_t *p, uint64_t v)
{
    tag_arch_sub_u64(p, v);
}
/* t: the thread's state, or NULL for a thread without one (interpose.c),
 * whose temporaries are not counted. */
TAG_INLINE void _tag_stats_alloc(struct tag_thread_state *t, uint32_t stack, uint64_t size,
                                 const void *user)
{
    if (TAG_UNLIKELY(!_tag_stats))
        return;
    if (TAG_UNLIKELY(!t)) {
        _tag_stats_shared(stack, size, 0);
        return;
    }
    struct libtag_stack_shard *s = _tag_shard_of(t, stack, size, 0);
    _tag_stat_add(&s->allocs, 1);
    _tag_stat_add(&s->live_bytes, size);
    int64_t live = (int64_t)__atomic_load_n(&s->live_bytes, __ATOMIC_RELAXED);
    /* top = min(hi, peak_bytes - base): past it, a new peak or a flush */
    if (TAG_UNLIKELY(live > (int64_t)s->top)) {
        if (live > (int64_t)s->hi) {
            _tag_shard_flush(s, stack);
        } else {
            s->top = (uint64_t)live;
            s->peak_bytes = (uint64_t)live + s->base;
        }
    }
    t->last_alloc = user;
}
TAG_INLINE void _tag_stats_free(struct tag_thread_state *t, uint32_t stack, uint64_t size,
                                const void *user)
{
    if (TAG_UNLIKELY(!_tag_stats))
        return;
    if (TAG_UNLIKELY(!t)) {
        _tag_stats_shared(stack, size, 1);
        return;
    }
    struct libtag_stack_shard *s = _tag_shard_of(t, stack, size, 1);
    _tag_stat_sub(&s->live_bytes, size);
    if (TAG_UNLIKELY((int64_t)__atomic_load_n(&s->live_bytes, __ATOMIC_RELAXED) < (int64_t)s->lo))
        _tag_shard_flush(s, stack);
    if (TAG_UNLIKELY(user == t->last_alloc)) {
        _tag_stat_add(&s->temporaries, 1);
        t->last_alloc = NULL;
    }
}
void _tag_stack_table_atfork_prepare(void);
void _tag_stack_table_atfork_parent(void);
void _tag_stack_table_atfork_child(void);

/* Intern for a signal handler: no per-thread cache, and an insert only
 * when the table lock is free (else 0: the handler may have interrupted
 * its holder).  Async-signal-safe. */
uint32_t _tag_intern_signal(uint32_t parent, uint32_t kind, uint64_t pc);

#endif /* LIBTAG_STACK_TABLE_H */
