/* log.h - libtag's own lines (log.c): formatted into a stack buffer and
 * written with write(2) where LIBTAG_LOG says.  base/base.h includes it. */
#ifndef LIBTAG_LOG_H
#define LIBTAG_LOG_H

#include <stddef.h>
#include "base/base.h"

/* Format into a stack buffer and write(2) it where LIBTAG_LOG says:
 * %s %d %u %x %p %lu %lx.  Async-signal-safe: no locks, no malloc, no stdio.
 * _tag_log_always also writes under LIBTAG_QUIET=1 (the stats line) and,
 * like _tag_fatal, to stderr under LIBTAG_LOG=off (a bad option). */
TAG_COLD void _tag_log_init(void);  /* note what fd 2 is; after the options */
/* fds.c: the program is about to close or replace descriptor fd (log.c
 * keeps a duplicate of fd 2 if it still is the stderr of the start). */
void _tag_log_keep_fd(int fd);
void _tag_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void _tag_log_always(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void _tag_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Format into buf (always NUL-terminated); returns the length. */
size_t _tag_format(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* LIBTAG_LOG_H */
