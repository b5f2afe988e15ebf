/* uw_crash.c - dies in code built -O2 without frame pointers, so the crash
 * record's stack (libtag unwinds it from the signal's context) can be
 * compared with gdb's bt on the core.
 *
 *   uw_crash thread   a worker thread writes to FAULT_ADDR two calls deep
 *   uw_crash abort    main calls abort() two calls deep
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAULT_ADDR ((volatile int *)0xdead0000)
#define KEEP() __asm__ volatile("" ::: "memory")

__attribute__((noipa)) static void crash_here(int v)
{
    *FAULT_ADDR = v;
    KEEP();
}

__attribute__((noipa)) static void deeper(int v)
{
    crash_here(v + 1);
    KEEP();
}

__attribute__((noipa)) static void *worker(void *arg)
{
    deeper((int)(long)arg);
    KEEP();
    return NULL;
}

__attribute__((noipa)) static void give_up(void)
{
    abort();
}

__attribute__((noipa)) static void check(int ok)
{
    if (!ok)
        give_up();
    KEEP();
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    free(malloc(10));  /* libtag is up */
    if (argc > 1 && strcmp(argv[1], "abort") == 0) {
        check(0);
    } else {
        pthread_t th;
        pthread_create(&th, NULL, worker, (void *)41L);
        pthread_join(th, NULL);
    }
    return 0;
}
