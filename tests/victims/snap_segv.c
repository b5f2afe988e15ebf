/* snap_segv.c - dies of SIGSEGV at a known address.
 *
 *   snap_segv plain     prints "fault=0x..." and dereferences it
 *   snap_segv handler   the same with its own SIGSEGV handler installed with
 *                       sigaction(): the handler prints "handler called
 *                       signal=11 addr=0x..." and _exit(3)s
 *
 * A few blocks are live at the crash, so the core has tags to read.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAULT_ADDR ((volatile int *)(uintptr_t)0xdead0000ul)

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    char buf[96];
    int n = snprintf(buf, sizeof buf, "handler called signal=%d addr=%p\n", sig, si->si_addr);
    write(1, buf, (size_t)n);
    _exit(3);
}

__attribute__((noinline)) static int crash_here(volatile int *where)
{
    return *where;
}

int main(int argc, char **argv)
{
    void *keep[8];
    for (int i = 0; i < 8; i++) {
        keep[i] = malloc(100 + (size_t)i);
        memset(keep[i], i, 100);
    }
    if (argc > 1 && !strcmp(argv[1], "handler")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
    }
    printf("fault=%p\n", (void *)FAULT_ADDR);
    fflush(stdout);
    int v = crash_here(FAULT_ADDR);
    printf("not reached %d %p\n", v, keep[0]);
    return 0;
}
