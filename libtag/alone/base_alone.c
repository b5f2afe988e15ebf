/* heap_alone.c - what libtag's heap takes from the rest of libtag, for a
 * program that uses the heap alone: CMake's libtag_heap target links it
 * with src/heap.c, and libtag/tests' unit tests and bench/'s floors link
 * that.  src/heap.h lists the three:
 *
 *   _tag_ctl     zeros, but for what the program sets: the secret (the
 *                key of the free blocks' links) before _tag_heap_init();
 *   _tag_log     the line on stderr, formatted on the stack (no malloc:
 *                a floor is the program's malloc);
 *   _tag_fatal   the same, then _exit(99) (a TAG_ASSERT of the debug build).
 *
 * Not libtag: no options, no log destination, no snapshot.  Nothing in
 * libtag.so or libtag.a comes from this folder.
 */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "heap/heap.h"

struct libtag_control _tag_ctl;

static void say(const char *fmt, va_list ap)
{
    char line[256];
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    (void)!write(2, line, (size_t)n);
}

void _tag_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say(fmt, ap);
    va_end(ap);
}

void _tag_fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say(fmt, ap);
    va_end(ap);
    _exit(99);
}
