/* fds.c - the calls that close or replace a descriptor, seen first.
 *
 * libtag holds no descriptor of its own while the program runs (log.c):
 * its lines go to fd 2 as long as fd 2 is the stderr the program started
 * with.  When the program closes or replaces fd 2 (coreutils close it at
 * exit, daemons point it at /dev/null), these wrappers let log.c keep a
 * duplicate first (_tag_log_keep_fd), so libtag's lines still reach the
 * stderr the program was started with - the only moment libtag ever
 * takes a descriptor in the program's table.  Each wrapper then does
 * exactly what the program asked, through the next definition (glibc's),
 * and returns its result and errno.
 *
 * glibc's own internal closes (inside fclose, freopen, exit) do not pass
 * through these symbols: that is why fclose and freopen are wrapped
 * themselves, on the stream stderr.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"
#include "base/log.h"

/* glibc exports these under a second name: no dlsym needed */
extern int __close(int fd);
extern int __dup2(int fd, int fd2);

/* The next definition of name (glibc's), looked up once.  dlsym is not
 * async-signal-safe: close and dup2, which a handler may call, never use
 * it. */
static void *next_fn(void **cache, const char *name)
{
    void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, name);
        __atomic_store_n(cache, f, __ATOMIC_RELEASE);
    }
    return f;
}

TAG_EXPORT int close(int fd)
{
    if (TAG_UNLIKELY(fd == 2))
        _tag_log_keep_fd(2);
    return __close(fd);
}

TAG_EXPORT int dup2(int fd, int fd2)
{
    if (TAG_UNLIKELY(fd2 == 2 && fd != 2))
        _tag_log_keep_fd(2);
    return __dup2(fd, fd2);
}

TAG_EXPORT int dup3(int fd, int fd2, int flags)
{
    if (TAG_UNLIKELY(fd2 == 2 && fd != 2))
        _tag_log_keep_fd(2);
    /* dup3 is no cancellation point: the system call is all it is */
    return (int)syscall(SYS_dup3, fd, fd2, flags);
}

TAG_EXPORT int close_range(unsigned first, unsigned last, int flags)
{
    static void *next;
    int (*f)(unsigned, unsigned, int) = (int (*)(unsigned, unsigned, int))next_fn(&next, "close_range");
    if (first <= 2 && 2 <= last)
        _tag_log_keep_fd(2);
    if (!f) {
        errno = ENOSYS;
        return -1;
    }
    return f(first, last, flags);
}

TAG_EXPORT void closefrom(int lowfd)
{
    static void *next;
    void (*f)(int) = (void (*)(int))next_fn(&next, "closefrom");
    if (lowfd <= 2)
        _tag_log_keep_fd(2);
    if (f)
        f(lowfd);
}

TAG_EXPORT int fclose(FILE *stream)
{
    static void *next;
    int (*f)(FILE *) = (int (*)(FILE *))next_fn(&next, "fclose");
    if (stream == stderr)
        _tag_log_keep_fd(2);
    return f(stream);
}

TAG_EXPORT FILE *freopen(const char *path, const char *mode, FILE *stream)
{
    static void *next;
    FILE *(*f)(const char *, const char *, FILE *) =
        (FILE * (*)(const char *, const char *, FILE *)) next_fn(&next, "freopen");
    if (stream == stderr)
        _tag_log_keep_fd(2);
    return f(path, mode, stream);
}
