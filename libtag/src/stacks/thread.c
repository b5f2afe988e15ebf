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

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "base/prim.h"
#include "stacks/shadow.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"

/* Whole pages: the debug build makes them read-only (_tag_threads_init),
 * so a path that writes a thread's state before registering it faults in
 * the tests. */
union tag_tls_none _tag_tls_none_pages __attribute__((aligned(TAG_PAGE_MAX)));
__thread struct tag_tls_ref _tag_tls __attribute__((tls_model("initial-exec"))) = {
    .t = &_tag_tls_none,
};

#define THREAD_CAPACITY 16384u

static struct libtag_thread *records;
/* The shared record of threads beyond THREAD_CAPACITY: atomics only. */
static struct libtag_thread overflow_record;
pthread_key_t _tag_exit_key;
int _tag_exit_key_ready;

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
    if (__atomic_load_n(&_tag_exit_key_ready, __ATOMIC_ACQUIRE))
        pthread_setspecific(_tag_exit_key, r);
    return t;
}

/* The child of the program's own fork() (life/threads.c calls this after
 * the other parts' handlers): its one thread gets a record of its own.
 * from_main: the fork came from the main thread. */
void _tag_thread_atfork_child(int from_main)
{
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
    if (t && !from_main) {
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
