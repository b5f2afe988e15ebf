/* hookbench.c - the cost of the -finstrument-functions hooks alone.
 *
 * A recursive function and nothing else: no allocation after the first, so
 * under libtag only the enter and exit hooks run, around every call.
 * "alt" installs an alternate signal stack first (sigaltstack), as many
 * services do for their crash handlers.
 *
 *   gcc -O2 -finstrument-functions -o hookbench bench/hookbench.c
 *   time ./hookbench plain 38;  time LD_PRELOAD=libtag.so ./hookbench plain 38
 *   time ./hookbench alt 38;    time LD_PRELOAD=libtag.so ./hookbench alt 38
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) static long fib(int n)
{
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "alt") == 0) {
        static char stack[64 * 1024];
        stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
        if (sigaltstack(&ss, NULL) != 0) {
            perror("sigaltstack");
            return 1;
        }
    }
    free(malloc(10));  /* libtag registers the thread */
    printf("%ld\n", fib(argc > 2 ? atoi(argv[2]) : 36));
    return 0;
}
