/* libtag_internal.h - what libtag's own files share: the internal API,
 * by the file that defines it, with the hot paths' inline bodies (tag
 * checks, the shadow stack's record and calling context),
 * so each stays one inline body in its caller.  Every .c includes just
 * this; it brings in the types (tag_types.h), the primitives (tag_prim.h)
 * and the heap's interface (heap.h).  Nothing here is exported:
 * the library is built with -fvisibility=hidden and the shared names are
 * _tag_*.  Exported names (the malloc family, the instrumentation hooks and
 * libtag_*) are marked TAG_EXPORT where they are defined. */
#ifndef LIBTAG_INTERNAL_H
#define LIBTAG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <emmintrin.h>  /* SSE2: the free pattern (tag.c section) */
#include "stacks/thread.h"
#include "base/prim.h"

/* ---------------------------------------------------------- options.c */
extern struct tag_options _tag_opt;
/* Parse LIBTAG_* from the environment; a bad value is reported once and
 * libtag refuses to start (the process exits 2). No malloc. */
TAG_COLD void _tag_options_init(void);

/* ------------------------------------------------------------- log.c */
/* Format into a stack buffer and write(2) it where LIBTAG_LOG says:
 * %s %d %u %x %p %lu %lx.  Async-signal-safe: no locks, no malloc, no stdio.
 * _tag_log_always also writes under LIBTAG_QUIET=1 (the stats line) and,
 * like _tag_fatal, to stderr under LIBTAG_LOG=off (a bad option). */
TAG_COLD void _tag_log_init(void);  /* note what fd 2 is; after the options */
/* fds.c: the program is about to close or replace descriptor fd (log.c
 * keeps a duplicate of fd 2 if it still is the stderr of the start). */
void _tag_log_keep_fd(int fd);
void _tag_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void _tag_log_always(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void _tag_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Format into buf (always NUL-terminated); returns the length. */
size_t _tag_format(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---------------------------------------------------------- control.c */
extern struct libtag_control _tag_ctl;
TAG_COLD void _tag_init(void);   /* idempotent, thread-safe */
extern int _tag_ready;           /* 1 once _tag_init finished */
static inline void _tag_ensure_init(void)
{
    if (TAG_UNLIKELY(!__atomic_load_n(&_tag_ready, __ATOMIC_ACQUIRE)))
        _tag_init();
}
/* ms since start_mono_ns: on every allocation and free, so inline (the
 * clock is the vDSO's, no system call, called directly when control.c
 * found it).  Exact to the coarse clock's tick: a cached value refreshed
 * every N operations would save the call but stamp the first operations
 * after a thread sleeps with the time before it, by as long as it slept. */
extern int (*_tag_vdso_gettime)(clockid_t, struct timespec *);
TAG_INLINE uint32_t _tag_now_ms(void)
{
    struct timespec ts;
    int (*f)(clockid_t, struct timespec *) = _tag_vdso_gettime;
    if (TAG_LIKELY(f != NULL))
        f(CLOCK_MONOTONIC_COARSE, &ts);
    else
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return (uint32_t)((ns - _tag_ctl.start_mono_ns) / 1000000u);
}

/* ------------------------------------------------------------- heap.c */
/* A header of its own: a program can use the heap alone (heap.h). */
#include "heap/heap.h"

/* ----------------------------------------------------------- thread.c */
extern __thread struct tag_tls_ref _tag_tls __attribute__((tls_model("initial-exec")));
extern union tag_tls_none _tag_tls_none_pages;
#define _tag_tls_none (_tag_tls_none_pages.t)
/* First libtag use in a thread: map its state and take a record.  Returns
 * the state, or NULL when the thread has none (its mapping failed, or it
 * is past its exit hook): then the caller works without one (a stack id 0,
 * no quarantine); _tag_tls.tid is set either way. */
TAG_COLD struct tag_thread_state *_tag_thread_register(void);
TAG_COLD void _tag_threads_init(void);       /* reserve records; no malloc */
TAG_COLD void _tag_threads_late_init(void);  /* pthread key, atfork: after libc init */
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

/* -------------------------------------------------------- interpose.c */
/* The malloc family's bodies, shared with the C++ operators (new_delete.c):
 * allocate as kind (enum libtag_alloc_kind); release a block the way
 * dealloc (the same numbers) expects; align as glibc's memalign. */
void *_tag_alloc(size_t size, size_t align, int zero, uint32_t kind, void *ret, void *frame);
void *_tag_memalign(size_t align, size_t size, uint32_t kind, void *ret, void *frame);
void _tag_free(void *ptr, uint32_t dealloc, void *ret, void *frame);

/* ------------------------------------------------------- new_delete.c */
/* Is a release of a block made as alloc_kind by a function expecting
 * dealloc one libtag can call a mismatch?  (Not when the program replaces
 * operator new or delete itself.) */
TAG_COLD int _tag_cxx_checked(uint32_t alloc_kind, uint32_t dealloc);

/* ------------------------------------------------------ stack_table.c */
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
TAG_INLINE void _tag_stat_add(uint64_t *p, uint64_t v)
{
    __asm__ volatile("addq %1, %0" : "+m"(*p) : "er"(v));
}
TAG_INLINE void _tag_stat_sub(uint64_t *p, uint64_t v)
{
    __asm__ volatile("subq %1, %0" : "+m"(*p) : "er"(v));
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

/* ---------------------------------------------------------- modules.c */
void _tag_modules_init(void);    /* constructor: the first scan */
void _tag_modules_allow(void);   /* start-up: scans from now on */
void _tag_modules_atfork_child(void);
/* Copy the module holding pc to *out; 0 if none.  may_rescan (normal
 * context only): rescan with dl_iterate_phdr when pc is in no known one. */
int _tag_module_find(uintptr_t pc, struct tag_module *out, int may_rescan);
/* Bracket reads of module memory (code bytes, CFI) so that dlclose() waits
 * for them; 0 = a dlclose is under way, read nothing. */
int _tag_modules_enter(void);
void _tag_modules_leave(void);
extern uint32_t _tag_code_gen;   /* bumped whenever the module list changes */

/* -------------------------------------------------------------- cfi.c */
/* The rule for code address addr (a return address minus 1, or an exact
 * pc) from the module's CFI: TAG_RULE_CFA, _END or _FP.  Async-signal-safe;
 * call inside _tag_modules_enter/_leave. */
uint64_t _tag_cfi_rule(const struct tag_module *m, uintptr_t addr);

/* ----------------------------------------------------------- unwind.c */
/* The stack of the current allocation.  ret: the return address into the
 * caller of libtag's entry point, frame: that entry point's frame (built
 * with frame pointers: frame[0] = the caller's rbp, frame[1] = ret).  ret
 * NULL (from a trace hook): frame is the hook's.  LIBTAG_UNWIND chooses
 * the shadow stack, a frame-pointer walk or a CFI walk.  Normal context. */
uint32_t _tag_capture(struct tag_thread_state *t, void *ret, void *frame);
/* The frames of the interrupted code of a signal handler's ucontext
 * (the first is its exact pc, TAG_FRAME_SIGNAL), innermost first: uses the
 * module list and rules already known, no locks, no malloc, no
 * dl_iterate_phdr: async-signal-safe.  Returns the frame count. */
struct ucontext_t;
uint32_t _tag_unwind_uc(struct tag_thread_state *t, const struct ucontext_t *uc,
                        uint64_t *pcs, uint32_t *kinds, uint32_t max);
/* The same, interned (_tag_intern_signal): 0 when the table is busy. */
uint32_t _tag_capture_uc(struct tag_thread_state *t, const struct ucontext_t *uc);
/* The CFA of the instrumented function whose enter hook returns to ra;
 * c: its stack pointer at the hook call, rbp: its rbp, site: its return
 * address (what the CFA - 8 slot holds).  Bit 0 set: a lower bound only
 * (no rule, and site not found near c).  Fills t->hook_cache with the
 * offset from c of a CFA it found by rule (hooks.c). */
uint64_t _tag_hook_cfa(struct tag_thread_state *t, uintptr_t ra, uintptr_t c, uintptr_t rbp,
                       uintptr_t site);
/* Resolve shadow entry i (shadow_stack.c): its CFA into shadow.sp[i], from
 * what its enter hook saw (hook_sp, hook_ra, hook_bp) - the hook cache, else the
 * CFI rule, which fills the cache.  Reads only the stack the hook ran on,
 * from cur (a stack pointer of running code) up, or the alternate signal
 * stack; elsewhere the lower bound stays.  A frame that is gone gets its
 * CFA by rule, whose slot no longer holds the site.  Returns sp[i]. */
uint64_t _tag_shadow_resolve(struct tag_thread_state *t, uint32_t i, uint64_t cur);
/* Shadow entry i's CFA failed its slot: find it again from the CFI rule
 * and the rbp its enter hook saw last (a function that realigns its stack
 * has the same stack pointer at the hook for CFAs a few bytes apart, and
 * the enter keeps the CFA a capture found for the same stack pointer).  1
 * and sp[i] updated if the slot there holds the site: alive after all.
 * Reads as _tag_shadow_resolve. */
int _tag_shadow_recheck(struct tag_thread_state *t, uint32_t i, uint64_t cur);
/* Drop every cached rule (dlclose). */
void _tag_unwind_flush(void);
/* Forget the thread's kept walks: the bounds of its stacks changed
 * (sigaltstack, the fork child).  Normal context of the thread. */
void _tag_unwind_forget(struct tag_thread_state *t);
/* Bring t->captures and capture_frames up to date (the fast check counts
 * its hits per walk).  The thread's own normal context. */
void _tag_unwind_settle(struct tag_thread_state *t);
extern uint64_t _tag_capture_total, _tag_capture_frames_total;

/* ----------------------------------------------------- shadow_stack.c */
/* Pop the shadow entries whose frames are gone (longjmp, exceptions) as
 * seen from cur: the stack pointer of running code (fn 0), or the CFA of
 * function fn being entered from site.  Returns the new depth. */
uint32_t _tag_shadow_pop(struct tag_thread_state *t, uint64_t cur, uint64_t fn, uint64_t site);
/* Before a capture from stack pointer cur uses the shadow stack: the
 * entries recorded since the last capture (from valid - 1 up) have their
 * CFAs and are alive, or the dead ones are dropped (shadow_stack.c). */
void _tag_shadow_settle_slow(struct tag_thread_state *t, uint64_t cur);
TAG_INLINE void _tag_shadow_settle(struct tag_thread_state *t, uint64_t cur)
{
    uint32_t d = t->shadow.depth;
    if (t->cc_valid < d && d - 1u < TAG_SHADOW_MAX)  /* 1 <= d <= max */
        _tag_shadow_settle_slow(t, cur);
}
/* The calling context one site deeper: cc[d + 1] of cc[d] and site[d].
 * One rotate, xor and multiply. */
TAG_INLINE uint64_t _tag_cc_step(uint64_t cc, uint64_t site)
{
    return (((cc << 23) | (cc >> 41)) ^ site) * TAG_CC_MIX;
}
/* The calling context of the outer d frames (d <= min(depth, max)), the
 * entries alive: hashes the sites from cc_valid up, raises cc_valid to d.
 * One step a site pushed since the last capture. */
TAG_INLINE uint64_t _tag_shadow_cc(struct tag_thread_state *t, uint32_t d)
{
    uint32_t i = t->cc_valid;
    if (TAG_LIKELY(i >= d))
        return t->cc[d];
    /* the prefix ids changed from i up too (see _tag_shadow_record) */
    if (t->shadow.valid > i)
        t->shadow.valid = i;
    uint64_t cc = t->cc[i];
    for (; i < d; i++) {
        cc = _tag_cc_step(cc, t->shadow.site[i]);
        t->cc[i + 1] = cc;
    }
    t->cc_valid = d;
    return cc;
}
/* Record function fn at depth d < TAG_SHADOW_MAX, entered from site, as
 * its enter hook saw it: the hook's CFA c (the function's stack pointer at
 * the call), the hook's return address ra (its rbp is the caller's to store: the
 * enter hook stores it at every call); sp: its CFA
 * where known, else the lower bound (c + 8) | 1 for a capture to resolve
 * (_tag_shadow_resolve).  A changed entry lowers cc_valid: the next
 * capture resolves and hashes it, checks that the entry below it is alive
 * (_tag_shadow_settle), and lowers shadow.valid to it before raising
 * cc_valid (_tag_shadow_cc): the ids are valid up to min(shadow.valid,
 * cc_valid), one compare here.  The enter hook calls this only when the
 * site, c or ra changed: the same three give the same function and CFA,
 * so an unchanged entry keeps what a capture found, and a loop that calls
 * the same chain again captures for free. */
TAG_INLINE void _tag_shadow_record(struct tag_thread_state *t, uint32_t d, uint64_t fn, uint64_t site,
                                   uint64_t c, uint64_t ra, uint64_t sp)
{
    t->shadow.fn[d] = fn;
    t->shadow.site[d] = site;
    t->shadow.sp[d] = sp;
    t->hook_sp[d] = c;
    t->hook_ra[d] = ra;
    if (t->cc_valid > d)
        t->cc_valid = d;
}
/* Entry i is function fn, whose exit hook was reached by a tail jump past
 * its epilogue so that the hook's CFA c is fn's own: entered from site,
 * which the slot below c holds (fn's return address), inside an entry
 * entered at or above c (hook_sp_outer for i = 0).  The exit hook asks it
 * of the innermost entry, _tag_exit_slow of each below dead ones. */
TAG_INLINE int _tag_shadow_tail(const struct tag_thread_state *t, uint64_t i, uint64_t fn, uint64_t site,
                                uint64_t c)
{
    return t->shadow.site[i] == site && t->shadow.fn[i] == fn && ((const uint64_t *)c)[-1] == site &&
           (&t->hook_sp_outer)[i] >= c;
}
/* Entry i (> 0), its CFA e, lies inside entry i - 1, whose CFA is outer
 * (bit 0 cleared from both): below it, or at it for another function (the
 * host of an inlined one).  Lower bounds compare as they are: the enter
 * hook's CFA + 8 is below the function's CFA, and above that of every
 * function it calls. */
TAG_INLINE int _tag_shadow_inside(const struct tag_thread_state *t, uint32_t i, uint64_t e, uint64_t outer)
{
    return e < outer || (e == outer && t->shadow.fn[i] != t->shadow.fn[i - 1]);
}
/* Enter hooks between two sweeps: LIBTAG_SWEEP, or never. */
TAG_INLINE int32_t _tag_hook_period(void)
{
    return _tag_opt.sweep_every ? (int32_t)_tag_opt.sweep_every : INT32_MAX;
}
/* The hooks' rare paths, reached from hooks.c by a tail jump (see there):
 * an enter or exit its fast path does not finish, and the hook tick (the
 * thread's first hook, a sweep due). */
void _tag_enter_slow(uint64_t fn, uint64_t site, struct tag_thread_state *t);
void _tag_exit_slow(uint64_t fn, struct tag_thread_state *t, uint64_t c, uint64_t site);
void _tag_hook_tick(struct tag_thread_state *t);
/* The interned shadow stack with the innermost function's ENTRY node;
 * depth > 0. */
uint32_t _tag_shadow_id(struct tag_thread_state *t);
/* The interned id of the shadow stack's outer d frames (CALL nodes of
 * site[0..d-1]), d <= min(depth, TAG_SHADOW_MAX): id[d], interning the
 * depths from min(valid, cc_valid) up first. */
uint32_t _tag_shadow_prefix_slow(struct tag_thread_state *t, uint32_t d);
TAG_INLINE uint32_t _tag_shadow_prefix(struct tag_thread_state *t, uint32_t d)
{
    return TAG_LIKELY(t->shadow.valid >= d && t->cc_valid >= d) ? t->shadow.id[d]
                                                                : _tag_shadow_prefix_slow(t, d);
}

/* ------------------------------------------------------------ sweep.c */
void _tag_sweep_remember(struct tag_thread_state *t, void *user);
/* Check the recent blocks' tags and canaries; reports heap-overflow and
 * heap-underflow anomalies. */
TAG_COLD void _tag_sweep(struct tag_thread_state *t, void *ret, void *frame);

/* -------------------------------------------------------------- tag.c */
static inline struct libtag_tag *_tag_of(const void *user)
{
    return (struct libtag_tag *)((char *)user - sizeof(struct libtag_tag));
}
/* The size of a block of a large span whose tag says TAG_SIZE_BIG (tag.c). */
uint64_t _tag_big_size(uint64_t tag_addr);
/* The requested size of the block whose tag, or a copy of it t, is at
 * tag_addr. */
TAG_INLINE uint64_t _tag_size_at(uint64_t tag_addr, const struct libtag_tag *t)
{
    uint32_t f = tag_size_field(t);
    return TAG_LIKELY(f != TAG_SIZE_BIG) ? f : _tag_big_size(tag_addr);
}
TAG_INLINE uint64_t _tag_size(const struct libtag_tag *t)
{
    return _tag_size_at((uint64_t)(uintptr_t)t, t);
}
static inline uint32_t _tag_state(const struct libtag_tag *t)
{
    return tag_state_of(t);
}
static inline uint32_t _tag_alloc_kind(const struct libtag_tag *t)
{
    return tag_kind_of(t);
}
/* Store a tag: stack and time first, the bits word (with its check) last,
 * so a reader that stops the thread between the stores sees the old bits
 * (0 in a free slot: no block) or the whole new tag. */
TAG_INLINE void _tag_store(struct libtag_tag *t, uint64_t bits, uint32_t stack, uint32_t now)
{
    uint64_t w0 = (uint64_t)now << 32 | stack;
    memcpy(t, &w0, sizeof w0);
    /* from the values, not the fields just stored: a load of fields just
     * stored waits for the stores (perf: 17 % of the quarantine's time sat
     * on such a load once) */
    t->bits = bits | tag_check_words((uint64_t)(uintptr_t)t, _tag_ctl.secret, bits, w0);
}
/* The large-size and forward-record halves of _tag_write_live (tag.c). */
TAG_COLD void _tag_write_big(uint64_t tag_addr, uint64_t size);
TAG_COLD void _tag_write_forward(uint64_t tag_addr, uint32_t pad);
/* Write a live tag and canary for a block of size bytes at user, allocated
 * as kind (enum libtag_alloc_kind); pad: bytes from its slot's start to
 * the tag (0, or an aligned block's).  Inline: once per allocation. */
TAG_INLINE void _tag_write_live(void *user, size_t size, uint32_t pad, uint32_t stack,
                                uint32_t tid, uint32_t now, uint32_t kind)
{
    struct libtag_tag *t = _tag_of(user);
    uint64_t addr = (uint64_t)(uintptr_t)t;
    TAG_ASSERT(((uintptr_t)user & 15) == 0 && kind <= TAG_ALLOC_NEW_ARRAY_ALIGNED);
    if (TAG_UNLIKELY(size >= TAG_SIZE_BIG))
        _tag_write_big(addr, size);
    /* the canary first: a snapshot that stops this thread between the two
     * sees no block yet, or the block whole (a tag without its canary
     * would read as an overflow) */
    uint64_t canary = tag_canary_value(addr, _tag_ctl.secret);
    memcpy((char *)user + size, &canary, sizeof canary);
    __atomic_signal_fence(__ATOMIC_RELEASE);
    _tag_store(t, tag_bits(tid, size, TAG_STATE_LIVE, kind), stack, now);
    TAG_ASSERT(tag_check_of(t) == tag_check_value(addr, _tag_ctl.secret, t));
    /* an aligned block's forward record last, at its slot's start: before
     * the tag it points at is whole, a reader following it would find the
     * slot's old bytes there, a tag written over */
    if (TAG_UNLIKELY(pad != 0)) {
        __atomic_signal_fence(__ATOMIC_RELEASE);
        _tag_write_forward(addr, pad);
    }
}
/* Set bits of the tag's bits word (TAG_FLAG_REPORTED, an alloc kind) and
 * keep the check value in step. */
void _tag_set_bits(void *user, uint64_t clear, uint64_t set);
static inline int _tag_reported(const struct libtag_tag *t)
{
    return (t->bits & TAG_FLAG_REPORTED) != 0;
}
/* Does a tag at tag_addr validate (a block's state, its check)? */
TAG_INLINE int _tag_valid_at(uint64_t tag_addr, const struct libtag_tag *t)
{
    uint32_t state = _tag_state(t);
    return (state == TAG_STATE_LIVE || state == TAG_STATE_FREED) &&
           tag_check_of(t) == tag_check_value(tag_addr, _tag_ctl.secret, t);
}
/* The slot start of the heap block whose tag is at tag_addr, in span s
 * (heap.c's arithmetic: its class's reciprocal), or 0 when s holds no
 * blocks. */
TAG_INLINE uint64_t _tag_slot_in(const struct tag_slice *s, uint64_t tag_addr)
{
    uint64_t start = (uint64_t)(uintptr_t)_tag_heap_span_start(s);
    if (TAG_LIKELY(s->kind == TAG_SPAN_SMALL)) {
        uint32_t off = (uint32_t)(tag_addr - start);
        uint64_t q = (uint64_t)(((unsigned __int128)_tag_heap_div[s->cls] * off) >> 64);
        return start + q * s->block_size;
    }
    return s->kind == TAG_SPAN_LARGE ? start + s->block_off : 0;
}
TAG_INLINE uint64_t _tag_slot_of(uint64_t tag_addr)
{
    return _tag_slot_in(_tag_heap_span((const void *)(uintptr_t)tag_addr), tag_addr);
}
/* Where the tag of the block in the slot [slot, end) is: slot itself, or
 * where its forward record points; 0 for a forward record that does not
 * validate or points past end.  The tag there is the caller's to validate
 * (tag.c). */
uint64_t _tag_slot_tag(uint64_t slot, uint64_t end);
/* Is the tag at tag_addr where its slot says a tag is: at the slot's start,
 * or where the slot's forward record points?  The exact-free half of
 * _tag_lookup (the check value is the other). */
TAG_COLD int _tag_forward_ok(uint64_t slot, uint64_t tag_addr);
TAG_INLINE int _tag_in_place(uint64_t tag_addr)
{
    uint32_t off;
    const struct tag_slice *s = _tag_heap_span_off((const void *)(uintptr_t)tag_addr, &off);
    if (TAG_LIKELY(_tag_small_slot_start(s, off)))
        return 1;
    uint64_t slot = _tag_slot_in(s, tag_addr);
    return slot == tag_addr || _tag_forward_ok(slot, tag_addr);
}
/* Is user a live/freed block of ours?  Its tag must lie in the heap's
 * used region, at its slot's start (arithmetic on the address: that memory
 * is always mapped), and validate there.  Inline: every free() and
 * realloc() starts here. */
TAG_INLINE enum tag_lookup _tag_lookup(const void *user)
{
    const struct libtag_tag *t = _tag_of(user);
    uintptr_t u = (uintptr_t)user;
    uint64_t used = __atomic_load_n(&_tag_heap.used, __ATOMIC_RELAXED) * TAG_HEAP_SLICE;
    uint64_t off = (uint64_t)(u - _tag_heap.base);
    if ((u & 15) != 0 || off < sizeof *t || off > used)
        return TAG_NOT_OURS;
    uint64_t tag_addr = (uint64_t)u - sizeof *t;
    if (!_tag_valid_at(tag_addr, t) || !_tag_in_place(tag_addr))
        return TAG_NOT_OURS;
    return _tag_state(t) == TAG_STATE_LIVE ? TAG_IS_LIVE : TAG_IS_FREED;
}
/* ------------------------------------------------------------ attach.c */
extern int _tag_attached;  /* libtag_attach() ran: glibc's old blocks live on */
extern int _tag_late;      /* loaded after start (dlopen): not interposing by itself */
/* A block glibc handed out before the attach: a pointer outside libtag's
 * heap region once attached (never a guess from the bytes in front of it).
 * Only tested where a pointer failed libtag's own checks. */
TAG_INLINE int _tag_foreign(const void *p)
{
    return TAG_UNLIKELY(__atomic_load_n(&_tag_attached, __ATOMIC_RELAXED)) &&
           (uint64_t)((uintptr_t)p - _tag_heap.base) >= _tag_heap.slices_max * TAG_HEAP_SLICE;
}
TAG_COLD int _tag_signal_free(int sig);  /* snapshot.c: libtag may take sig */
TAG_COLD void _tag_foreign_free(void *p);
TAG_COLD void *_tag_foreign_realloc(void *p, size_t n);
TAG_COLD size_t _tag_foreign_usable(const void *p);
/* interpose.c's entry points by hidden names: their own addresses, which
 * attach.c writes into GOTs and control.c compares with what the process
 * calls malloc to learn whether libtag was preloaded */
void *_tag_malloc_self(size_t);
void _tag_free_self(void *);
void *_tag_calloc_self(size_t, size_t);
void *_tag_realloc_self(void *, size_t);
void *_tag_reallocarray_self(void *, size_t, size_t);
void *_tag_memalign_self(size_t, size_t);
void *_tag_aligned_alloc_self(size_t, size_t);
int _tag_posix_memalign_self(void **, size_t, size_t);
void *_tag_valloc_self(size_t);
void *_tag_pvalloc_self(size_t);
size_t _tag_malloc_usable_size_self(void *);
struct sigaction;
int _tag_sigaction_self(int, const struct sigaction *, struct sigaction *);
void (*_tag_signal_self(int, void (*)(int)))(int);
/* Does a live block's canary hold its value?  Inline, as _tag_lookup. */
TAG_INLINE int _tag_canary_ok(const void *user)
{
    const struct libtag_tag *t = _tag_of(user);
    uint64_t want = tag_canary_value((uint64_t)(uintptr_t)t, _tag_ctl.secret);
    uint64_t have;
    memcpy(&have, (const char *)user + _tag_size(t), sizeof have);
    return have == want;
}
/* The first damaged byte of a live block's canary, as an offset from the
 * canary's start (0..7); the canary must be known to be bad. */
unsigned _tag_canary_damage(const void *user);
/* The free pattern, written and checked with AVX2 where the CPU has it
 * (tag.c: 8 stores or 8 compares for a 256-byte fill, no setup)
 * and inline SSE2 (x86_64's baseline) otherwise or for the short ones: a
 * call to memset and one to memcmp against a page of the pattern cost more
 * (the call, its setup and the length dispatch).  p is 16-aligned
 * (a user pointer); any n works. */
/* tag.c, set once at start: the shortest fill or check done with AVX2 -
 * 32, or SIZE_MAX on a CPU without it (one compare on every fill and
 * check, where n >= 32 and a flag were two) */
extern size_t _tag_avx2_from;
TAG_COLD void _tag_pattern_init(void);
void _tag_pattern_fill_avx2(void *p, size_t n);            /* n >= 32 */
size_t _tag_pattern_damage_avx2(const void *p, size_t n);  /* n >= 32 */
TAG_INLINE void _tag_pattern_fill(void *p, size_t n)
{
    char *c = (char *)p;
    if (TAG_LIKELY(n >= _tag_avx2_from)) {
        _tag_pattern_fill_avx2(p, n);
        return;
    }
    if (TAG_LIKELY(n >= 16)) {
        const __m128i v = _mm_set1_epi8((char)TAG_FREE_PATTERN);
        size_t i = 0;
        for (; i + 16 <= n; i += 16)
            _mm_store_si128((__m128i *)(c + i), v);
        if (i < n)  /* the last 16 bytes, overlapping */
            _mm_storeu_si128((__m128i *)(c + n - 16), v);
        return;
    }
    uint64_t w = TAG_PATTERN64;
    if (n >= 8) {
        memcpy(c, &w, 8);
        memcpy(c + n - 8, &w, 8);
    } else if (n >= 4) {
        memcpy(c, &w, 4);
        memcpy(c + n - 4, &w, 4);
    } else {
        for (size_t i = 0; i < n; i++)
            c[i] = (char)TAG_FREE_PATTERN;
    }
}
/* The offset of the first byte of p[0..n) that is not TAG_FREE_PATTERN,
 * or TAG_INTACT. */
TAG_COLD size_t _tag_pattern_first_bad(const void *p, size_t n);
TAG_INLINE size_t _tag_pattern_damage(const void *p, size_t n)
{
    const char *c = (const char *)p;
    if (TAG_LIKELY(n >= _tag_avx2_from))
        return _tag_pattern_damage_avx2(p, n);
    if (TAG_LIKELY(n >= 16)) {
        const __m128i v = _mm_set1_epi8((char)TAG_FREE_PATTERN);
        __m128i a = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(c + n - 16)), v);
        for (size_t i = 0; i + 16 <= n; i += 16)
            a = _mm_and_si128(a, _mm_cmpeq_epi8(_mm_load_si128((const __m128i *)(c + i)), v));
        if (TAG_LIKELY(_mm_movemask_epi8(a) == 0xffff))
            return TAG_INTACT;
    } else {
        uint64_t x, y;
        if (n >= 8) {
            memcpy(&x, c, 8);
            memcpy(&y, c + n - 8, 8);
            if (TAG_LIKELY(((x ^ TAG_PATTERN64) | (y ^ TAG_PATTERN64)) == 0))
                return TAG_INTACT;
        } else if (n >= 4) {
            uint32_t u, w;
            memcpy(&u, c, 4);
            memcpy(&w, c + n - 4, 4);
            if (TAG_LIKELY(((u ^ (uint32_t)TAG_PATTERN64) | (w ^ (uint32_t)TAG_PATTERN64)) == 0))
                return TAG_INTACT;
        } else {
            size_t i = 0;
            while (i < n && (unsigned char)c[i] == TAG_FREE_PATTERN)
                i++;
            if (i == n)
                return TAG_INTACT;
        }
    }
    return _tag_pattern_first_bad(p, n);
}
/* Bytes of a freed block of size bytes whose payload holds TAG_FREE_PATTERN. */
TAG_INLINE size_t _tag_fill_len(uint64_t size)
{
    return size < _tag_opt.quarantine_fill ? (size_t)size : _tag_opt.quarantine_fill;
}
/* Mark freed and pattern the payload (the free record goes to the ring);
 * size: the block's, as its tag says.  free() marks the tag before the
 * block can be reused by anyone, so a reader never sees a freed block that
 * still claims to be live.  The whole payload up to the fill cap gets the
 * pattern: the free record is kept in the quarantine ring, so the first
 * bytes of an object - a refcount, a vtable pointer, a next pointer, what a
 * dangling pointer writes first - are watched like the rest. */
TAG_INLINE void _tag_write_freed(void *user, uint64_t size)
{
    struct libtag_tag *t = _tag_of(user);
    _tag_pattern_fill(user, _tag_fill_len(size));
    uint64_t bits = (t->bits & ~(TAG_CHECK_MASK | (uint64_t)TAG_STATE_MASK << TAG_STATE_SHIFT)) |
                    (uint64_t)TAG_STATE_FREED << TAG_STATE_SHIFT;
    t->bits = bits | tag_check_words((uint64_t)(uintptr_t)t, _tag_ctl.secret, bits,
                                     tag_stack_time(t));
}
/* The offset of the first byte of a freed block's patterned payload that
 * no longer holds TAG_FREE_PATTERN, or TAG_INTACT.  The tag must be valid;
 * size is the block's.  Async-signal-safe (the snapshot child checks every
 * ring with it). */
TAG_INLINE size_t _tag_freed_damage(const void *user, uint64_t size)
{
    return _tag_pattern_damage(user, _tag_fill_len(size));
}

/* ---------------------------------------------------------- damage.c */
/* Undo damage to the last bytes of a tag (an underflow of up to 4 bytes hits
 * only pad, which is 0 or an alignment minus 32): on success *t is the
 * original tag and 1 is returned; otherwise *t is unchanged. */
TAG_COLD int _tag_recover(uint64_t tag_addr, struct libtag_tag *t);
/* A pointer whose tag does not validate reached free(), realloc(), or the
 * end of the quarantine: find what damaged the tag and report it - an
 * overflow of the block before (once: not again if it was reported), or an
 * underflow of this one - or say nothing explains it.  rec: its free record
 * when it is known to be a quarantined block, else NULL.  Reports, never
 * leaks: the caller keeps the chunk from glibc.  Rare path. */
TAG_COLD enum tag_damage _tag_damaged(void *user, const struct libtag_free_rec *rec,
                                      void *ret, void *frame);
/* Count a chunk deliberately never handed back to the real allocator. */
TAG_COLD void _tag_leak_damaged(uint64_t bytes);

/* -------------------------------------------------------- quarantine.c */
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

/* --------------------------------------------------------- anomaly.c */
/* Record an anomaly and act on LIBTAG_ON_ANOMALY.  Returns when the faulty
 * operation should be skipped; does not return with abort. */
TAG_COLD void _tag_anomaly(const struct tag_report *r, void *ret, void *frame);
/* Record an anomaly detected at stack, log it, and take the snapshot that
 * LIBTAG_ON_ANOMALY=snapshot or abort asks for; returns in every mode (the
 * caller acts on abort).  Async-signal-safe: a fault handler calls it. */
TAG_COLD void _tag_anomaly_at(const struct tag_report *r, uint32_t stack);
/* Fill the control block's anomaly record from r (the one writer of it:
 * the caller owns the record - the anomaly lock, or the stopped world of a
 * snapshot). */
TAG_COLD void _tag_anomaly_record(const struct tag_report *r, uint32_t tid, uint32_t stack,
                                  uint32_t time);
/* The process is about to die of LIBTAG_ON_ANOMALY=abort after its
 * snapshot: no second core (the soft core limit of this process goes to
 * 0).  Async-signal-safe. */
void _tag_anomaly_no_core(void);
/* "double-free", ... as in the snapshot directory names and the JSON. */
const char *_tag_anomaly_name(uint32_t kind);
/* Report the release of the live block ptr by a function expecting dealloc,
 * when _tag_cxx_checked calls it a mismatch. */
TAG_COLD void _tag_report_mismatch(void *ptr, uint32_t dealloc, void *ret, void *frame);

/* -------------------------------------------------------- snapshot.c */
TAG_COLD int _tag_snapshot(uint32_t reason);
TAG_COLD void _tag_snapshot_init(void);   /* signal handler; after libc init */
TAG_COLD void _tag_snapshot_signal_taken(int sig); /* the program's now */
/* The exit snapshot (LIBTAG_AT_EXIT=snapshot), from libtag's destructor:
 * returns once its core is written, so it is complete when the process is
 * gone. */
TAG_COLD void _tag_snapshot_at_exit(void);
TAG_COLD void _tag_snapshot_reap(void);   /* collect exited snapshot children */
extern int _tag_snapshot_pending;         /* children not collected yet */
/* The crash hook, with LIBTAG_DIR set: make the crash core land in a new
 * snapshot directory.  Async-signal-safe; 0 or -errno. */
TAG_COLD int _tag_crash_dir(void);

/* ---------------------------------------------------------- redact.c */
/* In the snapshot child: blank every tagged block's payload (its own copy
 * of memory) so the core keeps only tags and metadata. */
TAG_COLD void _tag_redact_payloads(void);

/* ----------------------------------------------------------- guard.c */
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
/* blocks guarded so far by the sample and as their stack's first */
void _tag_guard_kinds(uint64_t *sampled, uint64_t *sites);
uint32_t _tag_guard_mappings(void); /* the pool's mappings now */
void _tag_guard_atfork_prepare(void);
void _tag_guard_atfork_parent(void);
void _tag_guard_atfork_child(void);

/* ----------------------------------------------------------- crash.c */
TAG_COLD void _tag_crash_init(void);

#endif /* LIBTAG_INTERNAL_H */
