/* tag_types.h - the types libtag's own files share: structs, enums and
 * constants, no functions (the internal API is libtag_internal.h, the
 * primitives tag_prim.h).  Nothing here is exported.  The layouts a core
 * reader sees are tag_abi.h's; these are libtag's private ones. */
#ifndef LIBTAG_TYPES_H
#define LIBTAG_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include "tag_abi.h"

#define TAG_EXPORT  __attribute__((visibility("default")))
#define TAG_NOINSTR __attribute__((no_instrument_function))
#define TAG_LIKELY(x)   __builtin_expect(!!(x), 1)
#define TAG_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* Rare paths (anomalies, registration, table inserts, sweeps) stay out of
 * the hot functions' code: the fast path is one inline body, every rare case
 * a call (mimalloc's free.c does the same). */
#define TAG_COLD     __attribute__((cold, noinline))
#define TAG_NOINLINE __attribute__((noinline))
#define TAG_INLINE   static inline __attribute__((always_inline))

/* The page size libtag assumes (x86_64); guard pages, mincore probes and the
 * self-written core use it. */
#define TAG_PAGE_SIZE 4096u
/* Signal numbers are below this (the kernel's _NSIG is 64: 1..64). */
#define TAG_NSIG 65
/* The real-time signal libtag stops threads with for a snapshot (each saves
 * its registers), and which takes forensics' reap requests (snapshot.c). */
#define TAG_REGS_SIGNAL (SIGRTMAX - 1)

/* How long a handed-over snapshot's child waits for its caller to read
 * the pipe its core goes through (see TAG_SNAPSHOT_REQUEST), between two
 * reads, before it gives up and exits. */
#define TAG_HANDOFF_WAIT_MS 30000

/* Internal invariants, checked in the debug build (cmake -DLIBTAG_DEBUG=ON,
 * which CI runs once); compiled out otherwise.  A failure writes one line
 * with write(2) and aborts: no stdio, no malloc. */
#ifdef LIBTAG_DEBUG  /* _tag_fatal: log.c, in libtag_internal.h */
#define TAG_ASSERT(c) \
    (TAG_LIKELY(c) ? (void)0 : _tag_fatal("libtag: assertion failed: %s (%s:%d)", #c, __FILE__, __LINE__))
#else
#define TAG_ASSERT(c) ((void)0)
#endif

/* ----------------------------------------------- options (options.c) */
enum tag_on_anomaly { TAG_ON_SNAPSHOT = 0, TAG_ON_ABORT = 1, TAG_ON_IGNORE = 2 };
enum tag_core_path { TAG_CORE_AUTO = 0, TAG_CORE_KERNEL = 1, TAG_CORE_SELF = 2 };
/* LIBTAG_UNWIND: where stacks come from (unwind.c). */
enum tag_unwind { TAG_UNWIND_AUTO = 0, TAG_UNWIND_SHADOW = 1, TAG_UNWIND_FP = 2, TAG_UNWIND_CFI = 3 };

/* The bytes of a freed block's payload, from offset 0, patterned and
 * checked in the quarantine (LIBTAG_QUARANTINE_FILL): a write after free
 * anywhere in a block of up to 4 KiB is seen.  docs/design.md, "The
 * quarantine", states the cost. */
#define TAG_QUARANTINE_DEFAULT_FILL 4096u

/* The guard pool (guard.c): the default rate, one allocation in this many;
 * the default caps, in slots, at a sampling rate and at rate 1; and the
 * largest cap LIBTAG_GUARD_SLOTS takes.  docs/design.md states the cost. */
#define TAG_GUARD_DEFAULT_RATE  5000u
#define TAG_GUARD_SAMPLED_SLOTS 256u
/* ... which a sampling rate's pool uses before it reuses slots, and grows
 * past, up to this cap (and the window: guard.c), only when each slot
 * holds a live block; first-of-site blocks hold at most half of
 * TAG_GUARD_SAMPLED_SLOTS at once. */
#define TAG_GUARD_SAMPLED_CAP   2048u
/* ... and the first this many allocations of every allocation stack (a
 * site) are guarded too (LIBTAG_GUARD_SITES). */
#define TAG_GUARD_DEFAULT_SITES 1u
#define TAG_GUARD_MAX_SLOTS     (1u << 18)
#define TAG_GUARD_ALL_SLOTS     TAG_GUARD_MAX_SLOTS
/* Bytes of one slot: blocks up to this minus their tag are guarded. */
#define TAG_GUARD_SLOT_SIZE     (4u * TAG_PAGE_SIZE)

struct tag_options {
    int on_anomaly;              /* enum tag_on_anomaly */
    int core_path;               /* enum tag_core_path */
    int signal;                  /* snapshot signal, 0 = none */
    int quiet;                   /* LIBTAG_QUIET=1: no log lines but the stats */
    int log;                     /* enum tag_log: where log lines go */
    int at_exit;                 /* enum tag_at_exit */
    int stats;                   /* print counters at exit */
    int stack_stats;             /* LIBTAG_STACK_STATS: per-stack counters */
    int omit_payload;            /* LIBTAG_PAYLOAD=omit */
    int unwind;                  /* enum tag_unwind */
    uint32_t fp_depth;           /* depth bound of fp and CFI walks */
    uint32_t stack_nodes;        /* stack table capacity */
    uint64_t quarantine_bytes;   /* per-thread quarantine budget */
    uint32_t quarantine_fill;    /* payload bytes patterned when freed */
    uint32_t sweep_every;        /* hook calls between heap sweeps, 0 = off */
    uint32_t guard_rate;         /* LIBTAG_GUARD_RATE: 1 in N guarded, 0 = off */
    uint32_t guard_slots;        /* LIBTAG_GUARD_SLOTS: the pool's cap, 0 = by rate */
    uint32_t guard_sites;        /* LIBTAG_GUARD_SITES: a stack's first N guarded */
    char dir[512];               /* snapshot directory, "" = cwd */
    char log_path[512];          /* LIBTAG_LOG=PATH: lines go to PATH.<pid> */
};
enum tag_log { TAG_LOG_STDERR, TAG_LOG_PATH, TAG_LOG_OFF };
enum tag_at_exit { TAG_AT_EXIT_NONE, TAG_AT_EXIT_SNAPSHOT };

/* ------------------------------------------------- the heap (heap.c) */
/* libtag's own heap (heap.c says how it works, docs/design.md why).  A
 * slice is 64 KiB of the heap's region; spans of slices hold the blocks of
 * one size class, or one large block. */
/* TAG_HEAP_SLICE: tag_abi.h ("heap") */
/* The largest block libtag hands out (the heap's own limit, 64 TiB). */
#define TAG_BLOCK_MAX ((size_t)1 << 46)
#define TAG_HEAP_SMALL_MAX (64u * 1024)   /* larger blocks: a span each */
#define TAG_HEAP_CLASSES   80u            /* 16..128 by 16, then 8 a doubling */
/* span kinds: enum libtag_span_kind (tag_abi.h) */
#define TAG_SPAN_ZERO    1u  /* its memory reads as zeros (fresh, released) */
#define TAG_SPAN_PARTIAL 2u  /* in its class's list of spans with free blocks */
/* One per slice.  Every slice of a span leads back (first_off) to the
 * span's first slice, whose entry describes the span.  The layout is
 * struct libtag_slice's (tag_abi.h: a reader walks the heap by it), with
 * pointers where libtag follows them. */
struct tag_slice {
    uint32_t first_off;     /* slices back to the span's first slice */
    uint32_t slices;        /* first slice: the span's length */
    uint32_t kind;          /* enum libtag_span_kind */
    uint32_t flags;         /* TAG_SPAN_* */
    uint32_t cls;           /* TAG_SPAN_SMALL: its size class */
    uint32_t block_size;    /* TAG_SPAN_SMALL: bytes of one slot */
    uint32_t capacity;      /* slots in the span */
    uint32_t carved;        /* slots handed out at least once: [0, carved) */
    uint32_t nfree;         /* slots in the span's free list */
    uint32_t block_off;     /* TAG_SPAN_LARGE: its block's slot, from the
                               span's start */
    union {
        void *free;         /* TAG_SPAN_SMALL: its free list (class lock) */
        uint64_t large_size;/* TAG_SPAN_LARGE: its block's requested size */
    };
    struct tag_slice *next, *prev;  /* class list / free bin (locks) */
};
/* The heap's global state (heap.c). */
struct tag_heap {
    uintptr_t base;         /* slice 0 */
    uint64_t slices_max;    /* slices the region has room for */
    uint64_t used;          /* slices [0, used) were ever handed out */
    uint64_t committed;     /* slices [0, committed) are read-write */
    struct tag_slice *meta; /* one entry a slice */
    uint64_t key;           /* free blocks' links are xor'ed with it */
    uint64_t large_count, large_bytes;  /* large spans live (page lock) */
    uint64_t broken_links;  /* free lists found overwritten */
};
/* ... laid out as tag_abi.h says */
_Static_assert(sizeof(struct tag_slice) == sizeof(struct libtag_slice), "slice entry");
_Static_assert(offsetof(struct tag_slice, carved) == offsetof(struct libtag_slice, carved), "slice");
_Static_assert(offsetof(struct tag_slice, block_off) == offsetof(struct libtag_slice, block_off),
               "slice");
_Static_assert(offsetof(struct tag_slice, large_size) == offsetof(struct libtag_slice, large_size),
               "slice");
_Static_assert(sizeof(struct tag_heap) == sizeof(struct libtag_heap), "heap");
_Static_assert(offsetof(struct tag_heap, used) == offsetof(struct libtag_heap, used), "heap");
_Static_assert(offsetof(struct tag_heap, meta) == offsetof(struct libtag_heap, meta), "heap");
/* A thread's cache of free blocks, per class: head, a LIFO list of the
 * blocks it freed (count of them, spilled past the class's limit), and
 * bulk, a span's whole free list taken at once (uncounted, never spilled:
 * only allocations drain it).  malloc() takes head first: the blocks
 * freed last are the ones still in the CPU's caches. */
struct tag_heap_cache {
    void *head;
    uint32_t count;
    uint32_t reserved;
    void *bulk;
};
struct tag_heap_stats {
    uint64_t used, free_spans, large_count, large_bytes;
};

/* ------------------ a thread's state (thread.c; the walks: unwind.c) */
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
#define TAG_WALK_MAX 256    /* LIBTAG_FP_DEPTH's upper bound and default:
                               a stack cut at a fixed depth starts at a
                               different frame whenever the part inside it
                               changes length, so it shares no node with the
                               last one (numpy's tests, cut at 64 frames
                               under nested imports: 4.5 M stack nodes where
                               whole stacks make 2.5 M) */
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
     * return address, and the function's rbp.  Below hook_sp[0], a word
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
    /* The CFA offset of instrumented functions from their stack pointer at
     * their enter hook call, by the hook's return address (what
     * _tag_hook_cfa found from CFI).  The enter hook trusts an entry only
     * when the slot at CFA - 8 holds its call site; hook_gen: the
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
    uint32_t exit_rounds;            /* thread.c: calls of its exit hook */
    struct tag_walk_new walk_new[TAG_WALK_MAX];
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
    char pages[(sizeof(struct tag_thread_state) + TAG_PAGE_SIZE - 1) & ~(TAG_PAGE_SIZE - 1)];
};

/* ----------------------------------------------- modules (modules.c) */
struct tag_module {
    uintptr_t lo, hi;            /* one executable segment [lo, hi) */
    uintptr_t eh_hdr;            /* its object's .eh_frame_hdr; 0 = none */
    uintptr_t data_lo, data_hi;  /* the PT_LOAD holding it: bounds CFI reads */
};

/* ---------------------------------------------- unwind rules (cfi.c) */
/* An unwind rule: how to go from a frame to its caller's, cached per code
 * address in unwind.c.  bits 0..2: TAG_RULE_*; then flags; bits 8..31 the
 * CFA offset; 32..47 where rbp was saved, in 8-byte slots below the CFA;
 * 48..63 a check of the key (unwind.c). */
#define TAG_RULE_TYPE   7ull
#define TAG_RULE_NONE   0ull  /* empty cache slot / nothing known */
#define TAG_RULE_CFA    1ull  /* CFA = rsp or rbp + offset; RA at CFA - 8 */
#define TAG_RULE_FP     2ull  /* no usable CFI: frame pointers, if valid */
#define TAG_RULE_SIGNAL 3ull  /* the signal trampoline: the sigcontext */
#define TAG_RULE_END    4ull  /* outermost frame: return address undefined */
#define TAG_RULE_BAD    5ull  /* not a return address: the walk ends */
#define TAG_RULE_CFA_RBP   (1ull << 3)  /* the CFA is rbp + offset */
#define TAG_RULE_RBP_SAVED (1ull << 4)  /* rbp saved at CFA - 8 * slot */
#define TAG_RULE_RBP_LOST  (1ull << 5)  /* rbp not recoverable */
#define TAG_RULE_OFF_SHIFT   8
#define TAG_RULE_SLOT_SHIFT  32
#define TAG_RULE_CHECK_SHIFT 48

/* --------------------------------- the shadow stack (shadow_stack.c) */
/* The multiplier of the calling-context hash (_tag_shadow_cc). */
#define TAG_CC_MIX 0x9e3779b97f4a7c15ull

/* ----------------------------------------------- the sweep (sweep.c) */
#define TAG_SWEEP_RECENT 64  /* allocations a thread remembers */

/* ------------------------------------------------------ tags (tag.c) */
/* What _tag_lookup finds at a pointer. */
enum tag_lookup { TAG_NOT_OURS = 0, TAG_IS_LIVE = 1, TAG_IS_FREED = 2 };
/* 8 bytes of the free pattern; and "no damaged byte" (_tag_pattern_damage). */
#define TAG_PATTERN64 (0x0101010101010101ull * TAG_FREE_PATTERN)
#define TAG_INTACT ((size_t)-1)

/* ------------------------------------------------- damage (damage.c) */
enum tag_damage {
    TAG_DAMAGE_NONE     = 0,  /* nothing explains it; nothing reported */
    TAG_DAMAGE_KNOWN    = 1,  /* explained and reported; the tag stays
                                 damaged (size unknown): leak the chunk */
    TAG_DAMAGE_REPAIRED = 2,  /* reported; the tag is restored, marked
                                 TAG_FLAG_REPORTED, in its state (live or
                                 freed): go on with it */
};

/* --------------------------------------------- anomalies (anomaly.c) */
/* What an anomaly is about (see struct libtag_anomaly for each kind). */
struct tag_report {
    uint32_t kind;                      /* enum libtag_anomaly_kind */
    uint32_t dealloc;                   /* mismatch: the expected alloc kind */
    const void *address;
    const void *block;                  /* NULL = none */
    const struct libtag_tag *tag;       /* copied; NULL = block's own tag */
    const struct libtag_free_rec *rec;  /* copied; NULL = none */
    uint32_t access;                    /* a fault: TAG_ACCESS_*; else 0 */
    const void *pc;                     /* a fault: the faulting instruction */
};

#endif /* LIBTAG_TYPES_H */
