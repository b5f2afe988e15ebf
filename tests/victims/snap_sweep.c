/* snap_sweep: overflow a block that is never freed until the end, then run
 * instrumented code; libtag's periodic sweep (LIBTAG_SWEEP enters) must catch
 * the smashed canary without waiting for free(), and free() at the end must
 * not report the same overflow a second time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "overwrite.h"

static volatile unsigned long sink;

__attribute__((noinline)) static char *make_buffer(size_t n) { return malloc(n); }

__attribute__((noinline)) static void busy_step(unsigned long i) { sink += i; }

int main(void)
{
    char *volatile b = make_buffer(40);
    printf("address=%p\n", (void *)b);
    fflush(stdout);
    memset(b, 'x', 40);
    overwrite(b + 40, 'x', 8);  /* 8 bytes past the end: the canary */
    print_written(b + 40, 8);
    for (unsigned long i = 0; i < 20000; i++)
        busy_step(i);
    free(b);
    puts("survived");
    return 0;
}
