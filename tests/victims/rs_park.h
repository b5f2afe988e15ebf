/* rs_park.h - for the reader's stack victims (rs_*.c, rs_*.cc): wait until
 * a thread of this process is blocked in read(2), so a snapshot or a gdb
 * stop finds it where the victim says it parks. */
#ifndef RS_PARK_H
#define RS_PARK_H

#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static inline pid_t rs_gettid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

static inline void rs_nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

/* tid is in read(2): /proc says system call 0 */
static inline void rs_wait_in_read(pid_t tid)
{
    char path[64], buf[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    for (;;) {
        int fd = open(path, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        if (n > 1 && buf[0] == '0' && buf[1] == ' ')
            return;
        rs_nap();
    }
}

#endif /* RS_PARK_H */
