/* log.c - libtag's only way to say something: format into a stack buffer
 * and write(2) it.  Async-signal-safe: no locks, no malloc, no stdio, so it
 * may be called from the malloc path, signal handlers and the fork child. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

#include "libtag_internal.h"

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

static void vlog(const char *fmt, va_list ap)
{
    char buf[512];
    int saved = errno;
    size_t n = vformat(buf, sizeof buf - 1, fmt, ap);
    buf[n++] = '\n';
    for (size_t off = 0; off < n;) {
        ssize_t w = write(2, buf + off, n - off);
        if (w <= 0 && errno != EINTR)
            break;
        if (w > 0)
            off += (size_t)w;
    }
    errno = saved;
}

void _tag_log(const char *fmt, ...)
{
    if (_tag_opt.quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void _tag_fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
    abort();
}
