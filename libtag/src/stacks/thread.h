/* thread.h - a thread's state: the one mapping a thread keeps what every
 * part of libtag needs per thread in (struct tag_thread_state), found
 * through one static TLS pointer (_tag_tls).  Most of it is the thread's
 * stacks - its shadow stack (stacks/shadow.h), its kept walks and their
 * caches (stacks/unwind.c), its stack table cache and counter shards
 * (stacks/stack_table.h) - so it is defined here, in stacks/; the
 * allocation path's few per-thread words (its heap cache, quarantine ring,
 * recent blocks, guard countdown) are here too, their types from below.
 * thread.c maps a state and registers the thread; its end and the
 * process's forks are life/threads.c's. */
#ifndef LIBTAG_THREAD_H
#define LIBTAG_THREAD_H

#include <pthread.h>
#include <stdint.h>
#include "base/base.h"
#include "base/options.h"
#include "heap/heap.h"

/* A thread's last stack walk (unwind.c), outermost frame first, so the
 * next capture can prove its outer part unchanged and take its interned id:
 * per frame the registers the walk had there, and every word the walk read
 * from that frame outward (return address and saved rbp slots, the word
 * that ended it) with the value it read. */
struct tag_walk_frame {
    uint64_t pc, sp, bp;   /* sp: the frame's stack pointer (its callee's CFA) */
    uint32_t id;           /* stack id of this frame and all outer ones */
    uint16_t flags;        /* TAG_WF_* */
    uint16_t reads;        /* rd[0..reads) were read stepping out of f[0..this] */
};
struct tag_walk_read {
    uint64_t addr, value;
};
#define TAG_WF_BP_KNOWN 1u  /* bp holds the frame's rbp */
#define TAG_WF_SIGNAL   2u  /* pc is exact (TAG_FRAME_SIGNAL), not a return address */
#define TAG_WF_DEP_BP   4u  /* the walk from here outward depends on bp */
#define TAG_WALK_KEEP TAG_WALK_MAX  /* walks kept for reuse: all of them */
#define TAG_UC_WALK_MAX 128 /* a capture from a signal handler (guard
                               faults, the crash): its frames are on the
                               handler's stack, which may be a small
                               sigaltstack of the program's */
#define TAG_WALKS 2         /* walks kept per thread: malloc's and free's */
#define TAG_WALK_STOP_FIXED 0  /* decided by registers and rules alone */
#define TAG_WALK_STOP_DEPTH 1  /* LIBTAG_FP_DEPTH frames */
/* The fast check (unwind.c) of one complete walk: a capture from the same
 * innermost frame - return address, stack pointer and, where the walk
 * depends on it, rbp (bits under bp_mask) - with the same code generation,
 * whose words read rd[0..reads) all still hold, is this very walk: it takes
 * id.  pc 0 = none. */
struct tag_fast {
    uint64_t pc, sp, bp, bp_mask;
    uint32_t id, reads;
    uint32_t gen, frames;  /* _tag_code_gen of the walk; its frames (stats) */
    uint32_t hits;         /* captures it answered, not yet in captures */
    uint32_t stamp;        /* when it was filled (the cache's replacement) */
};
#define TAG_FAST_SLOTS 64   /* the per-thread cache of walks, by (pc, sp):
                               8 ways in each of 8 sets (2 sets missed a
                               quarter of python3's captures: one malloc
                               wrapper's (pc, sp) under many stacks) */
#define TAG_FAST_READS 64   /* words it keeps per walk (one a frame, and a
                               saved rbp the walk outward needs); deeper
                               walks: not.  lua's allocations walk ~19
                               frames: 16 words left them all uncached */
struct tag_fast_entry {
    struct tag_fast h;
    struct tag_walk_read rd[TAG_FAST_READS];
};
struct tag_walk {
    struct tag_fast fast;  /* this walk's, over rd[] */
    uint32_t n;            /* frames; 0 = nothing to reuse */
    uint32_t gen;          /* _tag_code_gen when it was walked */
    uint32_t stop;         /* TAG_WALK_STOP_* */
    uint32_t unused;
    uint64_t hi;           /* top of the stack it read (bounds every rd[]) */
    struct tag_walk_frame f[TAG_WALK_KEEP];
    struct tag_walk_read rd[2 * TAG_WALK_KEEP + 1];
};
/* A frame found by the walk in progress, innermost first. */
struct tag_walk_new {
    uint64_t pc, sp, bp;
    uint32_t bp_off;       /* its step read rbp at sp + bp_off */
    uint32_t flags;        /* TAG_WF_* and what its step used (unwind.c) */
};

/* tag_thread_state.hook_cache: TAG_HOOK_SETS sets (a power of 2) of TAG_HOOK_WAYS
 * entries, one cache line a set.  Real programs enter hundreds of hot
 * functions: 64 direct-mapped entries missed on 31-40 M enters of
 * brotli's and sqlite3's runs in bench/run_real.py (every miss a CFI
 * lookup), 256 x 4 on 400-6,000. */
#define TAG_HOOK_SETS 256
#define TAG_HOOK_WAYS 4
struct tag_hook_set {
    uint64_t ra[TAG_HOOK_WAYS];   /* newest first; 0 = empty */
    uint32_t off[TAG_HOOK_WAYS];  /* the CFA - the hook's own CFA */
} __attribute__((aligned(64)));
/* The set of the enter hook's return address ra in tag_thread_state.hook_cache. */
#define TAG_HOOK_SET(ra) (((ra) ^ ((ra) >> 6)) & (TAG_HOOK_SETS - 1))
#define TAG_CAP_MEMO_BITS 10  /* tag_thread_state.cap_memo: 1024 entries (40 KiB) */
#define TAG_CAP_MEMO (1u << TAG_CAP_MEMO_BITS)
/* The per-stack counters' shards (stack_table.c): a chunk holds
 * TAG_SHARD_ENTRIES (tag_abi.h) = 1 << TAG_SHARD_SHIFT entries, and a
 * thread's directory reaches entry numbers below 2^24 (the default
 * LIBTAG_STACK_NODES: entry numbers never pass the nodes). */
#define TAG_SHARD_SHIFT 11
#define TAG_SHARD_DIR (1u << (24 - TAG_SHARD_SHIFT))
_Static_assert(TAG_SHARD_ENTRIES == 1u << TAG_SHARD_SHIFT, "shard chunk");

struct tag_thread_state {
    struct libtag_shadow shadow;     /* first: its address is in the record */
    struct libtag_thread *rec;       /* NULL until registered (and in
                                        _tag_tls_none, always) */
    /* The enter hook's bound on shadow.depth: TAG_SHADOW_MAX once the
     * thread is registered, 0 in _tag_tls_none, so one compare sends both
     * a full shadow stack and an unregistered thread to the slow path,
     * before the hook writes anything. */
    uint32_t shadow_limit;
    /* What the enter hook saw at each depth (shadow_stack.c): its own CFA
     * (the instrumented function's stack pointer at the hook call), its
     * return address, and the function's frame pointer.  Below hook_sp[0], a word
     * above every stack pointer, for the exit hook's look at the entry
     * outside the innermost.  The hook records only
     * these; shadow.sp[d] holds the hook's CFA + 8 with bit 0 set (a lower
     * bound) until a capture finds the function's CFA from them. */
    uint64_t hook_sp_outer;          /* UINT64_MAX once registered: hook_sp[-1] */
    uint64_t hook_sp[TAG_SHADOW_MAX];
    uint64_t hook_ra[TAG_SHADOW_MAX];
    uint64_t hook_bp[TAG_SHADOW_MAX];
    /* Allocations this thread makes before its next guarded one
     * (LIBTAG_GUARD_RATE): the allocation path decrements it and, at 0 or
     * below, calls _tag_guard_alloc, which draws the next one.  Here, not
     * in a TLS variable of its own: the hook then needs no second load of
     * a TLS offset from the GOT. */
    int32_t guard_countdown;
    uint32_t tid;
    int overflow_rec;                /* rec is shared: update with atomics */
    int exiting;                     /* quarantine drained, free directly */
    uint32_t frees;                  /* this thread's frees, for pacing */
    const void *last_alloc;          /* this thread's newest block: freed
                                        before the next allocation, it is a
                                        temporary (stack stats) */
    uint32_t entry_parent, entry_id; /* memo of the last ENTRY node */
    uint64_t entry_fn;
    /* What shadow.id[d+1] was computed from: (id[d], site[d]) at the time.
     * A depth that flips between two callees and back (an inlined helper
     * called before the allocating path) then costs a compare, not a
     * re-intern of everything above it. */
    uint32_t used_parent[TAG_SHADOW_MAX];
    uint64_t used_site[TAG_SHADOW_MAX];
    /* Enters before the next sweep (_tag_hook_tick): LIBTAG_SWEEP from
     * the thread's registration, whether a hook or an allocation made
     * it. */
    int32_t hook_left;
    uint32_t recent_next;
    void *recent[64];                /* TAG_SWEEP_RECENT last allocations */
    struct libtag_quarantine_ring *quarantine;
    /* heap.c: free blocks by class, for this thread's allocations */
    struct tag_heap_cache heap_cache[TAG_HEAP_CLASSES];
    struct { uint64_t pc; uint32_t parent_kind; uint32_t id; } cache[256];
    /* The top of this thread's stack (its record's stack_hi; kept here
     * too because threads beyond the record capacity share one record). */
    uint64_t stack_hi;
    /* The alternate signal stack this thread set with sigaltstack(), so an
     * unwind or a shadow-stack pop knows which stack it is on. */
    uint64_t alt_lo, alt_hi;
    /* Shadow entries recorded at or above this address take the slow pop
     * path: stack_hi, or 0 while an alternate signal stack is set. */
    uint64_t pop_limit;
    /* The CFA offset of instrumented functions (stacks/shadow.h: the end of
     * their return address slot) from their stack pointer at their enter
     * hook call, by the hook's return address (what _tag_hook_cfa found
     * from CFI).  The enter hook trusts an entry only when the slot below
     * that CFA holds its call site; hook_gen: the
     * _tag_code_gen the entries were made under (the slow path drops them
     * when it changed). */
    uint32_t hook_gen;
    struct tag_hook_set hook_cache[TAG_HOOK_SETS];
    /* Code pages found in no module since the module list last changed
     * (unknown_gen): a capture asks the loader once per page. */
    uint32_t unknown_gen, unknown_next;
    uint64_t unknown_pages[16];
    uint32_t probing;                /* sweep.c's probe may fault now */
    uint32_t in_walk;                /* captures under way (a walk, or the
                                        fast check): a nested one (from a
                                        signal handler) leaves walk[] alone */
    uint64_t captures, capture_frames; /* for LIBTAG_STATS */
    /* The calling context of each shadow depth: cc[d] is a 64-bit hash
     * of the call sites site[0..d-1] (cc[0] = 0), kept for d <= cc_valid
     * (shadow_stack.c).  cc_valid is also how far the entries were found
     * alive by a capture (_tag_shadow_settle), and how far shadow.valid
     * holds: an enter that changes an entry lowers cc_valid alone, and
     * the ids are valid up to min(shadow.valid, cc_valid). */
    uint32_t cc_valid;
    uint64_t cc[TAG_SHADOW_MAX + 1];
    /* Shadow-stack captures, direct-mapped by a hash of (cc, pc)
     * (unwind.c): the stack id of a capture from pc whose innermost
     * instrumented function is fn, entered under calling context cc, with
     * its CFA at the capture's sp + off, while the code was gen.  The same
     * inputs give the same stack, so a capture that hits costs a hash of
     * the sites pushed since the last one and a probe: no intern, however
     * the stack below changed (docs/design.md, "Calling contexts"). */
    struct tag_cap_memo { uint64_t cc, pc, fn; uint32_t off, gen, id, pad; } cap_memo[TAG_CAP_MEMO];
    uint32_t walk_lru;               /* the walk[] to replace next */
    struct tag_walk walk[TAG_WALKS];
    /* Complete walks of up to TAG_FAST_READS words, direct-mapped by their
     * innermost frame: the fast check of many sites, beyond the two kept
     * walks' own. */
    struct tag_fast_entry fast[TAG_FAST_SLOTS];
    uint32_t fast_clock;             /* stamps its fills */
    uint8_t fast_last[16];           /* by (pc, sp): the way that answered
                                        last (unwind.c fast_hint) */
    uint32_t exit_rounds;            /* life/threads.c: calls of its exit hook */
    struct tag_walk_new walk_new[TAG_WALK_MAX];
#if TAG_ARCH_FPREGS_BYTES
    /* Its FP registers, saved with its record's registers for a snapshot
     * or a crash (snapshot.c, _tag_save_thread), in the layout of a core's
     * NT_FPREGSET (corewrite.c); fpregs_saved: they were (the signal
     * context had them). */
    uint32_t fpregs_saved;
    uint8_t fpregs[TAG_ARCH_FPREGS_BYTES] __attribute__((aligned(16)));
#endif
    /* This thread's shard of the per-stack counters (tag_abi.h,
     * "per-stack counters"): for its chunk of entries [i << TAG_SHARD_SHIFT,
     * (i + 1) << TAG_SHARD_SHIFT), the chunk's address minus i <<
     * TAG_SHARD_SHIFT entries (so entry e is at shard_dir[i] + e entries);
     * 0 until the thread counts in it (stack_table.c).  The chunks are not
     * here: they outlive the thread.  64 KiB of address space, last (a
     * page of it is touched while the process has fewer than 2^20
     * allocation stacks; in the middle of the state, its two end pages
     * were one more page a thread, counters or not: measured). */
    uintptr_t shard_dir[TAG_SHARD_DIR];
    /* Where a count goes that has no shard entry (it went to the shared
     * entry instead): _tag_shard_slow. */
    struct libtag_stack_shard shard_scratch;
};
/* struct tag_thread_state is ~83 KiB: as static TLS it would be carved out of every
 * thread's stack by glibc, and a program whose threads have small stacks
 * (PTHREAD_STACK_MIN, 32 KiB) would see pthread_create fail with EINVAL
 * under libtag.  So it is mapped per thread (_tag_map, at registration;
 * unmapped at thread exit) and static TLS holds only this: the pointer to
 * it, and what the paths that run without it (before registration, after
 * exit, a thread whose mapping failed) need.
 *
 * t points at _tag_tls_none until the thread registers: a zeroed state
 * that nothing writes, whose rec is NULL - the test every entry point
 * makes (_tag_self), and on which the hooks' fast paths all fail to their
 * slow paths, which register.  So the hot paths pay one load (the pointer)
 * for the indirection and no test of their own. */
struct tag_tls_ref {
    struct tag_thread_state *t;               /* this thread's state, or &_tag_tls_none */
    int *errno_at;                   /* this thread's errno (free() keeps
                                        it): no __errno_location call */
    struct libtag_thread *rec;       /* its record (also once t is gone); NULL = none */
    uint32_t tid;                    /* set at its first registration */
    uint32_t gone;                   /* t unmapped at thread exit: no new one */
};
union tag_tls_none {
    struct tag_thread_state t;
    char pages[(sizeof(struct tag_thread_state) + TAG_PAGE_MAX - 1) & ~(TAG_PAGE_MAX - 1)];
};


extern __thread struct tag_tls_ref _tag_tls __attribute__((tls_model("initial-exec")));
extern union tag_tls_none _tag_tls_none_pages;
#define _tag_tls_none (_tag_tls_none_pages.t)
/* First libtag use in a thread: map its state and take a record.  Returns
 * the state, or NULL when the thread has none (its mapping failed, or it
 * is past its exit hook): then the caller works without one (a stack id 0,
 * no quarantine); _tag_tls.tid is set either way. */
TAG_COLD struct tag_thread_state *_tag_thread_register(void);
TAG_COLD void _tag_threads_init(void);       /* reserve records; no malloc */
/* The calling thread's state, registering it first; NULL: it has none
 * (see _tag_thread_register). */
static inline struct tag_thread_state *_tag_self(void)
{
    struct tag_thread_state *t = _tag_tls.t;
    if (TAG_UNLIKELY(t->rec == NULL))
        t = _tag_thread_register();
    return t;
}

/* Count an allocation (freed 0) or a free of size bytes in the calling
 * thread's record: plain adds where the record is the thread's own,
 * atomics where threads beyond the record capacity share it, or where the
 * thread has no state (t NULL: the record kept in static TLS, if any). */
TAG_INLINE void _tag_count(struct tag_thread_state *t, int freed, uint64_t size)
{
    struct libtag_thread *r = t ? t->rec : _tag_tls.rec;
    if (!t && !r)
        return;
    uint64_t *n = freed ? &r->frees : &r->allocs;
    uint64_t *bytes = freed ? &r->free_bytes : &r->alloc_bytes;
    if (TAG_LIKELY(t && !t->overflow_rec)) {
        (*n)++;
        *bytes += size;
    } else {
        __atomic_fetch_add(n, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(bytes, size, __ATOMIC_RELAXED);
    }
}
/* The key whose destructor ends a thread's life (life/threads.c creates
 * it once libc is up; _tag_thread_register sets it in each thread). */
extern pthread_key_t _tag_exit_key;
extern int _tag_exit_key_ready;
/* The child of the program's own fork(), after the other parts' handlers:
 * its one thread registered anew, the parent's records marked exited.
 * from_main: the fork came from the main thread. */
void _tag_thread_atfork_child(int from_main);

#endif /* LIBTAG_THREAD_H */
