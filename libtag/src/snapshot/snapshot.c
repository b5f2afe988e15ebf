/* snapshot.c - a core of the process without stopping it: fork and dump.
 *
 * 1. Every other thread is asked, by a signal, to save its registers into
 *    its thread record and wait; so the snapshot holds every thread's state
 *    at one instant (the fork child keeps only the calling thread).
 * 2. The process forks with the raw clone system call: glibc's fork() would
 *    run atfork handlers and take every malloc arena lock, which deadlocks
 *    when the snapshot comes from a signal handler that interrupted a thread
 *    holding one (seen in GWP-ASan's handler, Crashlytics, httrack).  The child's exit signal is 0, so the program's
 *    SIGCHLD handler and wait() calls never see it; libtag reaps it.
 * 3. The threads are released; the parent has paused only for 1 and 2.
 * 4. The child - one thread, async-signal-safe calls only, no malloc, no
 *    locks, and no glibc function that trusts the cached thread id (raise,
 *    abort, pthread_*) - records why it exists in the control block, moves
 *    into a fresh directory of its own and either aborts so the kernel writes
 *    "core" there, or (core_pattern pipes elsewhere, a core limit of 0, or
 *    LIBTAG_CORE=self) writes the ELF core itself.
 *
 * A snapshot is a directory <dir>/<comm>-<pid>-<seq>-<reason>/ (0700) with
 * the core (0600) and an "info" file the parent writes (key=value lines).
 * A reader knows the core is complete when the child has exited: the info
 * file names the child pid, and "error" holds the reason if it failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>     /* renameat */
#include <stdlib.h>    /* getenv */
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "base/options.h"
#include "base/prim.h"
#include "stacks/thread.h"
#include "alloc/anomaly.h"
#include "alloc/foreign.h"
#include "alloc/guard.h"
#include "alloc/quarantine.h"
#include "snapshot/corewrite.h"
#include "snapshot/snapshot.h"

#define MAX_PENDING 64

/* How long stop_threads waits for the threads' answers.  On a loaded
 * machine a signalled thread may wait hundreds of ms for a CPU, so the wait
 * is not cut short at a fixed small bound: after STOP_CHECK_NS the threads
 * that cannot answer (exited, or blocking the signal) are counted out, and
 * the others are waited for up to STOP_MAX_NS. */
#define STOP_CHECK_NS 200000000ull   /* 200 ms */
#define STOP_MAX_NS   2000000000ull  /* 2 s */
#define STOP_TRACK    4096u          /* threads whose tids are kept for it */

static int busy;                    /* a snapshot is being taken */
static uint32_t next_generation;    /* bumped by every stop, whatever its fate */
static uint32_t generation;         /* which snapshot threads wait for */
static uint32_t acks;               /* threads that saved their registers */
static uint32_t released;           /* generation that may go on */
static pid_t pending[MAX_PENDING];  /* snapshot children not reaped yet */
int _tag_snapshot_pending;          /* how many; read on the free() path */

static const char *const reason_names[] = {
    [TAG_REASON_NONE] = "none",
    [TAG_REASON_ON_DEMAND] = "on-demand",
    [TAG_REASON_ANOMALY] = "anomaly",
    [TAG_REASON_CRASH] = "crash",
    [TAG_REASON_EXIT] = "exit",
};

static void reap(void);
static void snapshot_handoff(void);

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void regs_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    int saved = errno;
    if (si->si_code == SI_QUEUE && (uint32_t)si->si_value.sival_int == TAG_REAP_REQUEST) {
        /* from forensics snapshot: the core is complete, collect the child
         * (reap() takes no lock: a snapshot running now is not delayed) */
        reap();
        errno = saved;
        return;
    }
    if (si->si_code == SI_QUEUE && (uint32_t)si->si_value.sival_int == TAG_SNAPSHOT_REQUEST) {
        if (__atomic_load_n(&_tag_ctl.request_nonce, __ATOMIC_ACQUIRE))
            snapshot_handoff();
        else
            _tag_snapshot(TAG_REASON_ON_DEMAND);
        errno = saved;
        return;
    }
    if (si->si_code != SI_TKILL || si->si_pid != getpid()) {
        errno = saved;
        return;
    }
    uint32_t gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    (void)_tag_self();
    _tag_save_thread(uc);
    __atomic_fetch_add(&acks, 1, __ATOMIC_RELEASE);
    futex(&acks, FUTEX_WAKE_PRIVATE, 1, NULL);
    /* Hold still until the fork is done, so the registers stay true; give
     * up a second after the longest stop, so a lost wake-up cannot stop a
     * thread for good. */
    uint64_t until = mono_ns() + STOP_MAX_NS + 1000000000ull;
    uint32_t rel;
    while ((rel = __atomic_load_n(&released, __ATOMIC_ACQUIRE)) != gen && mono_ns() < until) {
        struct timespec ts = {0, 50000000};
        futex(&released, FUTEX_WAIT_PRIVATE, rel, &ts);
    }
    errno = saved;
}

/* Ask every other thread of the process for its registers; returns how
 * many answered within the time limit. */
/* Can thread tid still answer TAG_REGS_SIGNAL?  Not when it has exited
 * since (its /proc entry is gone) or blocks the signal (SigBlk in its
 * status, signal n is bit n-1).  Async-signal-safe: open, read, close. */
static int can_answer(uint32_t tid)
{
    char path[64], st[4096];
    _tag_format(path, sizeof path, "/proc/self/task/%u/status", tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, st, sizeof st - 1);
    close(fd);
    if (n <= 0)
        return 1;  /* unknown: keep waiting for it */
    st[n] = '\0';
    const char *p = strstr(st, "SigBlk:");
    if (!p)
        return 1;
    for (p += 7; *p == ' ' || *p == '\t'; p++)
        ;
    uint64_t mask = 0;
    for (; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); p++)
        mask = mask << 4 | (uint64_t)(*p <= '9' ? *p - '0' : *p - 'a' + 10);
    return !(mask >> (TAG_REGS_SIGNAL - 1) & 1);
}

/* Has thread tid saved its registers for this stop?  freeze() cleared
 * every other record's TAG_THREAD_REGS first.  (A thread that answered
 * blocks the signal while it waits in the handler: it must not be counted
 * out as one that cannot answer.) */
static int answered(uint32_t tid)
{
    const struct libtag_thread *r = (const struct libtag_thread *)(uintptr_t)_tag_ctl.threads;
    uint32_t n = __atomic_load_n(&_tag_ctl.thread_count, __ATOMIC_ACQUIRE);
    if (n > _tag_ctl.thread_capacity)
        n = _tag_ctl.thread_capacity;
    for (uint32_t i = n; i-- > 0;)
        if (__atomic_load_n(&r[i].tid, __ATOMIC_ACQUIRE) == tid &&
            !(__atomic_load_n(&r[i].flags, __ATOMIC_ACQUIRE) & TAG_THREAD_EXITED))
            return (__atomic_load_n(&r[i].flags, __ATOMIC_ACQUIRE) & TAG_THREAD_REGS) != 0;
    return 0;
}


static uint32_t stop_threads(uint32_t gen, uint32_t self)
{
    static char buf[16384];   /* one snapshot at a time: busy guards it */
    static uint32_t tids[STOP_TRACK];
    uint32_t sent = 0;
    pid_t pid = getpid();
    int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    __atomic_store_n(&acks, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&generation, gen, __ATOMIC_RELEASE);
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            const char *name = buf + off + 19;  /* struct linux_dirent64 */
            unsigned short reclen;
            memcpy(&reclen, buf + off + 16, sizeof reclen);
            off += reclen;
            uint32_t tid = 0;
            for (const char *p = name; *p >= '0' && *p <= '9'; p++)
                tid = tid * 10 + (uint32_t)(*p - '0');
            if (tid == 0 || tid == self)
                continue;
            if (syscall(SYS_tgkill, pid, tid, TAG_REGS_SIGNAL) == 0) {
                if (sent < STOP_TRACK)
                    tids[sent] = tid;
                sent++;
            }
        }
    }
    close(fd);
    uint64_t start = mono_ns(), until = start + STOP_CHECK_NS;
    uint32_t want = sent, got;
    int checked = 0;
    for (;;) {
        got = __atomic_load_n(&acks, __ATOMIC_ACQUIRE);
        if (got >= want)
            break;
        uint64_t now = mono_ns();
        if (now >= until) {
            if (checked || sent > STOP_TRACK)
                break;
            /* Count out the threads that will never answer, then wait
             * for the rest as long as STOP_MAX_NS allows. */
            checked = 1;
            uint32_t mute = 0;
            for (uint32_t i = 0; i < sent; i++)
                mute += !answered(tids[i]) && !can_answer(tids[i]);
            want = sent - mute;
            until = start + STOP_MAX_NS;
            continue;
        }
        struct timespec ts = {0, 10000000};
        futex(&acks, FUTEX_WAIT_PRIVATE, got, &ts);
    }
    return got;
}

void _tag_save_thread(const struct ucontext_t *uc)
{
    _tag_save_regs(_tag_tls.rec, uc);
#if TAG_ARCH_FPREGS_BYTES
    struct tag_thread_state *t = _tag_tls.t;
    if (_tag_tls.rec && t->rec)  /* a state of its own, never _tag_tls_none */
        t->fpregs_saved = (uint32_t)tag_arch_save_fpregs(t->fpregs, (const ucontext_t *)uc);
#endif
}

/* Forget every other thread's registers from an earlier snapshot (a thread
 * that exited or blocks the signal must not show stale ones), save ours when
 * given, and stop the others.  Returns the generation to release. */
static uint32_t freeze(const ucontext_t *uc, uint32_t *stopped)
{
    struct libtag_thread *r = (struct libtag_thread *)(uintptr_t)_tag_ctl.threads;
    uint32_t n = __atomic_load_n(&_tag_ctl.thread_count, __ATOMIC_ACQUIRE);
    if (n > _tag_ctl.thread_capacity)
        n = _tag_ctl.thread_capacity;
    for (uint32_t i = 0; i < n; i++)
        if (&r[i] != _tag_tls.rec)
            __atomic_and_fetch(&r[i].flags, ~TAG_THREAD_REGS, __ATOMIC_RELAXED);
    if (uc)
        _tag_save_thread(uc);
    uint32_t gen = __atomic_add_fetch(&next_generation, 1, __ATOMIC_RELAXED);
    uint32_t got = stop_threads(gen, _tag_tls.tid);
    if (stopped)
        *stopped = got;
    return gen;
}

static void release_threads(uint32_t gen)
{
    __atomic_store_n(&released, gen, __ATOMIC_RELEASE);
    futex(&released, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL);
}

/* ---------------------------------------------------------------------
 * The snapshot directory.  Every component is opened with O_NOFOLLOW, so a
 * symlink anywhere in the path is refused, and the last one must belong to
 * us and be writable by nobody else.  Async-signal-safe. */
static int open_dir_secure(const char *path, int create)
{
    char part[512];
    int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const char *p = path;
    while (fd >= 0 && *p) {
        while (*p == '/')
            p++;
        size_t n = 0;
        while (p[n] && p[n] != '/')
            n++;
        if (n == 0)
            break;
        if (n >= sizeof part) {
            close(fd);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(part, p, n);
        part[n] = '\0';
        p += n;
        if (create && mkdirat(fd, part, 0700) < 0 && errno != EEXIST) {
            close(fd);
            return -1;
        }
        int next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        close(fd);
        errno = err;
        fd = next;
    }
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

/* The directory snapshots go to: LIBTAG_DIR, else the XDG state dir
 * ($XDG_STATE_HOME, else ~/.local/state), resolved once at start into
 * control.dir (daemons rewrite their environment to set a process title,
 * and a reader of the process finds it there).  Returns 0, or -1 when
 * neither named an absolute path. */
static void resolve_root(void)
{
    char *out = _tag_ctl.dir;
    size_t cap = sizeof _tag_ctl.dir;
    const char *state = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (_tag_opt.dir[0])
        _tag_format(out, cap, "%s", _tag_opt.dir);
    else if (state && state[0] == '/' && strlen(state) < cap - 32)
        _tag_format(out, cap, "%s/forensics/snapshots", state);
    else if (home && home[0] == '/' && strlen(home) < cap - 40)
        _tag_format(out, cap, "%s/.local/state/forensics/snapshots", home);
    else
        out[0] = '\0';
}

static int snapshot_root(char *path, size_t cap)
{
    if (!_tag_ctl.dir[0]) {
        _tag_format(path, cap, "(no LIBTAG_DIR, XDG_STATE_HOME or HOME)");
        return -1;
    }
    _tag_format(path, cap, "%s", _tag_ctl.dir);
    return 0;
}

static int open_snapshot_root(void)
{
    char path[512];
    if (snapshot_root(path, sizeof path) < 0) {
        errno = ENOENT;
        return -1;
    }
    return open_dir_secure(path, 1);
}

static void comm_name(char *out, size_t cap)
{
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, out, cap - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        n = 0;
    out[n] = '\0';
    for (ssize_t i = 0; i < n; i++)
        if (out[i] == '\n' || out[i] == '/' || out[i] == ' ')
            out[i] = out[i] == '\n' ? '\0' : '_';
    if (!out[0])
        memcpy(out, "process", 8);
}

/* Make <root>/<comm>-<pid>-<seq>-<reason>[-N]/ and return an fd on it. */
static int make_snapshot_dir(int root, uint32_t seq, const char *reason,
                             char *name, size_t cap)
{
    char comm[32];
    comm_name(comm, sizeof comm);
    for (int i = 0; i < 100; i++) {
        if (i == 0)
            _tag_format(name, cap, "%s-%d-%u-%s", comm, (int)getpid(), seq, reason);
        else
            _tag_format(name, cap, "%s-%d-%u-%s-%d", comm, (int)getpid(), seq, reason, i);
        if (mkdirat(root, name, 0700) == 0)
            return openat(root, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (errno != EEXIST)
            return -1;
    }
    errno = EEXIST;
    return -1;
}

static void write_file(int dir, const char *name, const char *text, size_t len)
{
    char tmp[64];
    _tag_format(tmp, sizeof tmp, "%s.tmp", name);
    int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    ssize_t w = write(fd, text, len);
    close(fd);
    if (w == (ssize_t)len)
        renameat(dir, tmp, dir, name);
    else
        unlinkat(dir, tmp, 0);
}

/* ---------------------------------------------------------------------
 * The child.  Decide how the core gets written and write it. */
/* The kernel writes a core only up to the soft RLIMIT_CORE, which is often
 * 0: raise it to the hard limit (never above; that is the admin's). */
static void raise_core_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_CORE, &rl) == 0 && rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_CORE, &rl);
    }
}

static int kernel_can_dump_here(void)
{
    char pat[256];
    int fd = open("/proc/sys/kernel/core_pattern", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, pat, sizeof pat - 1);
    close(fd);
    if (n <= 0)
        return 0;
    pat[n] = '\0';
    /* a pipe, or a path that leaves the current directory */
    if (pat[0] == '|' || memchr(pat, '/', (size_t)n))
        return 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_CORE, &rl) < 0 || rl.rlim_max == 0)
        return 0;
    return 1;
}

__attribute__((noreturn)) static void child_fail(int dir, const char *what, int err)
{
    char msg[160];
    size_t n = _tag_format(msg, sizeof msg, "%s: %s (errno %d)\n", what,
                           err == ENOSPC ? "no space left on device"
                           : err == EACCES || err == EPERM ? "permission denied"
                                                           : "error",
                           err);
    write_file(dir, "error", msg, n);
    syscall(SYS_exit_group, 1);
    __builtin_unreachable();
}

/* A handed-over snapshot: the core goes into a pipe whose read end the
 * caller takes from this child with pidfd_getfd(2), found in this child's
 * control.handoff_fd.  The write end does not block: a caller that never
 * takes the pipe, or stops reading, ends the child after
 * TAG_HANDOFF_WAIT_MS instead of leaving a copy of the process waiting. */
__attribute__((noreturn)) static void child_handoff(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        __atomic_store_n(&_tag_ctl.handoff_fd, -errno, __ATOMIC_RELEASE);
        syscall(SYS_exit_group, 1);
    }
    fcntl(p[1], F_SETPIPE_SZ, 1 << 20);  /* fewer wake-ups; best effort */
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    __atomic_store_n(&_tag_ctl.handoff_fd, p[0], __ATOMIC_RELEASE);
    int rc = _tag_write_core(p[1], (int)_tag_ctl.pid,
                             (const struct libtag_thread *)(uintptr_t)_tag_ctl.threads,
                             _tag_ctl.thread_count);
    close(p[1]);
    syscall(SYS_exit_group, rc < 0);
    __builtin_unreachable();
}

__attribute__((noreturn)) static void child_main(int dir, uint32_t reason, uint32_t seq,
                                                 uint32_t tid)
{
    /* A fault in the child (a file mapping past its end, while redacting
     * or dumping) must end the child, not run the crash hook - or the
     * program's own handler - in it. */
    static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    _tag_probe_armed = 0;
    for (size_t i = 0; i < sizeof crash_signals / sizeof crash_signals[0]; i++)
        syscall(SYS_rt_sigaction, crash_signals[i], &dfl, NULL, sizeof(sigset_t) / 16);

    /* This memory is the snapshot: say what it is. */
    _tag_ctl.reason = reason;
    _tag_ctl.snapshot_seq = seq;
    _tag_ctl.snapshot_tid = tid;
    _tag_ctl.snapshot_time_ms = _tag_now_ms();
    _tag_guard_expose();          /* the freed guarded blocks, readable */
    _tag_quarantine_check_all();  /* before the payloads may be blanked */
    if (_tag_opt.omit_payload)
        _tag_redact_payloads();

    if (dir < 0)
        child_handoff();

    int path = _tag_opt.core_path;
    if (path == TAG_CORE_AUTO)
        path = kernel_can_dump_here() ? TAG_CORE_KERNEL : TAG_CORE_SELF;

    if (path == TAG_CORE_SELF) {
        int fd = openat(dir, "core", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
            child_fail(dir, "cannot create core", errno);
        int rc = _tag_write_core(fd, (int)_tag_ctl.pid,
                                 (const struct libtag_thread *)(uintptr_t)_tag_ctl.threads,
                                 _tag_ctl.thread_count);
        if (rc == 0 && fsync(fd) < 0)
            rc = -errno;
        close(fd);
        if (rc < 0) {
            unlinkat(dir, "core", 0);
            child_fail(dir, "cannot write core", -rc);
        }
        syscall(SYS_exit_group, 0);
    }

    /* Kernel path: the core lands in the current directory, mode 0600. */
    if (fchdir(dir) < 0)
        child_fail(dir, "cannot enter snapshot directory", errno);
    raise_core_limit();
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    _tag_die(SIGABRT);
    child_fail(dir, "abort did not end the snapshot child", 0);
}

/* ---------------------------------------------------------------------
 * Reaping.  The children have no exit signal; collect them when we can.
 * Lock-free and async-signal-safe: of two threads reaping the same child,
 * only one waitpid() returns it, and only that one clears its slot. */
static void reap(void)
{
    int saved = errno;
    for (int i = 0; i < MAX_PENDING; i++) {
        pid_t p = __atomic_load_n(&pending[i], __ATOMIC_ACQUIRE);
        if (p > 0 && waitpid(p, NULL, WNOHANG | __WALL) == p &&
            __atomic_compare_exchange_n(&pending[i], &p, 0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            __atomic_fetch_sub(&_tag_snapshot_pending, 1, __ATOMIC_RELAXED);
    }
    errno = saved;
}

static void remember(pid_t child)
{
    for (int i = 0; i < MAX_PENDING; i++) {
        pid_t zero = 0;
        if (__atomic_compare_exchange_n(&pending[i], &zero, child, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            __atomic_fetch_add(&_tag_snapshot_pending, 1, __ATOMIC_RELAXED);
            return;
        }
    }
    /* Full: wait for the oldest rather than leave a zombie for good. */
    waitpid(pending[0], NULL, __WALL);
    pending[0] = child;
}

/* From the allocation path, every 1024 frees of a thread while a child is
 * pending: an idle program keeps its last child as a zombie until it
 * allocates again or takes another snapshot. */
void _tag_snapshot_reap(void)
{
    reap();  /* no lock: an on-demand snapshot must never find us busy */
}

/* ---------------------------------------------------------------------
 * On-demand requests.  One that arrives while a snapshot is being taken is
 * not dropped: its time stays in asked_ns, and whoever holds busy looks at
 * asked_ns after letting busy go and takes the snapshot it asks for (a
 * request publishes itself before it tries busy, so either the holder sees
 * it or the request gets busy itself).  Each on-demand snapshot serves every
 * request made up to its start and says since when in its info file
 * (request_ns): forensics snapshot takes the first snapshot that started
 * after it asked, never one that was already under way. */
static uint64_t asked_ns;  /* CLOCK_MONOTONIC of the oldest request not served; 0 = none */

static void ask(uint64_t t)
{
    uint64_t cur = __atomic_load_n(&asked_ns, __ATOMIC_RELAXED);
    while ((cur == 0 || t < cur) &&
           !__atomic_compare_exchange_n(&asked_ns, &cur, t, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

/* not static: LTO renames a static one (take.lto_priv.0), and the
 * snapshot thread's innermost frame is named in tests and answers */
int _tag_snapshot_take(uint32_t reason, int handoff);

/* Take what is asked for meanwhile: handed-over snapshots, then one
 * on-demand snapshot for every request made until it starts.  Stops when
 * another thread holds busy (it looks again after letting busy go). */
static void serve_pending(void)
{
    for (;;) {
        if (__atomic_load_n(&_tag_ctl.request_nonce, __ATOMIC_ACQUIRE)) {
            if (_tag_snapshot_take(TAG_REASON_ON_DEMAND, 1) == -EBUSY)
                return;
        } else if (__atomic_load_n(&asked_ns, __ATOMIC_ACQUIRE)) {
            if (_tag_snapshot_take(TAG_REASON_ON_DEMAND, 0) == -EBUSY)
                return;
        } else {
            return;
        }
    }
}

/* Take a snapshot, then the on-demand ones asked for meanwhile.
 * Async-signal-safe; returns 0 or -errno (of the first).  An on-demand
 * request that finds another snapshot in progress returns 0: the thread
 * taking that one takes this one next. */
int _tag_snapshot(uint32_t reason)
{
    if (reason == TAG_REASON_ON_DEMAND)
        ask(mono_ns());
    int rc = _tag_snapshot_take(reason, 0);
    if (rc == -EBUSY)
        return reason == TAG_REASON_ON_DEMAND ? 0 : rc;
    serve_pending();
    return rc;
}

/* A request with control.request_nonce set: hand the core over. */
static void snapshot_handoff(void)
{
    if (_tag_snapshot_take(TAG_REASON_ON_DEMAND, 1) != -EBUSY)
        serve_pending();
}

/* The new snapshot's directory, seq-reason, in the snapshot root: *root
 * and *dir open (the caller closes them), its name in name.  0, or -errno
 * (said in the log). */
static int open_dir(uint32_t seq, const char *rname, char *name, size_t cap, int *root, int *dir)
{
    *root = open_snapshot_root();
    *dir = *root >= 0 ? make_snapshot_dir(*root, seq, rname, name, cap) : -1;
    if (*dir >= 0)
        return 0;
    int rc = -errno;
    char where[512];
    snapshot_root(where, sizeof where);
    _tag_log("libtag: snapshot failed: cannot create the snapshot directory in %s (errno %d)",
             where, -rc);
    return rc;
}

/* The control block's record of the snapshot just forked (child): what
 * forensics reads, the caller's nonce last (it polls for it).  t0..t2:
 * before the freeze, after it, after the fork; asked: when it was asked
 * for (0: now, t0). */
static struct libtag_snapinfo *record_last(uint32_t seq, long child, uint32_t stopped,
                                           uint32_t reason, uint64_t t0, uint64_t t1,
                                           uint64_t t2, uint64_t asked, uint64_t nonce)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct libtag_snapinfo *l = &_tag_ctl.last;
    __atomic_store_n(&l->nonce, 0, __ATOMIC_RELEASE);
    l->seq = seq;
    l->child = (uint32_t)child;
    l->tid = _tag_tls.tid;
    l->threads_stopped = stopped;
    l->reason = reason;
    l->pause_ns = t2 - t0;
    l->fork_ns = t2 - t1;
    l->time_ms = (uint64_t)now.tv_sec * 1000ull + (uint64_t)now.tv_nsec / 1000000ull;
    l->request_ns = asked ? asked : t0;
    /* the caller polls for its nonce: everything else first */
    __atomic_store_n(&l->nonce, nonce, __ATOMIC_RELEASE);
    return l;
}

/* The snapshot directory's info file, from the record l. */
static void write_info(int dir, long child, const char *rname, const struct libtag_snapinfo *l)
{
    char info[512];
    size_t n = _tag_format(info, sizeof info,
        "pid=%d\nchild=%ld\nseq=%u\nreason=%s\ntid=%u\nthreads_stopped=%u\n"
        "pause_ns=%lu\nfork_ns=%lu\ntime_ms=%lu\nrequest_ns=%lu\n",
        (int)getpid(), child, l->seq, rname, l->tid, l->threads_stopped,
        (unsigned long)l->pause_ns, (unsigned long)l->fork_ns,
        (unsigned long)l->time_ms, (unsigned long)l->request_ns);
    write_file(dir, "info", info, n);
}

/* The end of a snapshot, taken or not: its directory closed, the next
 * one allowed, the caller's errno back.  Returns rc. */
static int taken(int root, int dir, int saved_errno, int rc)
{
    if (dir >= 0)
        close(dir);
    if (root >= 0)
        close(root);
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    errno = saved_errno;
    return rc;
}


/* The snapshot's child: a raw fork (no atfork handlers, no locks) whose
 * exit signal is 0 - no SIGCHLD, invisible to the program's wait() without
 * __WALL.  qemu-user refuses any exit signal but SIGCHLD (EINVAL, which a
 * kernel never gives here): there the child is a SIGCHLD child, which a
 * program's SIGCHLD handler or wait(-1) may see (docs/aarch64.md). */
TAG_INLINE long raw_fork(void)
{
    long child = syscall(SYS_clone, 0L, 0L, 0L, 0L, 0L);
    if (TAG_UNLIKELY(child < 0 && errno == EINVAL))
        child = syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L);
    return child;
}

/* A snapshot: its directory made (open_dir; none for a handoff, whose
 * core goes through the caller's pipe), the other threads frozen, the
 * process forked with the raw clone (the child writes the core:
 * child_main), the threads released, the snapshot recorded (record_last,
 * write_info).  -EBUSY while another is under way. */
int _tag_snapshot_take(uint32_t reason, int handoff)
{
    int saved = errno;
    _tag_ensure_init();
    if (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) {
        errno = saved;
        return -EBUSY;
    }
    /* A handoff serves its one request (another thread may have served it
     * already); a directory snapshot every on-demand request made until now. */
    uint64_t nonce = handoff ? __atomic_exchange_n(&_tag_ctl.request_nonce, 0, __ATOMIC_ACQ_REL) : 0;
    if (handoff && !nonce) {
        __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
        errno = saved;
        return 0;
    }
    uint64_t asked = reason == TAG_REASON_ON_DEMAND && !handoff
                         ? __atomic_exchange_n(&asked_ns, 0, __ATOMIC_ACQ_REL) : 0;
    reap();
    (void)_tag_self();  /* registered: _tag_tls.tid and rec are set */
    uint32_t seq = __atomic_load_n(&_tag_ctl.snapshot_seq, __ATOMIC_RELAXED) + 1;
    const char *rname = reason == TAG_REASON_ANOMALY
                            ? _tag_anomaly_name(_tag_ctl.anomaly.kind)
                            : reason_names[reason];
    char name[128];
    int root = -1, dir = -1;
    if (!handoff) {
        int rc = open_dir(seq, rname, name, sizeof name, &root, &dir);
        if (rc)
            return taken(root, dir, saved, rc);
    }

    uint64_t t0 = mono_ns();
    ucontext_t uc;
#if TAG_ARCH_FPREGS_BYTES
    /* getcontext keeps the callee-saved FP registers only: the others
     * read 0, as a call leaves them no value */
    memset(&uc, 0, sizeof uc);
#endif
    uint32_t stopped;
    uint32_t gen = freeze(getcontext(&uc) == 0 ? &uc : NULL, &stopped);
    uint64_t t1 = mono_ns();
    /* exit signal 0: no SIGCHLD, invisible to wait() without __WALL */
    long child = raw_fork();
    if (child == 0)
        child_main(dir, reason, seq, _tag_tls.tid);
    uint64_t t2 = mono_ns();
    release_threads(gen);
    if (child < 0) {
        int rc = -errno;
        _tag_log("libtag: snapshot failed: fork: errno %d", -rc);
        return taken(root, dir, saved, rc);
    }
    __atomic_store_n(&_tag_ctl.snapshot_seq, seq, __ATOMIC_RELEASE);
    if (reason != TAG_REASON_EXIT)
        remember((pid_t)child);
    const struct libtag_snapinfo *l = record_last(seq, child, stopped, reason, t0, t1, t2, asked, nonce);
    if (handoff) {
        _tag_log("libtag: snapshot %u (%s) handed over to the caller", seq, rname);
        return taken(root, dir, saved, 0);
    }
    write_info(dir, child, rname, l);
    /* The process is about to be gone: wait for the core here, so that
     * whoever waits for the process finds it complete. */
    if (reason == TAG_REASON_EXIT)
        while (waitpid((pid_t)child, NULL, __WALL) < 0 && errno == EINTR)
            ;
    char where[512];
    snapshot_root(where, sizeof where);
    _tag_log("libtag: snapshot %u (%s) -> %s/%s", seq, rname, where, name);
    return taken(root, dir, saved, 0);
}

/* The crash hook, with LIBTAG_DIR set: make the crash core land in a
 * snapshot directory.  Where the kernel will write it there, move into it;
 * otherwise a fork child writes the core itself and we wait for it.  Called
 * from the crash signal handler: async-signal-safe. */
int _tag_crash_dir(void)
{
    (void)_tag_self();  /* registered: _tag_tls.tid and rec are set */
    uint32_t seq = __atomic_load_n(&_tag_ctl.snapshot_seq, __ATOMIC_RELAXED) + 1;
    char name[128];
    int root = open_snapshot_root();
    int dir = root >= 0 ? make_snapshot_dir(root, seq, "crash", name, sizeof name) : -1;
    if (root >= 0)
        close(root);
    if (dir < 0)
        return -errno;
    char info[256];
    size_t n = _tag_format(info, sizeof info, "pid=%d\nchild=0\nseq=%u\nreason=crash\ntid=%u\n",
                           (int)getpid(), seq, _tag_tls.tid);
    int path = _tag_opt.core_path;
    if (path == TAG_CORE_AUTO)
        path = kernel_can_dump_here() ? TAG_CORE_KERNEL : TAG_CORE_SELF;
    /* The process's own core would hold every payload: with
     * LIBTAG_PAYLOAD=omit a child writes a blanked core instead, and the
     * process dies without one (not dumpable: no file, no pipe). */
    if (_tag_opt.omit_payload)
        path = TAG_CORE_SELF;
    if (path == TAG_CORE_KERNEL) {
        raise_core_limit();
        write_file(dir, "info", info, n);
        int rc = fchdir(dir);
        close(dir);
        return rc;
    }
    /* another thread may be taking a snapshot: wait for it (2 s at most;
     * the process is going down either way) */
    for (int i = 0; i < 200 && __atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE); i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    uint32_t gen = freeze(NULL, NULL);  /* our registers: the crash hook's */
    long child = raw_fork();
    if (child == 0)
        child_main(dir, TAG_REASON_CRASH, seq, _tag_tls.tid);
    release_threads(gen);
    if (child > 0)
        waitpid((pid_t)child, NULL, __WALL);
    int rc = child > 0 ? 0 : -errno;
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    if (_tag_opt.omit_payload)
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    write_file(dir, "info", info, n);
    close(dir);
    return rc;
}

void _tag_snapshot_at_exit(void)
{
    /* Another thread may be taking a snapshot: wait for it (2 s at most). */
    for (int i = 0; i < 200 && _tag_snapshot_take(TAG_REASON_EXIT, 0) == -EBUSY; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
}

TAG_EXPORT int libtag_snapshot(void)
{
    return _tag_snapshot(TAG_REASON_ON_DEMAND);
}

static void snapshot_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    (void)uc;
    _tag_snapshot(TAG_REASON_ON_DEMAND);
}

/* May libtag take sig?  Always at start; loaded late (attach.c), only
 * where the program left the default action. */
int _tag_signal_free(int sig)
{
    struct sigaction old;
    sigset_t blocked;
    if (!_tag_late)
        return 1;
    /* a signal left at its default but blocked is the program's too (it
     * takes it with sigwait or a signalfd) */
    if (pthread_sigmask(SIG_BLOCK, NULL, &blocked) != 0 || sigismember(&blocked, sig))
        return 0;
    return __sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
           !(old.sa_flags & SA_SIGINFO);
}

void _tag_snapshot_init(void)
{
    resolve_root();
    _tag_ctl.start_euid = (uint32_t)geteuid();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = regs_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigfillset(&sa.sa_mask);
    if (_tag_signal_free(TAG_REGS_SIGNAL) && __sigaction(TAG_REGS_SIGNAL, &sa, NULL) == 0)
        __atomic_store_n(&_tag_ctl.request_signal, TAG_REGS_SIGNAL, __ATOMIC_RELEASE);
    if (_tag_opt.signal && _tag_signal_free(_tag_opt.signal)) {
        sa.sa_sigaction = snapshot_handler;
        if (__sigaction(_tag_opt.signal, &sa, NULL) == 0)
            __atomic_store_n(&_tag_ctl.user_signal, (uint32_t)_tag_opt.signal, __ATOMIC_RELEASE);
    }
}

/* The program installed its own action for sig: libtag no longer takes
 * requests on it, and says so in the control block. */
void _tag_snapshot_signal_taken(int sig)
{
    uint32_t s = (uint32_t)sig, cur = s;
    __atomic_compare_exchange_n(&_tag_ctl.request_signal, &cur, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    cur = s;
    __atomic_compare_exchange_n(&_tag_ctl.user_signal, &cur, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}
