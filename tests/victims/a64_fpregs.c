/* a64_fpregs.c - FP registers in libtag's aarch64 cores (NT_FPREGSET;
 * tests/integration/test_aarch64_shadow.py).
 *
 *   snapshot  main sets d8 (callee-saved: the low half of v8 is kept
 *             across calls) to 0x0123456789abcdef and its FPCR's rounding
 *             mode to towards zero (0xc00000), then asks libtag for a
 *             snapshot: its registers are taken at the call (getcontext)
 *   crash     a worker thread sets v17 to 0x0123456789abcdef:
 *             0xfedcba9876543210 (high and low halves) and its FPCR's
 *             rounding mode to towards plus infinity (0x400000), then
 *             writes through a null pointer: its registers are the signal
 *             context's
 *
 * Prints "pid N" and, for crash, "worker T" (the worker's tid), then
 * "done" (snapshot).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

extern int libtag_snapshot(void) __attribute__((weak));

static void *worker(void *arg)
{
    printf("worker %u\n", (unsigned)syscall(SYS_gettid));
    void *volatile p = malloc(16);  /* a thread libtag knows (has a record of) */
    free(p);
    __asm__ volatile(
        "fmov d17, %[lo]\n\t"
        "mov v17.d[1], %[hi]\n\t"
        "msr fpcr, %[fpcr]\n\t"
        "mov x9, #0\n\t"
        "str xzr, [x9]\n\t"  /* the fault, with the registers as set */
        :
        : [lo] "r"(0xfedcba9876543210ull), [hi] "r"(0x0123456789abcdefull), [fpcr] "r"(0x400000ull)
        : "v17", "x9", "memory");
    return arg;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("pid %d\n", (int)getpid());
    if (argc > 1 && strcmp(argv[1], "crash") == 0) {
        pthread_t th;
        pthread_create(&th, NULL, worker, NULL);
        pthread_join(th, NULL);
        return 1;  /* not reached */
    }
    __asm__ volatile("fmov d8, %0\n\tmsr fpcr, %1" : : "r"(0x0123456789abcdefull), "r"(0xc00000ull) : "v8");
    if (libtag_snapshot)
        libtag_snapshot();
    __asm__ volatile("msr fpcr, %0" : : "r"(0ull));
    printf("done\n");
    return 0;
}
