/* guard.h - guarded blocks (guard.c): one allocation in LIBTAG_GUARD_RATE
 * and each stack's first, in a slot of whole pages between inaccessible
 * ones, so an overflow or a use after free faults where it happens. */
#ifndef LIBTAG_GUARD_H
#define LIBTAG_GUARD_H

#include <stddef.h>
#include <stdint.h>
#include "base/base.h"
#include "base/control.h"
#include "stacks/thread.h"
#include "stacks/stack_table.h"

/* A guarded block for this allocation, or NULL: the caller allocates as
 * usual (the rate is off, the block does not fit a slot, the pool is
 * full).  Normal context. */
TAG_COLD void *_tag_guard_alloc(struct tag_thread_state *t, size_t size, size_t align, int zero,
                                uint32_t kind, uint32_t stack, int sampled);
/* LIBTAG_GUARD_SITES in effect: 0 when guarded sampling or the per-stack
 * counters are off.  A stack whose shared entry sent fewer allocations to
 * the guard pool as a new site (libtag_stack_stats.guarded, which
 * _tag_guard_alloc raises) is a new site: its allocation is guarded.  The
 * line is read on every allocation and written about K times a stack (and
 * when a shard flushes: _tag_shard_flush), so it stays in every core's
 * cache. */
extern uint32_t _tag_guard_sites;
TAG_INLINE int _tag_guard_new_site(uint32_t stack)
{
    uint32_t k = _tag_guard_sites;
    if (k == 0)
        return 0;
    uint32_t e = __atomic_load_n(&_tag_stats_slots[stack], __ATOMIC_RELAXED);
    /* (entry 0, "none yet", is never written: its guarded stays 0) */
    return TAG_UNLIKELY(__atomic_load_n(&_tag_stats[e].guarded, __ATOMIC_RELAXED) < k);
}
/* Is ptr in the guard pool?  One subtraction and compare, on every free:
 * bytes is published after guard_pool, and 0 until the pool exists. */
TAG_INLINE int _tag_guarded(const void *ptr)
{
    uint64_t bytes = __atomic_load_n(&_tag_ctl.guard_pool_bytes, __ATOMIC_ACQUIRE);
    return (uint64_t)(uintptr_t)ptr - _tag_ctl.guard_pool < bytes;
}
/* free() and delete of a pointer into the pool, released as dealloc
 * expects (enum libtag_alloc_kind). */
TAG_COLD void _tag_guard_free(struct tag_thread_state *t, void *ptr, uint32_t dealloc, void *ret,
                              void *frame);
/* realloc()'s check of a pointer into the pool: 1 when it is a live
 * guarded block (damage found is reported), else reported and 0. */
TAG_COLD int _tag_guard_check(void *ptr, uint32_t dealloc, void *ret, void *frame);
/* malloc_usable_size() of a pointer into the pool. */
TAG_COLD size_t _tag_guard_usable(const void *ptr);
/* The crash hook's first question on SIGSEGV: is the fault in the guard
 * pool, on a block of ours?  Then it is recorded, snapshotted, and 1 is
 * returned: the faulting instruction may run again (the memory was opened,
 * or with LIBTAG_ON_ANOMALY=abort it faults again and the process dies of
 * it).  0: not ours.  si, uc: the handler's siginfo_t and ucontext_t. */
TAG_COLD int _tag_guard_fault(int sig, void *si, void *uc);
/* In the snapshot child: make the whole pool readable, so the core holds
 * the freed guarded blocks.  Async-signal-safe. */
TAG_COLD void _tag_guard_expose(void);
/* The program's own fork(): the pool lock is held across it. */
/* At start: the window of guarded placements, from vm.max_map_count. */
void _tag_guard_init(void);
uint32_t _tag_guard_window(void);
uint64_t _tag_guard_allocs(void);   /* blocks guarded so far */
/* blocks guarded so far by the sample and as their stack's first, and
 * sampled allocations left unguarded because every slot was taken */
void _tag_guard_kinds(uint64_t *sampled, uint64_t *sites, uint64_t *no_slot);
uint32_t _tag_guard_mappings(void); /* the pool's mappings now */
void _tag_guard_atfork_prepare(void);
void _tag_guard_atfork_parent(void);
void _tag_guard_atfork_child(void);

#endif /* LIBTAG_GUARD_H */
