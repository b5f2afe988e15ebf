/* anomaly.c - what happens when libtag sees the program misuse the heap.
 *
 * The anomaly is recorded in the control block (kind, pointer, a copy of the
 * block's tag and free record, the detecting stack), logged in one line, and
 * then LIBTAG_ON_ANOMALY decides: snapshot (default) takes a snapshot and
 * returns so the caller skips the faulty operation, abort records and
 * aborts, ignore only records and logs.
 *
 * _tag_anomaly is called from the malloc family in the program's normal
 * context, so it interns the detecting stack itself; the guard pool's fault
 * handler unwinds the faulting context and calls _tag_anomaly_at, which is
 * async-signal-safe.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "base/options.h"
#include "base/prim.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"
#include "alloc/alloc.h"
#include "alloc/anomaly.h"
#include "alloc/tag.h"

static int anomaly_lock;

static const char *const kind_names[] = {
    [TAG_ANOMALY_NONE] = "none",
    [TAG_ANOMALY_DOUBLE_FREE] = "double-free",
    [TAG_ANOMALY_INVALID_FREE] = "invalid-free",
    [TAG_ANOMALY_HEAP_OVERFLOW] = "heap-overflow",
    [TAG_ANOMALY_USE_AFTER_FREE] = "use-after-free",
    [TAG_ANOMALY_HEAP_UNDERFLOW] = "heap-underflow",
    [TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH] = "alloc-dealloc-mismatch",
};

/* Another snapshot in progress (an on-demand one): wait for it rather than
 * lose this one; 2 s at most (nanosleep is async-signal-safe). */
static void snapshot_now(void)
{
    for (int i = 0; i < 200 && _tag_snapshot(TAG_REASON_ANOMALY) == -EBUSY; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
}

static const char *on_anomaly_name(void)
{
    return _tag_opt.on_anomaly == TAG_ON_ABORT    ? "abort"
           : _tag_opt.on_anomaly == TAG_ON_IGNORE ? "ignore"
                                                   : "snapshot";
}

const char *_tag_anomaly_name(uint32_t kind)
{
    return kind < sizeof kind_names / sizeof kind_names[0] ? kind_names[kind] : "unknown";
}

void _tag_anomaly_no_core(void)
{
    struct rlimit none = {0, 0};
    getrlimit(RLIMIT_CORE, &none);
    none.rlim_cur = 0;
    setrlimit(RLIMIT_CORE, &none);
}

void _tag_anomaly(const struct tag_report *r, void *ret, void *frame)
{
    struct tag_thread_state *t = _tag_self();
    _tag_anomaly_at(r, t ? _tag_capture(t, ret, frame) : 0);
    if (_tag_opt.on_anomaly == TAG_ON_ABORT) {
        /* One core, the snapshot's; then the process dies of SIGABRT
         * without a second core of its own. */
        _tag_anomaly_no_core();
        _tag_die(SIGABRT);
        _tag_fatal("libtag: abort did not stop the process");
    }
}

void _tag_anomaly_record(const struct tag_report *r, uint32_t tid, uint32_t stack, uint32_t time)
{
    struct libtag_anomaly *a = &_tag_ctl.anomaly;
    memset(a, 0, sizeof *a);
    a->kind = r->kind;
    a->tid = tid;
    a->address = (uint64_t)(uintptr_t)r->address;
    a->block = (uint64_t)(uintptr_t)r->block;
    a->stack = stack;
    a->time = time;
    a->dealloc = r->dealloc;
    a->access = r->access;
    a->pc = (uint64_t)(uintptr_t)r->pc;
    if (r->tag)
        a->tag = *r->tag;
    else if (r->block)
        a->tag = *_tag_of(r->block);
    if (r->rec)
        a->free_rec = *r->rec;
}

void _tag_anomaly_at(const struct tag_report *r, uint32_t stack)
{
    TAG_ASSERT(r->kind > TAG_ANOMALY_NONE && r->kind <= TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH);
    (void)_tag_self();  /* registered: its tid is known (it may have no state) */
    uint32_t tid = _tag_tls.tid;
    __atomic_fetch_add(&_tag_ctl.anomaly_count, 1, __ATOMIC_RELAXED);

    /* One anomaly at a time owns the record; a second one that races it is
     * counted and logged but does not overwrite the first. */
    int owner = !__atomic_exchange_n(&anomaly_lock, 1, __ATOMIC_ACQUIRE);
    if (owner)
        _tag_anomaly_record(r, tid, stack, _tag_now_ms());
    if (r->access)
        _tag_log("libtag: %s: %s at %p (block %p) by the instruction at %p in thread %u "
                 "(LIBTAG_ON_ANOMALY=%s)",
                 _tag_anomaly_name(r->kind), r->access == TAG_ACCESS_WRITE ? "write" : "read",
                 r->address, r->block, r->pc, tid, on_anomaly_name());
    else if (r->block && r->block != r->address)
        _tag_log("libtag: %s at %p (block %p) in thread %u (LIBTAG_ON_ANOMALY=%s)",
                 _tag_anomaly_name(r->kind), r->address, r->block, tid, on_anomaly_name());
    else
        _tag_log("libtag: %s of %p in thread %u (LIBTAG_ON_ANOMALY=%s)",
                 _tag_anomaly_name(r->kind), r->address, tid, on_anomaly_name());
    if (owner) {
        if (_tag_opt.on_anomaly != TAG_ON_IGNORE)
            snapshot_now();
        __atomic_store_n(&anomaly_lock, 0, __ATOMIC_RELEASE);
    }
}

/* A release of the live block ptr by a function expecting dealloc when it
 * was allocated otherwise: an anomaly when new_delete.c's pairing rule
 * (_tag_cxx_checked) calls it one. */
void _tag_report_mismatch(void *ptr, uint32_t dealloc, void *ret, void *frame)
{
    if (!_tag_cxx_checked(_tag_alloc_kind(_tag_of(ptr)), dealloc))
        return;
    struct tag_report r = {
        .kind = TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH,
        .dealloc = dealloc,
        .address = ptr,
        .block = ptr,
    };
    _tag_anomaly(&r, ret, frame);
}
