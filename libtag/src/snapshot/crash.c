/* crash.c - the crash hook.
 *
 * On SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT libtag records the fault
 * (signal, address, code, thread, its registers) in the control block, then
 * hands the signal to the handler the program installed, or restores the
 * default action and re-raises it, so the kernel's core of the crashing
 * process carries the tags and the crash record.
 *
 * With LIBTAG_DIR set (forensics run), the core is made to land there: the
 * process moves into <dir>/<comm>-<pid>-<seq>-crash/ before the re-raise, and
 * where the kernel would not write the core there (core_pattern is a pipe
 * or a path, or LIBTAG_CORE=self), a fork child writes it itself first.
 *
 * A SIGSEGV in the guard pool on a guarded block is libtag's own (guard.c):
 * reported and recovered from there, it never reaches the program.
 *
 * The program's own handlers: sigaction() and signal() are interposed for
 * the crash signals, so a handler the program installs is remembered and
 * called from ours instead of replacing it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "base/options.h"
#include "base/prim.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"
#include "alloc/guard.h"
#include "snapshot/snapshot.h"

static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
static struct sigaction program_act[TAG_NSIG];  /* what the program asked for */
static int hooked[TAG_NSIG];
static int in_crash;


static int is_crash_signal(int sig)
{
    return sig > 0 && sig < TAG_NSIG && hooked[sig];
}

static void crash_handler(int sig, siginfo_t *si, void *ucv)
{
    /* sweep.c: the probe's load, resumed (the thread's probing is its
     * state's, which base/prim.c does not see) */
    if (_tag_tls.t->probing && _tag_probe_fault(sig, ucv))
        return;
    if (_tag_guard_fault(sig, si, ucv))  /* guard.c: a guarded block's fault */
        return;
    ucontext_t *uc = ucv;
    struct tag_thread_state *t = _tag_self();
    if (!__atomic_exchange_n(&in_crash, 1, __ATOMIC_ACQ_REL)) {
        struct libtag_crash *c = &_tag_ctl.crash;
        c->signal = (uint32_t)sig;
        c->tid = _tag_tls.tid;
        c->address = (uint64_t)(uintptr_t)si->si_addr;
        c->code = (uint32_t)si->si_code;
        /* The faulting thread's stack from the interrupted context: CFI,
         * cached rules and modules only, and an intern that never waits
         * for the table lock (0 if it is taken). */
        c->stack = _tag_capture_uc(t, uc);
        c->time = _tag_now_ms();
        _tag_save_thread(uc);
        if (_tag_ctl.reason == TAG_REASON_NONE)
            _tag_ctl.reason = TAG_REASON_CRASH;
        /* The crash directory is made below, only once the default action
         * is certain: see there. */
    }

    /* The program's own disposition, with the semantics the kernel would
     * have given it (sigaction(2)): an ignored signal sent by kill() is
     * ignored (a fault cannot be: the kernel forces the default); a handler
     * runs with its sa_mask and, unless SA_NODEFER, its own signal blocked;
     * SA_RESETHAND restores the default before it runs. */
    struct sigaction act = program_act[sig];
    if (act.sa_handler == SIG_IGN && !(act.sa_flags & SA_SIGINFO) && si->si_code <= 0)
        return;
    int has_handler = (act.sa_flags & SA_SIGINFO) ? act.sa_sigaction != NULL
                      : act.sa_handler != SIG_DFL && act.sa_handler != SIG_IGN;
    if (has_handler) {
        if (act.sa_flags & SA_RESETHAND) {
            memset(&program_act[sig], 0, sizeof program_act[sig]);
            program_act[sig].sa_handler = SIG_DFL;
        }
        sigset_t block = act.sa_mask, old;
        if (!(act.sa_flags & SA_NODEFER))
            sigaddset(&block, sig);
        pthread_sigmask(SIG_BLOCK, &block, &old);
        if (act.sa_flags & SA_SIGINFO)
            act.sa_sigaction(sig, si, ucv);
        else
            act.sa_handler(sig);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return;
    }
    /* Default action: restore it and let the signal come back.  A fault
     * re-executes the instruction; abort() and kill() are re-sent. */
    /* Only now, when the signal will kill the process, make its core land
     * in a snapshot directory (fix: this used to happen before a program's
     * own handler ran, which then found its cwd moved into the crash dir,
     * and with LIBTAG_CORE=self got a crash core per fault even when it
     * recovered - JITs and GCs take SIGSEGV on purpose).  A handler that
     * gives up by restoring SIG_DFL or calling abort() comes back here. */
    static int crash_dir_made;
    if (_tag_opt.dir[0] && !__atomic_exchange_n(&crash_dir_made, 1, __ATOMIC_ACQ_REL))
        _tag_crash_dir();
    else if (_tag_opt.omit_payload)
        /* no snapshot dir to write a blanked core to: LIBTAG_PAYLOAD=omit
         * means no core with payloads at all, so none */
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    if (sig == SIGSEGV || sig == SIGBUS)
        __atomic_store_n(&_tag_probe_armed, 0, __ATOMIC_RELAXED);
    __sigaction(sig, &dfl, NULL);
    if (si->si_code <= 0)
        syscall(SYS_tgkill, getpid(), _tag_tls.tid, sig);
}

void _tag_crash_init(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = crash_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof crash_signals / sizeof crash_signals[0]; i++) {
        int sig = crash_signals[i];
        struct sigaction old;
        if (_tag_signal_free(sig) && __sigaction(sig, &sa, &old) == 0) {
            program_act[sig] = old;  /* a handler installed before us */
            hooked[sig] = 1;
        }
    }
    if (hooked[SIGSEGV] && hooked[SIGBUS])
        __atomic_store_n(&_tag_probe_armed, 1, __ATOMIC_RELAXED);
}

/* The program asks for a crash signal: remember its wish, keep ours. */
static void warn_taken(int sig, const struct sigaction *act)
{
    static int warned[TAG_NSIG];
    if (!act || sig <= 0 || sig >= TAG_NSIG || warned[sig])
        return;
    if (act->sa_handler != SIG_DFL && (sig == _tag_opt.signal || sig == TAG_REGS_SIGNAL))
        _tag_snapshot_signal_taken(sig);
    if (sig == _tag_opt.signal && act->sa_handler != SIG_DFL) {
        warned[sig] = 1;
        _tag_log("libtag: the program installed its own handler for signal %d: "
                 "snapshots on that signal are off (set LIBTAG_SIGNAL to a free one)", sig);
    } else if (sig == TAG_REGS_SIGNAL && act->sa_handler != SIG_DFL) {
        warned[sig] = 1;
        _tag_log("libtag: the program installed its own handler for signal %d: "
                 "snapshots will not have other threads' registers", sig);
    }
}

TAG_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!is_crash_signal(sig)) {
        warn_taken(sig, act);
        return __sigaction(sig, act, old);
    }
    if (old)
        *old = program_act[sig];
    if (act)
        program_act[sig] = *act;
    return 0;
}

TAG_EXPORT sighandler_t signal(int sig, sighandler_t handler)
{
    if (!is_crash_signal(sig)) {
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = handler;
        warn_taken(sig, &sa);
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (__sigaction(sig, &sa, &old) < 0)
            return SIG_ERR;
        return old.sa_handler;
    }
    sighandler_t prev = program_act[sig].sa_handler;
    memset(&program_act[sig], 0, sizeof program_act[sig]);
    program_act[sig].sa_handler = handler;
    program_act[sig].sa_flags = SA_RESTART;
    return prev;
}

/* The hidden names of the wrappers above: life/attach.c rebinds a late-loaded
 * libtag's process to them, so a handler the program installs after the
 * attach is known (snapshot/snapshot.h) */
extern __typeof(sigaction) _tag_sigaction_self __attribute__((alias("sigaction"), copy(sigaction)));
extern __typeof(signal) _tag_signal_self __attribute__((alias("signal"), copy(signal)));
