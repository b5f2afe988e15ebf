/* scrub.h - clear the dead stack below the caller's frame, so that stale
 * copies of pointers the program dropped (left there by the functions it
 * called) do not make a lost block look reachable to a conservative scan. */
#ifndef VICTIM_SCRUB_H
#define VICTIM_SCRUB_H
#include <string.h>

__attribute__((noinline)) static void scrub(void)
{
    volatile char buf[64 * 1024];
    memset((char *)buf, 0, sizeof buf);
    __asm__ volatile("" : : "r"(buf) : "memory");
}
#endif
