/* threads.c - a thread's end and the process's forks: what every part
 * does then.  A thread's state and record are stacks/thread.c's; here the
 * thread's exit (its key's destructor: the last checks of its blocks, its
 * quarantine drained, its counters summed, its state unmapped) and the
 * program's own fork() (each part's lock held across it, the child's one
 * thread registered anew), which call into every folder below.
 */
#include <limits.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/control.h"
#include "base/options.h"
#include "base/prim.h"
#include "heap/heap.h"
#include "stacks/modules.h"
#include "stacks/stack_table.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"
#include "alloc/guard.h"
#include "alloc/quarantine.h"
#include "alloc/sweep.h"
#include "life/life.h"

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
            pthread_setspecific(_tag_exit_key, arg);
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
    pthread_setspecific(_tag_exit_key, arg);
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
    _tag_thread_atfork_child(fork_from_main);
}

/* After libc is initialised (constructor): pthread_key_create and
 * pthread_atfork may allocate, which is fine from here. */
void _tag_threads_late_init(void)
{
    if (pthread_key_create(&_tag_exit_key, thread_exit) == 0) {
        __atomic_store_n(&_tag_exit_key_ready, 1, __ATOMIC_RELEASE);
        if (_tag_tls.t->rec && _tag_tls.tid != (uint32_t)getpid())
            pthread_setspecific(_tag_exit_key, _tag_tls.t->rec);
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
