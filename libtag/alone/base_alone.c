/* base_alone.c - what a part of libtag takes from base/ and from the start
 * (life/control.c), for a program that uses the part alone: CMake's seams
 * (libtag_heap, libtag_stack_table, libtag_cfi, libtag_quarantine) link it,
 * and libtag/tests' unit tests and bench/'s floors link those.
 *
 *   _tag_ctl     zeros, but for what the program sets: the secret (the key
 *                of the heap's free links, of the tags' check values)
 *                before _tag_heap_init(), the thread records a quarantine
 *                reads;
 *   _tag_opt     zeros, but for what the program sets (the quarantine's
 *                budget and fill, the stack table's counters);
 *   _tag_log     the line on stderr, formatted on the stack (no malloc:
 *                a floor is the program's malloc);
 *   _tag_fatal   the same, then _exit(99) (a TAG_ASSERT of the debug build).
 *
 * Not libtag: no option parsing, no log destination, no snapshot.  Nothing
 * in libtag.so or libtag.a comes from this folder.
 */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/options.h"

struct libtag_control _tag_ctl;
struct tag_options _tag_opt;

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
