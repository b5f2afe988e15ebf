/* overwrite.h - write past a block's end so that every byte changes.
 *
 * libtag reports an overflow at the first canary byte that no longer holds
 * its value, and the canary is random: a fixed value written over it
 * matches a canary byte 1 time in 256, and the report then names the next
 * byte (or, for one byte written, nothing).  Tests that expect the exact
 * address write through this instead of memset. */
#ifndef OVERWRITE_H
#define OVERWRITE_H
#include <stddef.h>
#include <stdio.h>

static inline void overwrite(void *at, unsigned char value, size_t n)
{
    volatile unsigned char *p = at;
    for (size_t i = 0; i < n; i++)
        p[i] = p[i] == value ? (unsigned char)~value : value;
}
/* Print "written=HEX" for the n bytes at at, after overwrite(): what the
 * report's "written" must say (0xbe where a canary byte held 0x41). */
static inline void print_written(const void *at, size_t n)
{
    const volatile unsigned char *p = at;
    printf("written=");
    for (size_t i = 0; i < n; i++)
        printf("%02x", p[i]);
    printf("\n");
    fflush(stdout);
}
#endif
