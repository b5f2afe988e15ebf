/* thread.c - per-thread state and the thread records a reader finds.
 *
 * Each thread that allocates or enters an instrumented function owns a
 * record in an array libtag maps itself; records are never reused, so the
 * counters of threads that exited stay in the totals and a reader can sum
 * them without any lock.  The thread's own counters are written only by
 * that thread: no shared cache line on the malloc fast path.
 */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "alloc/tag.h"

/* Whole pages: the debug build makes them read-only (_tag_threads_init),
 * so a path that writes a thread's state before registering it faults in
 * the tests. */
union tag_tls_none _tag_tls_none_pages __attribute__((aligned(TAG_PAGE_SIZE)));
__thread struct tag_tls_ref _tag_tls __attribute__((tls_model("initial-exec"))) = {
    .t = &_tag_tls_none,
};

#define THREAD_CAPACITY 16384u

static struct libtag_thread *records;
/* The shared record of threads beyond THREAD_CAPACITY: atomics only. */
static struct libtag_thread overflow_record;
static pthread_key_t exit_key;
static int exit_key_ready;

extern void *__libc_stack_end;

void _tag_threads_init(void)
{
    size_t bytes = (size_t)THREAD_CAPACITY * sizeof *records;
    records = _tag_map(bytes, 1);
    if (records == NULL)
        _tag_fatal("libtag: cannot reserve %lu bytes for thread records",
                   (unsigned long)bytes);
    _tag_ctl.threads = (uint64_t)(uintptr_t)records;
    _tag_ctl.thread_capacity = THREAD_CAPACITY;
#ifdef LIBTAG_DEBUG
    mprotect(&_tag_tls_none_pages, sizeof _tag_tls_none_pages, PROT_READ);
#endif
}

/* Last checks of the thread's blocks: the damage of its recent allocations
 * and of every block in its quarantine is reported now, before its ring
 * goes away. */
static void thread_exit(void *arg)
{
    struct tag_thread_state *t = _tag_tls.t;
    if (t->rec == NULL)
        return;  /* no state (its mapping failed) */
    /* Its state goes at the last round of the thread's key destructors:
     * the hook sets its key again until then, so destructors of other keys
     * that run after it in earlier rounds still find the state (their
     * allocations get stacks); one of the last round that runs after it
     * works without (_tag_self gives NULL). */
    if (++t->exit_rounds > 1) {
        if (t->exit_rounds < PTHREAD_DESTRUCTOR_ITERATIONS) {
            pthread_setspecific(exit_key, arg);
        } else {
            struct libtag_thread *r = t->rec;
            uint64_t mine = (uint64_t)(uintptr_t)&t->shadow;
            /* a reader must not follow the record to unmapped memory */
            __atomic_compare_exchange_n(&r->shadow, &mine, 0, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED);
            _tag_tls.gone = 1;
            _tag_tls.t = &_tag_tls_none;
            /* what it freed since its quarantine went: to the central lists */
            _tag_heap_flush(t->heap_cache);
            _tag_unmap(t, sizeof *t);
        }
        return;
    }
    pthread_setspecific(exit_key, arg);
    if (_tag_opt.sweep_every)
        _tag_sweep(t, __builtin_return_address(0), __builtin_frame_address(0));
    _tag_quarantine_drain(t);
    t->exiting = 1;
    _tag_unwind_settle(t);
    __atomic_fetch_add(&_tag_capture_total, t->captures, __ATOMIC_RELAXED);
    __atomic_fetch_add(&_tag_capture_frames_total, t->capture_frames, __ATOMIC_RELAXED);
    t->captures = t->capture_frames = 0;
    if (t->rec) {
        __atomic_fetch_add(&_tag_ctl.shadow_overflows, t->shadow.overflows,
                           __ATOMIC_RELAXED);
        __atomic_or_fetch(&t->rec->flags, TAG_THREAD_EXITED, __ATOMIC_RELEASE);
    }
}

struct tag_thread_state *_tag_thread_register(void)
{
    struct tag_tls_ref *ref = &_tag_tls;
    struct tag_thread_state *t = ref->t;
    _tag_ensure_init();
    if (t->rec)
        return t;
    if (!ref->tid)
        ref->tid = (uint32_t)syscall(SYS_gettid);
    if (ref->gone)
        return NULL;
    if (t == &_tag_tls_none) {
        /* mmap'ed memory is zeroed: the state of a thread that never ran */
        t = _tag_map(sizeof *t, 0);
        if (t == NULL)
            return NULL;  /* tried again at the next entry */
        ref->t = t;
    }
    t->tid = ref->tid;
    uint32_t i = __atomic_fetch_add(&_tag_ctl.thread_count, 1, __ATOMIC_RELAXED);
    struct libtag_thread *r;
    if (i < THREAD_CAPACITY) {
        r = &records[i];
        t->overflow_rec = 0;
    } else {
        __atomic_store_n(&_tag_ctl.thread_count, THREAD_CAPACITY, __ATOMIC_RELAXED);
        r = &overflow_record;
        t->overflow_rec = 1;
    }
    /* records are never reused: a counter or a reader would mix threads */
    TAG_ASSERT(t->overflow_rec || __atomic_load_n(&r->tid, __ATOMIC_RELAXED) == 0);
    r->shadow = (uint64_t)(uintptr_t)&t->shadow;
    /* glibc puts a thread's descriptor at the top of its stack block, so
     * pthread_self() bounds the stack of every thread but the main one,
     * whose stack ends at __libc_stack_end. */
    if (t->tid == (uint32_t)getpid())
        t->stack_hi = (uint64_t)(uintptr_t)__libc_stack_end;
    else
        t->stack_hi = (uint64_t)pthread_self();
    r->stack_hi = t->stack_hi;
    __atomic_store_n(&r->tid, t->tid, __ATOMIC_RELEASE);
    t->pop_limit = t->alt_hi ? 0 : t->stack_hi;
    t->shadow_limit = TAG_SHADOW_MAX;
    /* the enter hook's countdown to the next sweep: from here, whichever
     * of a hook or an allocation registers the thread */
    t->hook_left = _tag_hook_period();
    t->hook_sp_outer = UINT64_MAX;
    t->rec = ref->rec = r;
    /* pthread_setspecific with a low key index writes a static slot in the
     * thread descriptor: no malloc. */
    if (__atomic_load_n(&exit_key_ready, __ATOMIC_ACQUIRE))
        pthread_setspecific(exit_key, r);
    return t;
}

/* Did the fork() in progress come from the main thread?  Written with the
 * table lock held (prepare to parent/child), so two forks cannot mix it up. */
static int fork_from_main;

static void atfork_prepare(void)
{
    _tag_stack_table_atfork_prepare();
    _tag_guard_atfork_prepare();
    _tag_heap_atfork_prepare();
    fork_from_main = (pid_t)syscall(SYS_gettid) == getpid();
}
static void atfork_parent(void)
{
    _tag_heap_atfork_release();
    _tag_guard_atfork_parent();
    _tag_stack_table_atfork_parent();
}

/* The child of the program's own fork() is a new process: its one thread
 * gets a record of its own, and the control block its pid. */
static void atfork_child(void)
{
    _tag_heap_atfork_release();
    _tag_guard_atfork_child();
    _tag_stack_table_atfork_child();
    _tag_modules_atfork_child();
    _tag_ctl.pid = (uint32_t)getpid();
    /* the state mapping is the parent's, copied: this thread keeps it */
    if (_tag_tls.t != &_tag_tls_none)
        _tag_tls.t->rec = NULL;
    _tag_tls.rec = NULL;
    _tag_tls.tid = 0;
    struct tag_thread_state *t = _tag_thread_register();
    /* In the child tid == pid even when a non-main thread forked, so
     * register() took __libc_stack_end; but this thread still runs on the
     * forking thread's stack, whose top is its descriptor.  A wrong bound
     * lets the frame-pointer walk leave the stack and misleads readers. */
    if (t && !fork_from_main) {
        t->stack_hi = t->rec->stack_hi = (uint64_t)pthread_self();
        t->pop_limit = t->alt_hi ? 0 : t->stack_hi;
    }
    if (t)
        _tag_unwind_forget(t);  /* kept walks were bounded by the parent's stack_hi */
    /* The parent's threads do not exist here: no reader or snapshot of the
     * child may take their records (or their saved registers) for live. */
    for (uint32_t i = 0; i < _tag_ctl.thread_count && i < THREAD_CAPACITY; i++)
        if (&records[i] != _tag_tls.rec)
            records[i].flags |= TAG_THREAD_EXITED;
    if (t)
        t->rec->quarantine = (uint64_t)(uintptr_t)t->quarantine;  /* still ours */
}

/* After libc is initialised (constructor): pthread_key_create and
 * pthread_atfork may allocate, which is fine from here. */
void _tag_threads_late_init(void)
{
    if (pthread_key_create(&exit_key, thread_exit) == 0) {
        __atomic_store_n(&exit_key_ready, 1, __ATOMIC_RELEASE);
        if (_tag_tls.t->rec && _tag_tls.tid != (uint32_t)getpid())
            pthread_setspecific(exit_key, _tag_tls.t->rec);
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* sigaltstack() is interposed so each thread knows its alternate signal
 * stack: a stack walk or a shadow-stack pop must know which stack the code
 * runs on (a handler on the alternate stack is not "above" the frames it
 * interrupted).  The real call is the plain system call glibc makes. */
TAG_EXPORT int sigaltstack(const stack_t *ss, stack_t *old)
{
    long r = syscall(SYS_sigaltstack, ss, old);
    struct tag_thread_state *t;
    /* the bounds go into the thread's state: registered first */
    if (r == 0 && ss && (t = _tag_self()) != NULL) {
        if (ss->ss_flags & SS_DISABLE) {
            t->alt_lo = t->alt_hi = 0;
        } else {
            t->alt_lo = (uint64_t)(uintptr_t)ss->ss_sp;
            t->alt_hi = t->alt_lo + ss->ss_size;
        }
        t->pop_limit = t->alt_hi ? 0 : t->stack_hi;
        _tag_unwind_forget(t);  /* kept walks were bounded by the old stacks */
    }
    return r == 0 ? 0 : -1;  /* syscall() set errno */
}
