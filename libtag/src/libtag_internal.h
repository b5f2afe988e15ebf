/* libtag_internal.h - what libtag's own files share.  Nothing here is exported:
 * the library is built with -fvisibility=hidden and the shared names are
 * _tag_*.  Exported names (the malloc family, the instrumentation hooks and
 * libtag_*) are marked TAG_EXPORT where they are defined. */
#ifndef LIBTAG_INTERNAL_H
#define LIBTAG_INTERNAL_H

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

/* Internal invariants, checked in the debug build (cmake -DLIBTAG_DEBUG=ON,
 * which CI runs once); compiled out otherwise.  A failure writes one line
 * with write(2) and aborts: no stdio, no malloc. */
#ifdef LIBTAG_DEBUG
#define TAG_ASSERT(c) \
    (TAG_LIKELY(c) ? (void)0 : _tag_fatal("libtag: assertion failed: %s (%s:%d)", #c, __FILE__, __LINE__))
#else
#define TAG_ASSERT(c) ((void)0)
#endif

/* ---------------------------------------------------------- options.c */
enum tag_on_anomaly { TAG_ON_SNAPSHOT = 0, TAG_ON_ABORT = 1, TAG_ON_IGNORE = 2 };
enum tag_core_path { TAG_CORE_AUTO = 0, TAG_CORE_KERNEL = 1, TAG_CORE_SELF = 2 };

struct tag_options {
    int on_anomaly;              /* enum tag_on_anomaly */
    int core_path;               /* enum tag_core_path */
    int signal;                  /* snapshot signal, 0 = none */
    int quiet;                   /* no log lines on stderr */
    int stats;                   /* print counters at exit */
    int omit_payload;            /* LIBTAG_PAYLOAD=omit */
    uint32_t fp_depth;           /* frame-pointer fallback depth bound */
    uint32_t stack_nodes;        /* stack table capacity */
    uint64_t quarantine_bytes;   /* per-thread quarantine budget */
    uint32_t quarantine_fill;    /* payload bytes patterned when freed */
    uint32_t sweep_every;        /* hook calls between heap sweeps, 0 = off */
    char dir[512];               /* snapshot directory, "" = cwd */
};
extern struct tag_options _tag_opt;
/* Parse LIBTAG_* from the environment; a bad value is reported once and
 * libtag refuses to start (the process exits 2). No malloc. */
void _tag_options_init(void);

/* ------------------------------------------------------------- log.c */
/* Format into a stack buffer and write(2) to stderr: %s %d %u %x %p %lu %lx.
 * Async-signal-safe: no locks, no malloc, no stdio. */
void _tag_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void _tag_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Format into buf (always NUL-terminated); returns the length. */
size_t _tag_format(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---------------------------------------------------------- control.c */
extern struct libtag_control _tag_ctl;
void _tag_init(void);            /* idempotent, thread-safe */
extern int _tag_ready;           /* 1 once _tag_init finished */
static inline void _tag_ensure_init(void)
{
    if (TAG_UNLIKELY(!__atomic_load_n(&_tag_ready, __ATOMIC_ACQUIRE)))
        _tag_init();
}
uint32_t _tag_now_ms(void);      /* ms since start_mono_ns */
/* Memory of libtag's own (tables, rings), fenced by guard pages; NULL on
 * failure.  No malloc. */
void *_tag_map(size_t bytes, int noreserve);
void _tag_unmap(void *addr, size_t bytes);

/* ----------------------------------------------------------- thread.c */
struct tag_quarantine;
struct tag_tls {
    struct libtag_shadow shadow;     /* first: its address is in the record */
    struct libtag_thread *rec;       /* NULL until registered */
    uint32_t tid;
    int overflow_rec;                /* rec is shared: update with atomics */
    int exiting;                     /* quarantine drained, free directly */
    uint32_t frees;                  /* this thread's frees, for pacing */
    uint32_t entry_parent, entry_id; /* memo of the last ENTRY node */
    uint64_t entry_fn;
    /* What shadow.id[d+1] was computed from: (id[d], site[d]) at the time.
     * A depth that flips between two callees and back (an inlined helper
     * called before the allocating path) then costs a compare, not a
     * re-intern of everything above it. */
    uint32_t used_parent[TAG_SHADOW_MAX];
    uint64_t used_site[TAG_SHADOW_MAX];
    uint32_t hook_calls;             /* enters since the last sweep */
    uint32_t recent_next;
    void *recent[64];                /* TAG_SWEEP_RECENT last allocations */
    struct tag_quarantine *quarantine;
    struct { uint64_t pc; uint32_t parent_kind; uint32_t id; } cache[256];
};
extern __thread struct tag_tls _tag_tls __attribute__((tls_model("initial-exec")));
void _tag_thread_register(void);     /* first libtag use in a thread */
void _tag_threads_init(void);        /* reserve records; no malloc */
void _tag_threads_late_init(void);   /* pthread key, atfork: after libc init */
static inline struct tag_tls *_tag_self(void)
{
    struct tag_tls *t = &_tag_tls;
    if (TAG_UNLIKELY(t->rec == NULL))
        _tag_thread_register();
    return t;
}

/* ------------------------------------------------------ stack_table.c */
void _tag_stack_table_init(uint32_t capacity);
/* Intern (parent, kind, pc) and return its id.  Lock-free on hits; inserts
 * take the table lock.  Returns 0 (the root) and counts stack_full when the
 * table is full.  The caller has missed the per-thread cache entry c. */
uint32_t _tag_intern_slow(struct tag_tls *t, uint32_t parent, uint32_t kind,
                          uint64_t pc, unsigned c);

/* The per-thread cache in front of the table: a capture does several of
 * these per allocation, so the hit path is a few shifts and compares,
 * inlined (callgrind: the out-of-line version with a multiplicative hash
 * was a fifth of all instructions under allocbench). */
static inline uint32_t _tag_intern(struct tag_tls *t, uint32_t parent, uint32_t kind,
                                   uint64_t pc)
{
    unsigned c = (unsigned)((pc >> 2) ^ (pc >> 9) ^ (parent * 7u) ^ kind) & 255u;
    uint32_t pk = parent | kind << 30;  /* ids stay below 2^28 (options.c) */
    if (TAG_LIKELY(t->cache[c].pc == pc && t->cache[c].parent_kind == pk && t->cache[c].id))
        return t->cache[c].id;
    return _tag_intern_slow(t, parent, kind, pc, c);
}
void _tag_stack_table_atfork_prepare(void);
void _tag_stack_table_atfork_parent(void);
void _tag_stack_table_atfork_child(void);

/* ----------------------------------------------------- shadow_stack.c */
/* The stack of the current allocation: the shadow stack plus ret (the
 * return address into the caller of the malloc-family function) or, in a
 * thread with no instrumented frame, a frame-pointer walk from frame.
 * ret NULL (from a trace hook): the shadow stack alone. */
uint32_t _tag_capture(struct tag_tls *t, void *ret, void *frame);

/* ------------------------------------------------------------ sweep.c */
#define TAG_SWEEP_RECENT 64
void _tag_sweep_remember(struct tag_tls *t, void *user);
/* Check the recent blocks' canaries; reports heap-overflow anomalies. */
void _tag_sweep(struct tag_tls *t, void *ret, void *frame);

/* -------------------------------------------------------------- tag.c */
static inline struct libtag_tag *_tag_of(const void *user)
{
    return (struct libtag_tag *)((char *)user - sizeof(struct libtag_tag));
}
static inline uint64_t _tag_size(const struct libtag_tag *t)
{
    return t->size_state & TAG_SIZE_MASK;
}
static inline uint32_t _tag_state(const struct libtag_tag *t)
{
    return (uint32_t)(t->size_state >> TAG_STATE_SHIFT) & 0xff;
}
/* Write a live tag and canary for a block of size bytes at user. */
void _tag_write_live(void *user, size_t size, uint32_t pad, uint32_t stack,
                     uint32_t tid, uint32_t now);
/* Mark a live block's overflow as reported, so free() does not report it
 * a second time. */
void _tag_mark_reported(void *user);
static inline int _tag_reported(const struct libtag_tag *t)
{
    return (t->size_state & TAG_FLAG_REPORTED) != 0;
}
/* Is user a live/freed block of ours?  Reads only memory on user's page
 * or, when the tag straddles a page, checks the page is mapped first. */
enum tag_lookup { TAG_NOT_OURS = 0, TAG_IS_LIVE = 1, TAG_IS_FREED = 2 };
enum tag_lookup _tag_lookup(const void *user);
int _tag_canary_ok(const void *user);
/* Mark freed and write the free record + fill pattern. */
void _tag_write_freed(void *user, uint32_t stack, uint32_t tid, uint32_t now);
/* Does the freed block still hold its free record and pattern? */
int _tag_freed_intact(const void *user);

/* -------------------------------------------------------- quarantine.c */
/* Put a freed block in the calling thread's quarantine; evicts (and
 * really frees) the oldest blocks beyond the budget. */
void _tag_quarantine_put(struct tag_tls *t, void *user);
void _tag_quarantine_drain(struct tag_tls *t);
/* Hand a block back to the real allocator. */
void _tag_real_release(void *user);

/* --------------------------------------------------------- anomaly.c */
/* Record an anomaly about ptr (block = the block concerned, or NULL) and act
 * on LIBTAG_ON_ANOMALY.  Returns when the faulty operation should be
 * skipped; does not return with abort. */
void _tag_anomaly(uint32_t kind, const void *ptr, const void *block,
                  void *ret, void *frame);
/* "double-free", ... as in the snapshot directory names and the JSON. */
const char *_tag_anomaly_name(uint32_t kind);

/* -------------------------------------------------------- snapshot.c */
int _tag_snapshot(uint32_t reason);
void _tag_snapshot_init(void);       /* signal handler; after libc init */
void _tag_snapshot_reap(void);       /* collect exited snapshot children */
extern int _tag_snapshot_pending;    /* children not collected yet */
void _tag_die(int sig);              /* default action of sig, now */

/* ---------------------------------------------------------- redact.c */
/* In the snapshot child: blank every tagged block's payload (its own copy
 * of memory) so the core keeps only tags and metadata. */
void _tag_redact_payloads(void);

/* ----------------------------------------------------------- crash.c */
void _tag_crash_init(void);

/* The real allocator (glibc exports these; no dlsym bootstrap needed). */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
/* glibc's sigaction under another name: libtag's own handlers must not go
 * through the sigaction() it interposes for the program (crash.c). */
struct sigaction;
extern int __sigaction(int, const struct sigaction *, struct sigaction *);

#endif /* LIBTAG_INTERNAL_H */
