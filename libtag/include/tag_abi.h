/* tag_abi.h - the crash-time ABI of libtag: everything a reader of a core
 * (forensics/reader/abi.py, the gdb commands) needs to recover blocks, stacks and
 * threads from raw memory, with no symbols and no allocator internals.
 *
 * This is a file format.  Every change to a layout bumps TAG_ABI_VERSION, and
 * forensics/reader/abi.py mirrors each struct field for field with the same names;
 * tests/unit/test_abi_mirror.py checks the mirror against a compiled probe.
 *
 * All integers are little-endian x86_64 native.  "Address" fields hold virtual
 * addresses in the traced process.  Times are milliseconds since
 * control.start_mono_ns (CLOCK_MONOTONIC_COARSE, so their resolution is the
 * kernel tick, typically 4 ms) and wrap after 49.7 days.
 */
#ifndef TAG_ABI_H
#define TAG_ABI_H

#include <stddef.h>
#include <stdint.h>

#define TAG_ABI_VERSION 5u

/* The helpers below sit on libtag's hot paths: inline them everywhere. */
#if defined(__GNUC__)
#define TAG_ABI_INLINE static inline __attribute__((always_inline))
#else
#define TAG_ABI_INLINE static inline
#endif

#ifdef __cplusplus
#define _Static_assert static_assert  /* C++ readers include this header too */
#endif

/* ------------------------------------------------------------------ tags --
 * Every block lives in libtag's heap (see "heap" below) or in the guard pool.
 * Layout of one block, from the start of its slot:
 *
 *   slot: [struct libtag_tag, 16 bytes] [payload: size bytes]
 *         [canary: 8 bytes, unaligned, right after the payload] [slack]
 *
 * An aligned block (memalign & co. with an alignment above 16) starts its
 * slot with a forward record instead, a libtag_tag whose state is
 * TAG_STATE_FORWARD and whose alloc_stack holds pad, the bytes from the
 * slot's start to the block's tag:
 *
 *   slot: [forward record] [...] [struct libtag_tag] [payload] [canary] ...
 *         ^ slot start           ^ slot start + pad
 *
 * The user pointer is the address just after the tag and is 16-aligned (or
 * aligned as memalign & co. asked).  The payload region is never smaller
 * than TAG_MIN_PAYLOAD bytes.  A slot whose tag (or forward record) has
 * state TAG_STATE_NONE holds no block: a free slot keeps the heap's link in
 * its first 8 bytes and 0 in its tag's bits.
 *
 * The tag is 16 bytes: the allocating stack and time, and one word of bits
 * (check, thread, size, state, how it was allocated, a reported flag).  The
 * order puts what can be guessed at the top, next to the payload, so that
 * an underflow of a few bytes (which hits the tag's last bytes first) can
 * be undone: the size from where the canary is, the flags by trying each.
 *
 * A size of TAG_SIZE_BIG or more is stored as TAG_SIZE_BIG, and the exact
 * size is in the large span's entry (libtag_slice.large_size): only a block
 * of a large span is that big.
 *
 * While a block is freed and waits in the quarantine, its payload from
 * offset 0 holds TAG_FREE_PATTERN, min(size, control.quarantine_fill) bytes
 * of it, and its free record (who freed it, when) lives outside the block,
 * in the freeing thread's quarantine ring (struct libtag_quarantine_ring
 * below), so no write into the freed payload can erase it.  Once the block
 * leaves the quarantine libtag sets its tag's bits (and its forward
 * record's) to 0 and hands the slot back to the heap: it no longer exists
 * for a reader.
 *
 * A block whose tag or canary was found damaged (TAG_FLAG_REPORTED) is
 * never handed back: its slot stays taken, tag and all, and
 * control.damaged_leaked counts it.
 */
#define TAG_MIN_PAYLOAD  16u
#define TAG_CANARY_SIZE  8u
#define TAG_FREE_PATTERN 0xfdu
/* struct libtag_tag.bits, from bit 0 up: */
#define TAG_CHECK_MASK   0xffffull             /* bits 0..15: the check value */
#define TAG_TID_SHIFT    16                    /* bits 16..37: allocating */
#define TAG_TID_MASK     0x3fffffull           /*   thread (tids < 2^22) */
#define TAG_SIZE_SHIFT   38                    /* bits 38..57: requested */
#define TAG_SIZE_FIELD   0xfffffull            /*   size, TAG_SIZE_BIG = */
#define TAG_SIZE_BIG     0xfffffull            /*   see the span's entry */
#define TAG_STATE_SHIFT  58                    /* bits 58..59: enum libtag_state */
#define TAG_STATE_MASK   3u
#define TAG_ALLOC_SHIFT  60                    /* bits 60..62: enum */
#define TAG_ALLOC_MASK   7u                    /*   libtag_alloc_kind */
#define TAG_FLAG_REPORTED (1ull << 63)         /* damage to this block (its
                                                  canary or its tag) was
                                                  reported: never report it
                                                  again, never hand it back
                                                  to the heap */

/* How a block was allocated, and so how it must be released. */
enum libtag_alloc_kind {
    TAG_ALLOC_MALLOC            = 0,  /* malloc family: free()/realloc() */
    TAG_ALLOC_NEW               = 1,  /* operator new: delete */
    TAG_ALLOC_NEW_ARRAY         = 2,  /* operator new[]: delete[] */
    TAG_ALLOC_NEW_ALIGNED       = 3,  /* operator new(align_val_t): delete(align_val_t) */
    TAG_ALLOC_NEW_ARRAY_ALIGNED = 4,  /* operator new[](align_val_t): delete[](align_val_t) */
};

enum libtag_state {
    TAG_STATE_NONE    = 0,  /* no block (a free slot) */
    TAG_STATE_LIVE    = 1,  /* handed to the program, not freed */
    TAG_STATE_FREED   = 2,  /* freed by the program, held in the quarantine */
    TAG_STATE_FORWARD = 3,  /* a forward record: the slot's block is an
                               aligned one, its tag alloc_stack bytes on */
};

struct libtag_tag {
    uint32_t alloc_stack; /* stack table id of the allocating stack; 0 =
                             none (a forward record: pad) */
    uint32_t alloc_time;  /* ms since start_mono_ns when it was allocated */
    uint64_t bits;        /* check, tid, size, state, kind, reported: see
                             TAG_*_SHIFT above */
};

/* Who freed a block: in its quarantine ring entry, not in the block. */
struct libtag_free_rec {
    uint32_t free_stack;  /* stack table id of the freeing stack; 0 = none */
    uint32_t free_tid;    /* kernel thread id that freed the block */
    uint32_t free_time;   /* ms since start_mono_ns when it was freed */
    uint32_t check;       /* free_rec_check_value() of the block's tag
                             address; a mismatch = not this block's record */
};

/* The check values.  Python computes the same with numpy uint64 arithmetic
 * (multiplication wraps modulo 2^64), so keep them to xor, multiply, shift. */
#define TAG_MIX1 0x9e3779b97f4a7c15ull
#define TAG_MIX2 0xc2b2ae3d27d4eb4full
#define TAG_FREE_SALT 0x46524545u              /* "FREE" */

/* The formulas, of the fields' values (libtag computes them from the values
 * it is about to store: a load of fields just stored waits for the stores).
 * bits is the tag's bits word without its check (bits 0..15 zero). */
TAG_ABI_INLINE uint32_t tag_check_words(uint64_t tag_addr, uint64_t secret, uint64_t bits,
                                       uint64_t stack_time)
{
    uint64_t h = tag_addr ^ secret;
    h = (h ^ bits) * TAG_MIX1;
    h = (h ^ stack_time) * TAG_MIX2;
    return (uint32_t)((h ^ (h >> 32)) >> 16) & 0xffffu;
}

/* The same, of the fields: stack_time is the tag's first 8 bytes read as
 * one little-endian word (alloc_time above alloc_stack). */
TAG_ABI_INLINE uint32_t tag_check_fields(uint64_t tag_addr, uint64_t secret, uint64_t bits,
                                        uint32_t alloc_stack, uint32_t alloc_time)
{
    return tag_check_words(tag_addr, secret, bits, (uint64_t)alloc_time << 32 | alloc_stack);
}

/* A tag's first 8 bytes as that word: one load, not two. */
TAG_ABI_INLINE uint64_t tag_stack_time(const struct libtag_tag *t)
{
    uint64_t w;
    __builtin_memcpy(&w, t, sizeof w);
    return w;
}

TAG_ABI_INLINE uint32_t free_rec_check_fields(uint64_t tag_addr, uint64_t secret,
                                             uint32_t free_stack, uint32_t free_tid,
                                             uint32_t free_time)
{
    uint64_t h = tag_addr ^ secret ^ TAG_FREE_SALT;
    h = (h ^ ((uint64_t)free_tid << 32 | free_stack)) * TAG_MIX1;
    h = (h ^ free_time) * TAG_MIX2;
    return (uint32_t)(h ^ (h >> 32));
}

TAG_ABI_INLINE uint32_t tag_check_value(uint64_t tag_addr, uint64_t secret,
                                       const struct libtag_tag *t)
{
    return tag_check_words(tag_addr, secret, t->bits & ~TAG_CHECK_MASK, tag_stack_time(t));
}

/* The fields of a tag's bits word. */
TAG_ABI_INLINE uint32_t tag_check_of(const struct libtag_tag *t)
{
    return (uint32_t)(t->bits & TAG_CHECK_MASK);
}
TAG_ABI_INLINE uint32_t tag_tid_of(const struct libtag_tag *t)
{
    return (uint32_t)(t->bits >> TAG_TID_SHIFT & TAG_TID_MASK);
}
TAG_ABI_INLINE uint32_t tag_size_field(const struct libtag_tag *t)
{
    return (uint32_t)(t->bits >> TAG_SIZE_SHIFT & TAG_SIZE_FIELD);
}
TAG_ABI_INLINE uint32_t tag_state_of(const struct libtag_tag *t)
{
    return (uint32_t)(t->bits >> TAG_STATE_SHIFT) & TAG_STATE_MASK;
}
TAG_ABI_INLINE uint32_t tag_kind_of(const struct libtag_tag *t)
{
    return (uint32_t)(t->bits >> TAG_ALLOC_SHIFT) & TAG_ALLOC_MASK;
}
/* The bits word of a tag, check excluded (bits 0..15 zero). */
TAG_ABI_INLINE uint64_t tag_bits(uint32_t tid, uint64_t size, uint32_t state, uint32_t kind)
{
    uint64_t sz = size < TAG_SIZE_BIG ? size : TAG_SIZE_BIG;
    return (uint64_t)(tid & TAG_TID_MASK) << TAG_TID_SHIFT | sz << TAG_SIZE_SHIFT |
           (uint64_t)state << TAG_STATE_SHIFT | (uint64_t)kind << TAG_ALLOC_SHIFT;
}

TAG_ABI_INLINE uint32_t free_rec_check_value(uint64_t tag_addr, uint64_t secret,
                                            const struct libtag_free_rec *f)
{
    return free_rec_check_fields(tag_addr, secret, f->free_stack, f->free_tid, f->free_time);
}

/* The 8 bytes stored right after the payload of a live block. */
TAG_ABI_INLINE uint64_t tag_canary_value(uint64_t tag_addr, uint64_t secret)
{
    return ((tag_addr ^ secret) * TAG_MIX2) ^ (tag_addr >> 4);
}

/* ---------------------------------------------------------- stack table --
 * Stacks are interned as a trie: a stack id is the index of its innermost
 * node; following parent links to id 0 (the empty stack) gives the frames
 * innermost first.  Node 0 is the root and carries no frame.
 */
enum libtag_frame_kind {
    TAG_FRAME_CALL  = 1,  /* pc is a return address / call site */
    TAG_FRAME_ENTRY = 2,  /* pc is the entry of an instrumented function
                             (-finstrument-functions' this_fn): it names the
                             function the next-inner CALL frame, if any, is in */
    TAG_FRAME_SIGNAL = 3, /* pc is the exact address of an instruction a
                             signal interrupted (not a return address: look
                             up pc itself); the next-inner frame, if any, is
                             the signal handler's */
    TAG_FRAME_LOST   = 4, /* pc 0: the stack table was full, and the frames
                             inner to this point were not recorded; always
                             a stack's innermost node (its parent's frames
                             are right; parent 0: none is known) */
};

struct libtag_stack_node {
    uint64_t pc;          /* code address, see kind */
    uint32_t parent;      /* id of the caller's prefix; 0 = outermost frame */
    uint32_t kind;        /* enum libtag_frame_kind */
};

/* ------------------------------------------------------- shadow stacks --
 * One per thread, in its libtag state (mapped per thread), maintained by
 * __cyg_profile_func_enter/exit.  Frame d (0 = outermost) was entered as
 * this_fn = fn[d] from call_site = site[d], and its CFA (the caller's stack
 * pointer at the call) is sp[d].  Only min(depth, TAG_SHADOW_MAX) frames are
 * stored; deeper calls are counted in depth and overflows.  Entries whose
 * frames a longjmp or an exception skipped are popped at the thread's next
 * enter or capture, so in a snapshot an entry with sp[d] at or below the
 * thread's stack pointer may still be one of those.
 */
#define TAG_SHADOW_MAX 256

struct libtag_shadow {
    uint32_t depth;                   /* frames currently entered */
    uint32_t valid;                   /* id[0..valid] are interned and match
                                         site[0..valid-1]; may exceed depth
                                         (slots above it are kept until an
                                         enter overwrites them) */
    uint64_t overflows;               /* enters beyond TAG_SHADOW_MAX */
    uint64_t fn[TAG_SHADOW_MAX];      /* function entry address */
    uint64_t site[TAG_SHADOW_MAX];    /* call site in the caller */
    uint64_t sp[TAG_SHADOW_MAX];      /* CFA of the frame: site[d] is stored
                                         at sp[d] - 8; bit 0 set: only a
                                         lower bound of it is known (the
                                         enter hook's own CFA + 8, until a
                                         capture finds the CFA; or no CFI
                                         for the function) */
    uint32_t id[TAG_SHADOW_MAX + 1];  /* id[d+1] = stack id through site[d];
                                         id[0] = 0 */
};

/* -------------------------------------------------------------- threads --
 * One record per thread that ever entered libtag; records are never reused,
 * so counters of exited threads stay in the totals.
 */
#define TAG_THREAD_EXITED   1u  /* the thread has exited */
#define TAG_THREAD_REGS     2u  /* regs/regs_sp hold its state at the last
                                   snapshot */

/* A thread's quarantine ring (libtag/src/alloc/quarantine.c): the blocks it freed
 * that have not been handed back yet, oldest first, and who freed each.
 * Entries e[(head + i) % TAG_QUARANTINE_SLOTS] for i < count are current;
 * libtag updates head and count so that this range never names a block
 * that was handed back, at any instant a snapshot may stop the thread. */
#define TAG_QUARANTINE_SLOTS 4096u

struct libtag_qentry {
    uint64_t user;                /* user pointer of the freed block */
    struct libtag_free_rec rec;   /* who freed it */
};

struct libtag_quarantine_ring {
    uint32_t head;                /* index of the oldest entry */
    uint32_t count;               /* entries held */
    uint64_t bytes;               /* requested bytes of the blocks held */
    struct libtag_qentry e[TAG_QUARANTINE_SLOTS];
};
#define TAG_QUARANTINE_BYTES (16u + 24u * TAG_QUARANTINE_SLOTS)

/* General registers: on x86_64 in the kernel's struct user_regs_struct
 * order, the same order as the prstatus note of a core; on aarch64 (27 of
 * the 34 words of its user_pt_regs) x0-x7, x19-x30, sp, pc, pstate,
 * x8-x11 (libtag/src/base/arch_aarch64.h). */
#define TAG_NREGS 27

struct libtag_thread {
    uint32_t tid;             /* kernel thread id; 0 = slot unused */
    uint32_t flags;           /* TAG_THREAD_* */
    uint64_t shadow;          /* address of its struct libtag_shadow; 0 = none */
    uint64_t allocs;          /* allocations made by this thread */
    uint64_t frees;           /* frees made by this thread */
    uint64_t alloc_bytes;     /* requested bytes allocated by this thread */
    uint64_t free_bytes;      /* requested bytes of the blocks it freed */
    uint64_t stack_hi;        /* highest address of its stack; 0 = unknown */
    uint64_t regs[TAG_NREGS]; /* see TAG_THREAD_REGS */
    uint64_t quarantine;      /* address of its struct libtag_quarantine_ring:
                                 libtag's own memory, which holds pointers to
                                 freed blocks (not the program's references)
                                 and their free records; 0 = none */
    uint64_t reserved;        /* zero */
};

/* ----------------------------------------------------------------- heap --
 * libtag's own heap (libtag/src/heap/heap.c), which a reader walks to find every
 * block: no scan of memory.  control.heap is the address of its struct
 * libtag_heap.
 *
 *   region: slices of TAG_HEAP_SLICE bytes from heap.base; slices
 *           [0, heap.used) were handed out at least once.
 *   meta:   struct libtag_slice[heap.used] at heap.meta, one per slice.
 *           Slice i's entry has first_off = how many slices back its span
 *           starts; the span's first entry describes the span (kind ...).
 *   span:   TAG_SPAN_SMALL: slots of block_size bytes from the span's start;
 *           slots [0, carved) were handed out at least once, each starts
 *           with a tag or a forward record (state NONE: free).
 *           TAG_SPAN_LARGE: one block, its slot at the span's start plus
 *           block_off; large_size is its requested size when the tag's
 *           size field says TAG_SIZE_BIG.
 *           TAG_SPAN_FREE: no blocks.
 */
#define TAG_HEAP_SLICE 65536u

enum libtag_span_kind { TAG_SPAN_FREE = 0, TAG_SPAN_SMALL = 1, TAG_SPAN_LARGE = 2 };

struct libtag_slice {
    uint32_t first_off;   /* slices back to the span's first slice */
    uint32_t slices;      /* first slice: the span's length in slices */
    uint32_t kind;        /* enum libtag_span_kind */
    uint32_t flags;       /* libtag's own */
    uint32_t cls;         /* TAG_SPAN_SMALL: its size class */
    uint32_t block_size;  /* TAG_SPAN_SMALL: bytes of one slot */
    uint32_t capacity;    /* slots in the span */
    uint32_t carved;      /* slots handed out at least once: [0, carved) */
    uint32_t nfree;       /* libtag's own */
    uint32_t block_off;   /* TAG_SPAN_LARGE: bytes from the span's start to
                             its block's slot */
    uint64_t large_size;  /* TAG_SPAN_LARGE: requested size of its block
                             (TAG_SPAN_SMALL: libtag's own) */
    uint64_t next, prev;  /* libtag's own */
};

struct libtag_heap {
    uint64_t base;        /* address of slice 0 */
    uint64_t slices_max;  /* slices the region has room for */
    uint64_t used;        /* slices [0, used) were ever handed out */
    uint64_t committed;   /* slices [0, committed) are read-write */
    uint64_t meta;        /* address of struct libtag_slice[slices_max] */
    uint64_t key;         /* libtag's own (free links are xor'ed with it) */
    uint64_t large_count, large_bytes;  /* large spans live */
    uint64_t broken_links;/* free lists found overwritten */
};

/* ----------------------------------------------------------- guard pool --
 * LIBTAG_GUARD_RATE=N places one allocation in N (chosen at random per
 * thread) in a slot of its own, in a pool of whole pages:
 *
 *   guard_pool: [guard page][slot 0][guard page][slot 1] ... [slot n-1][guard page]
 *   slot i starts at guard_pool + page + i * (guard_slot_size + page)
 *
 * where page, a guard page's bytes, is control.page_size - or, where that
 * reads 0 (a libtag that did not write it: x86_64's 4 KiB pages),
 * TAG_GUARD_PAGE.
 *
 * Guard pages are never accessible.  A slot is accessible while its block
 * is live; once freed it is made inaccessible (PROT_NONE) and stays so
 * until the pool needs the slot again (the oldest freed slot is reused
 * first), so the first access to a freed block faults, as does the first
 * access past its end.  The block is right-aligned: user + max(size,
 * TAG_MIN_PAYLOAD), rounded up to the block's alignment, is the slot's end.
 * Its tag is in the 16 bytes before user as for any block (a reader finds
 * it from the slot record's user); there is no canary.  The slack - from the start
 * of the page holding the tag up to the tag, and from the end of the
 * payload to the end of the slot - holds TAG_GUARD_PATTERN and is checked
 * when the block is freed.  The pages of a slot below the tag's page hold
 * zeros or what an earlier block of the slot left (never a tag: the tag
 * of a slot's earlier block is cleared when the slot is reused).  A freed
 * guarded block keeps its tag (state freed) and
 * its patterned payload, as a quarantined one does; its free record is in
 * its slot record (struct libtag_guard_slot), not in a quarantine ring.
 *
 * A snapshot core holds the whole pool readable (the snapshot child opens
 * it before the core is written); other cores (the kernel's core of a
 * crash, a live process) show freed slots as unreadable memory.
 */
#define TAG_GUARD_PAGE    4096u  /* bytes of a guard page where
                                    control.page_size is 0 */
#define TAG_GUARD_PATTERN 0xfbu  /* the slack around a guarded block */

enum libtag_guard_state {
    TAG_GUARD_EMPTY = 0,  /* never used, or given up (its block is gone) */
    TAG_GUARD_LIVE  = 1,  /* holds a live block: accessible */
    TAG_GUARD_FREED = 2,  /* holds a freed block: inaccessible unless
                             retired */
    TAG_GUARD_BUSY  = 3,  /* being placed or freed by a thread */
};

/* One per slot, in libtag's own memory (control.guard_slots). */
struct libtag_guard_slot {
    uint64_t user;                /* user pointer of the block placed in the
                                     slot last; 0 = none */
    struct libtag_free_rec rec;   /* who freed it, while state is
                                     TAG_GUARD_FREED; all zero otherwise */
    uint32_t state;               /* enum libtag_guard_state */
    uint32_t retired;             /* 1: a fault in this slot or in a guard
                                     page next to it was handled by opening
                                     that memory, which the program may go
                                     on using: the slot is never made
                                     inaccessible again nor reused */
    struct libtag_tag tag;        /* the block's tag as libtag last wrote
                                     it: restores a damaged tag, and answers
                                     for a freed block without reading it */
    uint32_t next;                /* the queue of freed slots: index + 1 of
                                     the next one; 0 = end */
    uint32_t reported;            /* 1: a fault on this slot's block was
                                     reported: the next ones are not */
};

/* -------------------------------------------------------- control block --
 * One per process, in libtag's data segment.  A reader finds it by
 * TAG_CONTROL_MAGIC and confirms it by self == its own address.
 */
#define TAG_CONTROL_MAGIC "LIBTAG-CONTROL-1"  /* 16 bytes, no NUL stored */

enum libtag_reason {
    TAG_REASON_NONE      = 0,  /* not a snapshot (a live process) */
    TAG_REASON_ON_DEMAND = 1,  /* LIBTAG_SIGNAL or libtag_snapshot() */
    TAG_REASON_ANOMALY   = 2,  /* see anomaly.kind */
    TAG_REASON_CRASH     = 3,  /* see crash */
    TAG_REASON_EXIT      = 4,  /* LIBTAG_AT_EXIT=snapshot: the process called
                                  exit(); taken after its atexit handlers and
                                  static destructors */
};

enum libtag_anomaly_kind {
    TAG_ANOMALY_NONE           = 0,
    TAG_ANOMALY_DOUBLE_FREE    = 1,
    TAG_ANOMALY_INVALID_FREE   = 2,
    TAG_ANOMALY_HEAP_OVERFLOW  = 3,
    TAG_ANOMALY_USE_AFTER_FREE = 4,
    TAG_ANOMALY_HEAP_UNDERFLOW = 5,
    TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH = 6,
};

/* libtag_anomaly.access */
#define TAG_ACCESS_NONE  0u
#define TAG_ACCESS_READ  1u
#define TAG_ACCESS_WRITE 2u

/* What address and block mean for each kind:
 *   double-free, invalid-free: address = the pointer passed to free();
 *     block = that block (double free), 0 (invalid free)
 *   heap-overflow: address = the first damaged byte after the payload
 *     (its canary); block = the block that overflowed
 *   use-after-free: address = the first byte of the freed payload that no
 *     longer holds TAG_FREE_PATTERN; block = the freed block; free_rec =
 *     its free record
 *   heap-underflow: the block's tag was damaged from below.  When libtag
 *     could undo the damage, tag is the tag as it was (it validates) and
 *     address the first damaged byte of the tag; when it could not, tag is
 *     the damaged tag as found (it does not validate: size, stacks and
 *     thread are unknown) and address is the pointer passed to free()
 *   alloc-dealloc-mismatch: address = block = the pointer released; tag
 *     says how it was allocated, dealloc how it was released
 */
struct libtag_anomaly {
    uint32_t kind;            /* enum libtag_anomaly_kind */
    uint32_t tid;             /* thread that detected it */
    uint64_t address;         /* see above */
    uint64_t block;           /* user pointer of the block involved; 0 = none */
    uint32_t stack;           /* stack table id of the detecting stack (for a
                                 bad release: the releasing stack); 0 = none */
    uint32_t time;            /* ms since start_mono_ns */
    struct libtag_tag tag;    /* copy of the block's tag; all zero if none */
    struct libtag_free_rec free_rec; /* copy of its free record, if freed;
                                 all zero if none */
    uint32_t access;          /* TAG_ACCESS_*: the faulting access of a
                                 guarded block; 0 = not a fault */
    uint32_t dealloc;         /* alloc-dealloc-mismatch: the enum
                                 libtag_alloc_kind the releasing function
                                 expects; 0 otherwise */
    uint64_t pc;              /* faulting instruction; 0 = not a fault */
};

struct libtag_crash {
    uint32_t signal;          /* signal number; 0 = no crash */
    uint32_t tid;             /* faulting thread */
    uint64_t address;         /* si_addr */
    uint32_t code;            /* si_code */
    uint32_t stack;           /* stack table id of the faulting thread */
    uint32_t time;            /* ms since start_mono_ns */
    uint32_t reserved;
};

/* The signal libtag uses to stop every thread for a snapshot (SIGRTMAX - 1)
 * also takes one request from outside: sigqueue() with this value asks the
 * process to reap its finished snapshot children now (forensics snapshot
 * does, once the core is complete), so an idle process keeps no zombie. */
#define TAG_REAP_REQUEST 0x52454150u  /* "PAER" */

/* ... and this value asks for an on-demand snapshot.  It is how forensics
 * snapshot asks by default: the signal is one libtag claimed because the
 * program left it alone, so no signal the program owns (SIGUSR2 for
 * PostgreSQL, nginx's binary upgrade) is ever sent.  control.request_signal
 * says whether libtag still handles it.  When control.request_nonce is not
 * 0 at that moment, the snapshot is handed over instead of written to a
 * directory: its fork child writes the core into a pipe whose read end it
 * publishes in its own control.handoff_fd, for the caller to take with
 * pidfd_getfd(2) (so a process that dropped its privileges, or sees
 * another file system, still gives its core to whoever asked); the parent
 * records the child in control.last with last.nonce = the request's. */
#define TAG_SNAPSHOT_REQUEST 0x50414e53u  /* "SNAP" */

/* The latest snapshot the process took (what its "info" file says). */
struct libtag_snapinfo {
    uint64_t nonce;           /* the handoff request it served; 0 = written to
                                 a snapshot directory */
    uint32_t seq;             /* control.snapshot_seq of it */
    uint32_t child;           /* pid of the fork child that writes its core */
    uint32_t tid;             /* thread that took it */
    uint32_t threads_stopped; /* other threads that saved their registers */
    uint32_t reason;          /* enum libtag_reason */
    uint32_t reserved;
    uint64_t pause_ns;        /* how long the process was stopped */
    uint64_t fork_ns;         /* of which the fork */
    uint64_t time_ms;         /* CLOCK_REALTIME, ms since the epoch */
    uint64_t request_ns;      /* CLOCK_MONOTONIC of the oldest request it served */
};

/* control.options */
#define TAG_OPTION_NO_PAYLOAD 1u  /* LIBTAG_PAYLOAD=omit: in this core the
                                     payload bytes of every tagged block are
                                     blanked; tags and metadata are kept */

struct libtag_control {
    char     magic[16];       /* TAG_CONTROL_MAGIC */
    uint64_t self;            /* address of this struct */
    uint32_t abi_version;     /* TAG_ABI_VERSION */
    uint32_t tag_size;        /* sizeof(struct libtag_tag) */
    uint32_t free_rec_size;   /* sizeof(struct libtag_free_rec) */
    uint32_t canary_size;     /* TAG_CANARY_SIZE */
    uint64_t secret;          /* per-process key of the check values */
    uint64_t start_realtime_ns; /* CLOCK_REALTIME when libtag started */
    uint64_t start_mono_ns;   /* CLOCK_MONOTONIC_COARSE when libtag started */
    uint32_t pid;             /* process id of the traced process */
    uint32_t options;         /* TAG_OPTION_* flags */

    /* stack table */
    uint64_t stack_nodes;     /* address of struct libtag_stack_node[] */
    uint32_t stack_capacity;  /* nodes reserved */
    uint32_t stack_count;     /* nodes in use, root included */
    uint64_t stack_full;      /* node inserts that found the table full
                                 (a capture may make several) */

    /* threads */
    uint64_t threads;         /* address of struct libtag_thread[] */
    uint32_t thread_capacity; /* records reserved */
    uint32_t thread_count;    /* records in use */
    uint64_t shadow_overflows;/* updated from exited threads and snapshots */

    /* quarantine */
    uint64_t quarantine_bytes;/* byte budget per thread */
    uint32_t quarantine_fill; /* cap: a freed block's first min(size, this)
                                 payload bytes hold TAG_FREE_PATTERN */
    uint32_t page_size;       /* the system's page size, which libtag took at
                                 start: a guard page of the guard pool is
                                 one (4096 on x86_64; 4, 16 or 64 KiB on
                                 aarch64).  0 in a core of a libtag that
                                 left this field reserved: TAG_GUARD_PAGE */

    /* the snapshot this memory is (in a snapshot core) */
    uint32_t reason;          /* enum libtag_reason */
    uint32_t snapshot_seq;    /* 1 for the first snapshot of the process */
    uint64_t snapshot_time_ms;/* ms since start_mono_ns */
    uint32_t snapshot_tid;    /* thread that took it */
    uint32_t anomaly_count;   /* anomalies detected so far */
    struct libtag_anomaly anomaly; /* the latest anomaly recorded: the one
                                 that caused this snapshot when reason is
                                 TAG_REASON_ANOMALY; kind 0 = none yet */
    struct libtag_crash   crash;

    uint32_t thread_state_bytes; /* size of libtag's per-thread block
                                 (struct tag_thread_state, mapped per
                                 thread, not TLS), which starts at each
                                 thread record's shadow address: libtag's
                                 own memory, never the program's
                                 references */
    uint32_t latent_uaf;      /* in a snapshot core: quarantined blocks the
                                 snapshot found written after free (the
                                 first is in anomaly when no anomaly was
                                 recorded before); 0 in a live process */
    uint64_t damaged_leaked;  /* blocks never handed back to the real
                                 allocator because their tag or canary was
                                 damaged (TAG_FLAG_REPORTED) */
    uint64_t damaged_bytes;   /* their requested bytes (of those whose size
                                 is known) */
    uint64_t stack_stats;     /* address of struct libtag_stack_stats[]
                                 (stack_stats_used entries, entry 0 unused),
                                 indexed through stack_stats_slots: the
                                 shared entries of the per-stack counters,
                                 which add to the shards' (stack_shards;
                                 see "per-stack counters"); 0 = not
                                 recorded */

    /* the guard pool (LIBTAG_GUARD_RATE; see "guard pool" above) */
    uint64_t guard_pool;      /* address of its first byte (a guard page);
                                 0 = no pool (yet) */
    uint64_t guard_pool_bytes;/* its length in bytes; 0 = no pool */
    uint64_t guard_slots;     /* address of struct libtag_guard_slot
                                 [guard_capacity]: libtag's own memory */
    uint32_t guard_slot_size; /* bytes of one slot (whole pages) */
    uint32_t guard_capacity;  /* slots the pool may hold (its cap) */
    uint32_t guard_rate;      /* one allocation in guard_rate is guarded;
                                 0 = none */
    uint32_t guard_used;      /* slots used at least once */
    uint64_t guard_faults;    /* faults in the pool libtag handled */

    /* requests from outside (forensics snapshot; see TAG_SNAPSHOT_REQUEST) */
    uint32_t request_signal;  /* signal libtag takes requests on; 0 = the
                                 program installed its own handler on it */
    uint32_t user_signal;     /* LIBTAG_SIGNAL while libtag handles it; 0 =
                                 turned off, or taken by the program */
    uint32_t start_euid;      /* effective uid when libtag started */
    int32_t  handoff_fd;      /* in a handoff child's memory: the pipe's read
                                 end, once its core is being written; 0 =
                                 not yet; -errno = it failed */
    uint64_t request_nonce;   /* written from outside: hand the next
                                 on-demand snapshot over (0 = none) */
    struct libtag_snapinfo last; /* the latest snapshot taken */
    uint64_t heap;            /* address of struct libtag_heap (see "heap") */
    uint64_t stack_stats_slots; /* address of uint32_t[stack_capacity]: the
                                 stack_stats entry of each stack id, given
                                 at the stack's first allocation; 0 = none
                                 (only allocation stacks have counters, so
                                 they are dense: a free stack or an inner
                                 node costs 4 bytes, not 32) */
    uint32_t stack_stats_used;/* stack_stats entries given out, entry 0
                                 included */
    uint32_t reserved1;
    char     dir[512];        /* the snapshot root the process writes to
                                 (LIBTAG_DIR, else its XDG state dir, as
                                 resolved at start); "" = none */
    uint64_t stack_shards;    /* address of struct libtag_shard_chunk
                                 [stack_shard_capacity]: the per-thread
                                 shards of the per-stack counters (see
                                 "per-stack counters" below); 0 = none */
    uint32_t stack_shard_count;   /* chunk records in use */
    uint32_t stack_shard_capacity;/* chunk records reserved */
};

/* ---------------------------------------------------- per-stack counters --
 * What each allocation stack allocated, freed and held, kept on the
 * allocation and free paths (LIBTAG_STACK_STATS, default on).  A stack gets
 * an entry number e at its first allocation (control.stack_stats_slots[id];
 * 0 = none yet), dense from TAG_SHARD_ENTRIES (numbers 1 to
 * TAG_SHARD_ENTRIES - 1 are never given; control.stack_stats_used is the
 * next number to give).
 *
 * Each thread counts in a shard of its own, which no other thread writes
 * (no cache line of these counters is written by two threads on the
 * allocation and free paths): shards come in chunks of TAG_SHARD_ENTRIES
 * entries, chunk records listed at control.stack_shards, each naming the
 * thread (tid) and the first entry number of its chunk.  Chunks are never
 * reused or freed, so the shards of threads that exited stay in the sums.
 * One stack's counters are the SUM over every chunk record of its entry
 * (first <= e < first + TAG_SHARD_ENTRIES), PLUS its shared entry
 * control.stack_stats[e] (below: what threads without a shard counted).
 * Every counter summed is changed by one instruction, so a snapshot, which
 * stops threads between instructions, sees each add done or not begun.
 *
 * live_bytes of one shard is that thread's allocations minus its frees of
 * the stack's blocks: a thread that frees blocks another one allocated goes
 * below zero (the sum, modulo 2^64, is right).  So a peak cannot be summed.
 * peak_bytes is an estimate: each thread carries est = live_bytes + base,
 * its view of the stack's whole live bytes, and records the most est has
 * been.  base is refreshed when the thread's live_bytes leaves [lo, hi]
 * (TAG_SHARD_SLACK either side of its value at the last refresh): the
 * thread then adds what it gained or lost since to the shared entry's
 * flushed (one atomic add on the shared line, a slow path) and takes
 * base = flushed - live_bytes.  The stack's peak is the MOST of its shards'
 * peak_bytes.  It is exact when one thread alone counts the stack (its
 * est is then the live bytes); when n threads count it (allocate or free
 * its blocks, at once or one after another: a thread's bytes not yet
 * added to flushed stay out of the others' est) it may be off by up to
 * n x TAG_SHARD_SLACK either way.
 */
#define TAG_SHARD_ENTRIES 2048u          /* entries a chunk: 128 KiB */
#define TAG_SHARD_SLACK   65536u         /* bytes a shard's live_bytes may move
                                            before it refreshes base */

/* One stack's shared entry (control.stack_stats[e]): written only on slow
 * paths, with atomics. */
struct libtag_stack_stats {
    uint64_t live_bytes;      /* requested bytes live now of the blocks
                                 counted here: those of threads without a
                                 shard (no state of their own, or no chunk
                                 could be mapped) */
    uint64_t flushed;         /* what the shards flushed, plus live_bytes:
                                 libtag's running estimate of the stack's
                                 live bytes (see above; not a count) */
    uint64_t guarded;         /* allocations of the stack sent to the guard
                                 pool as a new site (LIBTAG_GUARD_SITES) */
    uint64_t allocs;          /* blocks counted here */
};

/* One stack's counters in one thread's shard. */
struct libtag_stack_shard {
    uint64_t live_bytes;      /* this thread's allocations minus its frees
                                 of the stack's blocks, in requested bytes
                                 (modulo 2^64: may be "negative") */
    uint64_t peak_bytes;      /* the most est (live_bytes + base) has been:
                                 the stack's peak as this thread saw it */
    uint64_t temporaries;     /* the stack's blocks this thread freed
                                 before it allocated anything else */
    uint64_t allocs;          /* blocks of the stack this thread allocated */
    uint64_t base;            /* est - live_bytes (modulo 2^64) */
    uint64_t hi, lo;          /* refresh base when live_bytes, as a signed
                                 number, goes above hi or below lo */
    uint64_t top;             /* libtag's own: min(hi, peak_bytes - base),
                                 the one compare an allocation makes */
};

/* A chunk of one thread's shard: entries [first, first + TAG_SHARD_ENTRIES)
 * at address entries. */
struct libtag_shard_chunk {
    uint64_t entries;         /* address of struct libtag_stack_shard
                                 [TAG_SHARD_ENTRIES]: libtag's own memory */
    uint32_t first;           /* entry number of entries[0] */
    uint32_t tid;             /* the thread whose shard it is */
};

/* The layout is the contract: pin it. */
_Static_assert(sizeof(struct libtag_tag) == 16, "tag is 16 bytes");
_Static_assert(offsetof(struct libtag_tag, bits) == 8, "tag layout");
_Static_assert(sizeof(struct libtag_slice) == 64, "slice entry");
_Static_assert(sizeof(struct libtag_heap) == 72, "heap");
_Static_assert(sizeof(struct libtag_free_rec) == 16, "free rec");
_Static_assert(sizeof(struct libtag_stack_node) == 16, "stack node");
_Static_assert(offsetof(struct libtag_shadow, fn) == 16, "shadow layout");
_Static_assert(offsetof(struct libtag_shadow, sp) == 16 + 16 * TAG_SHADOW_MAX, "shadow layout");
_Static_assert(sizeof(struct libtag_thread) == 8 * 36, "thread record");
_Static_assert(offsetof(struct libtag_thread, regs) == 56, "thread layout");
_Static_assert(sizeof(struct libtag_qentry) == 24, "quarantine entry");
_Static_assert(sizeof(struct libtag_quarantine_ring) == TAG_QUARANTINE_BYTES,
               "quarantine ring");
_Static_assert(sizeof(struct libtag_anomaly) == 80, "anomaly record");
_Static_assert(sizeof(struct libtag_crash) == 32, "crash record");
_Static_assert(offsetof(struct libtag_control, stack_nodes) == 72, "control");
_Static_assert(offsetof(struct libtag_control, anomaly) == 160, "control");
_Static_assert(offsetof(struct libtag_control, crash) == 240, "control");
_Static_assert(offsetof(struct libtag_control, thread_state_bytes) == 272, "control");
_Static_assert(offsetof(struct libtag_control, stack_stats) == 296, "control");
_Static_assert(offsetof(struct libtag_control, guard_pool) == 304, "control");
_Static_assert(offsetof(struct libtag_control, request_signal) == 352, "control");
_Static_assert(offsetof(struct libtag_control, last) == 376, "control");
_Static_assert(offsetof(struct libtag_control, heap) == 440, "control");
_Static_assert(offsetof(struct libtag_control, dir) == 464, "control");
_Static_assert(sizeof(struct libtag_snapinfo) == 64, "snapinfo");
_Static_assert(offsetof(struct libtag_control, stack_shards) == 976, "control");
_Static_assert(sizeof(struct libtag_control) == 992, "control block");
_Static_assert(sizeof(struct libtag_stack_stats) == 32, "stack stats");
_Static_assert(sizeof(struct libtag_stack_shard) == 64, "stack shard entry");
_Static_assert(sizeof(struct libtag_shard_chunk) == 16, "shard chunk record");
_Static_assert(sizeof(struct libtag_guard_slot) == 56, "guard slot record");

#endif /* TAG_ABI_H */
