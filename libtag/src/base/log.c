/* log.c - libtag's only way to say something: format into a stack buffer
 * and write(2) it.  Async-signal-safe: no locks, no malloc, no stdio, so it
 * may be called from the malloc path, signal handlers and the fork child.
 *
 * Where lines go is LIBTAG_LOG (options.c):
 *   stderr  the file fd 2 was when libtag started, identified by device and
 *           inode, and no descriptor of libtag's while the program keeps
 *           fd 2 (a program that lists or closes its descriptors finds only
 *           its own).  Each line goes to the first of:
 *             - fd 2, if it still is that file;
 *             - libtag's rescue descriptor (O_CLOEXEC, 200 or above, made
 *               only when the program closes or replaces fd 2 through
 *               close, dup2, dup3, close_range, closefrom, fclose or freopen
 *               on stderr: fds.c), if it still is that file;
 *             - the file opened again by the path it had at start (a
 *               terminal, a regular file, /dev/null, a named pipe: not an
 *               anonymous pipe or socket), checked, written and closed;
 *           else the line is dropped.  Never into a file the program put
 *           at a number libtag once used.
 *   PATH    appended to PATH.<pid> (opened at the first line, 0600, the last
 *           component never followed if it is a symlink, refused unless a
 *           regular file of ours); nothing goes to the program's stderr.  A
 *           process that forks opens its own file in the child.
 *   off     nothing, except a line that ends the process (a bad option, a
 *           fatal error), which goes where stderr would.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/options.h"

extern int __close(int fd);  /* glibc's close, past fds.c's */

static size_t put_num(char *buf, size_t cap, size_t n, unsigned long long v,
                      unsigned base, int neg)
{
    char tmp[24];
    size_t k = 0;
    do {
        tmp[k++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v && k < sizeof tmp);
    if (neg && n + 1 < cap)
        buf[n++] = '-';
    while (k && n + 1 < cap)
        buf[n++] = tmp[--k];
    return n;
}

static size_t vformat(char *buf, size_t cap, const char *fmt, va_list ap)
{
    size_t n = 0;
    if (cap == 0)
        return 0;
    for (const char *p = fmt; *p && n + 1 < cap; p++) {
        if (*p != '%') {
            buf[n++] = *p;
            continue;
        }
        int lng = 0;
        while (p[1] == 'l' || p[1] == 'z') {
            lng = 1;
            p++;
        }
        switch (*++p) {
        case 's': {
            const char *s = va_arg(ap, const char *);
            for (s = s ? s : "(null)"; *s && n + 1 < cap; s++)
                buf[n++] = *s;
            break;
        }
        case 'd': {
            long long v = lng ? va_arg(ap, long) : va_arg(ap, int);
            n = put_num(buf, cap, n, v < 0 ? -(unsigned long long)v : (unsigned long long)v,
                        10, v < 0);
            break;
        }
        case 'u':
            n = put_num(buf, cap, n, lng ? va_arg(ap, unsigned long) : va_arg(ap, unsigned),
                        10, 0);
            break;
        case 'x':
            n = put_num(buf, cap, n, lng ? va_arg(ap, unsigned long) : va_arg(ap, unsigned),
                        16, 0);
            break;
        case 'p':
            if (n + 3 < cap) {
                buf[n++] = '0';
                buf[n++] = 'x';
            }
            n = put_num(buf, cap, n, (uintptr_t)va_arg(ap, void *), 16, 0);
            break;
        case '%':
            buf[n++] = '%';
            break;
        default:
            buf[n++] = '?';
            break;
        }
    }
    buf[n] = '\0';
    return n;
}

size_t _tag_format(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t n = vformat(buf, cap, fmt, ap);
    va_end(ap);
    return n;
}

/* The lowest descriptor number the rescue descriptor takes: clear of the
 * small numbers programs hand out and dup2() onto (a lower one is used when
 * RLIMIT_NOFILE does not allow it). */
#define TAG_LOG_FD_MIN 200

/* A descriptor libtag writes its lines to, and what it was when libtag got
 * it: a number the program may have closed and reused is checked first. */
struct log_dest {
    int fd;            /* -1: none */
    int pid;           /* PATH: the process it was opened for */
    dev_t dev;
    ino_t ino;
};

static struct log_dest fd2_dest = {-1, 0, 0, 0};     /* fd 2 as it was at start */
static struct log_dest rescue_dest = {-1, 0, 0, 0};  /* see _tag_log_keep_fd */
static struct log_dest path_dest = {-1, 0, 0, 0};    /* PATH.<pid> */
static int path_lock;    /* pid of the one opener at a time; 0 = free */
static int rescue_lock;  /* 1 while a rescue descriptor is made */
/* fd 2's path at start, when it can be opened again (see the top) */
static char start_path[256];

static int still(const struct log_dest *d)
{
    struct stat st;
    return d->fd >= 0 && fstat(d->fd, &st) == 0 && st.st_dev == d->dev && st.st_ino == d->ino;
}

static int log_ready;  /* _tag_log_init has run */

void _tag_log_init(void)
{
    struct stat st;
    if (_tag_opt.log != TAG_LOG_PATH && fstat(2, &st) == 0) {
        fd2_dest.dev = st.st_dev;
        fd2_dest.ino = st.st_ino;
        fd2_dest.fd = 2;
        if (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
            char buf[sizeof start_path];
            ssize_t n = readlink("/proc/self/fd/2", buf, sizeof buf - 1);
            if (n > 0 && buf[0] == '/') {
                buf[n] = '\0';
                memcpy(start_path, buf, (size_t)n + 1);
            }
        }
    }
    /* fd 2 closed at start: stderr lines go nowhere */
    __atomic_store_n(&log_ready, 1, __ATOMIC_RELEASE);
}

/* fds.c: the program is about to close or replace descriptor fd.  If that
 * is fd 2 and still the stderr libtag started with, keep a duplicate of it
 * (the rescue descriptor) so libtag's lines still reach it.  Async-signal-
 * safe (a program may close fds in a handler). */
void _tag_log_keep_fd(int fd)
{
    if (fd != 2 || _tag_opt.log != TAG_LOG_STDERR ||
        !__atomic_load_n(&log_ready, __ATOMIC_ACQUIRE) || fd2_dest.fd != 2)
        return;
    int expect = 0;
    if (!__atomic_compare_exchange_n(&rescue_lock, &expect, 1, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return;
    if (!still(&rescue_dest) && still(&fd2_dest)) {
        int keep = fcntl(2, F_DUPFD_CLOEXEC, TAG_LOG_FD_MIN);
        if (keep < 0 && errno == EINVAL)
            keep = fcntl(2, F_DUPFD_CLOEXEC, 3);
        if (keep >= 0) {
            rescue_dest.dev = fd2_dest.dev;
            rescue_dest.ino = fd2_dest.ino;
            __atomic_store_n(&rescue_dest.fd, keep, __ATOMIC_RELEASE);
        }
    }
    __atomic_store_n(&rescue_lock, 0, __ATOMIC_RELEASE);
}

/* The stderr libtag started with, opened again by its path: a descriptor
 * to write one line to and close, or -1. */
static int reopen_start(void)
{
    if (!start_path[0])
        return -1;
    int fd = open(start_path, O_WRONLY | O_APPEND | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != fd2_dest.dev || st.st_ino != fd2_dest.ino)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The descriptor of this process's PATH.<pid>, opened on first use; -1 if it
 * cannot be (the line is then dropped: never written to stderr instead). */
static int path_fd(void)
{
    int pid = (int)getpid();
    if (__atomic_load_n(&path_dest.pid, __ATOMIC_ACQUIRE) == pid && path_dest.fd >= 0)
        return path_dest.fd;
    /* Async-signal-safe lock: a thread that finds it held drops its line
     * rather than wait (it may have interrupted the holder).  Held by
     * another pid: a copy made by fork() while a parent's thread held it,
     * which nobody here will release. */
    int holder = __atomic_load_n(&path_lock, __ATOMIC_RELAXED);
    if (holder == pid ||
        !__atomic_compare_exchange_n(&path_lock, &holder, pid, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return -1;
    int fd = -1;
    if (path_dest.pid == pid) {
        fd = path_dest.fd;
        goto out;
    }
    /* A forked child inherited its parent's file: close our copy, unless the
     * program has put a file of its own at that number since. */
    if (path_dest.fd >= 0 && still(&path_dest))
        close(path_dest.fd);
    path_dest.fd = -1;
    char name[sizeof _tag_opt.log_path + 16];
    _tag_format(name, sizeof name, "%s.%d", _tag_opt.log_path, pid);
    fd = open(name, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())) {
        close(fd);
        fd = -1;
    }
    if (fd >= 0) {
        path_dest.fd = fd;
        path_dest.dev = st.st_dev;
        path_dest.ino = st.st_ino;
    }
    __atomic_store_n(&path_dest.pid, fd >= 0 ? pid : 0, __ATOMIC_RELEASE);
out:
    __atomic_store_n(&path_lock, 0, __ATOMIC_RELEASE);
    return fd;
}

static void write_all(int fd, const char *buf, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, buf + off, n - off);
        if (w <= 0 && errno != EINTR)
            break;
        if (w > 0)
            off += (size_t)w;
    }
}

/* always: a line that ends the process, written even with LIBTAG_LOG=off. */
static void vlog(int always, const char *fmt, va_list ap)
{
    char buf[512];
    int saved = errno;
    size_t n = vformat(buf, sizeof buf - 1, fmt, ap);
    buf[n++] = '\n';
    int fd = -1, opened = 0;
    if (_tag_opt.log == TAG_LOG_PATH) {
        fd = path_fd();
    } else if (_tag_opt.log == TAG_LOG_STDERR || always) {
        if (!__atomic_load_n(&log_ready, __ATOMIC_ACQUIRE))
            fd = 2;  /* before libtag started (a bad LIBTAG_LOG) */
        else if (still(&fd2_dest))
            fd = 2;
        else if (still(&rescue_dest))
            fd = rescue_dest.fd;
        else if ((fd = reopen_start()) >= 0)
            opened = 1;
    }
    if (fd >= 0)
        write_all(fd, buf, n);
    if (opened)
        __close(fd);  /* not fds.c's close: it may be number 2 */
    errno = saved;
}

void _tag_log(const char *fmt, ...)
{
    if (_tag_opt.quiet || _tag_opt.log == TAG_LOG_OFF)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(0, fmt, ap);
    va_end(ap);
}

void _tag_log_always(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(1, fmt, ap);
    va_end(ap);
}

void _tag_fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(1, fmt, ap);
    va_end(ap);
    abort();
}
