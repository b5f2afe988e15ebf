/* who_crash.c - dies of SIGSEGV at an address whose owner is known.
 *
 *   who_crash null       main:           crash_read(16)  - the NULL page
 *   who_crash wild       a worker thread: crash_read(0xdead0000) - no mapping
 *   who_crash rodata     main:           crash_write(a string literal) - the
 *                                        program's read-only mapping
 *   who_crash heap       main:           call_block(p) jumps into a live heap
 *                                        block made by code_block <- main
 *                                        (not executable: faults at p itself)
 *
 * Prints "tid N" (the thread that faults), "fault=0x..." (the address the
 * kernel will report) and, for heap, "block=0x... SIZE"; then faults.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BLOCK_SIZE 64

static const char *const rodata_text = "read-only text";

static void announce(const volatile void *fault)
{
    printf("tid %ld\nfault=%p\n", (long)syscall(SYS_gettid), (const void *)fault);
    fflush(stdout);
}

__attribute__((noinline)) static int crash_read(const volatile int *where)
{
    return *where;
}

__attribute__((noinline)) static void crash_write(volatile char *where)
{
    *where = 'X';
}

__attribute__((noinline)) static void call_block(void *block)
{
    void (*fn)(void) = (void (*)(void))block;
    fn();
}

__attribute__((noinline)) static void *code_block(void)
{
    char *p = malloc(BLOCK_SIZE);
    memset(p, 0xc3, BLOCK_SIZE);  /* ret: harmless were the heap executable */
    return p;
}

__attribute__((noinline)) static void *worker_crash(void *arg)
{
    (void)arg;
    const volatile int *where = (const volatile int *)(uintptr_t)0xdead0000ul;
    announce(where);
    crash_read(where);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    void *keep = malloc(32);  /* a live block besides, so there are tags */
    memset(keep, 1, 32);
    if (!strcmp(mode, "null")) {
        const volatile int *where = (const volatile int *)(uintptr_t)16;
        announce(where);
        crash_read(where);
    } else if (!strcmp(mode, "wild")) {
        pthread_t th;
        pthread_create(&th, NULL, worker_crash, NULL);
        pthread_join(th, NULL);
    } else if (!strcmp(mode, "rodata")) {
        volatile char *where = (volatile char *)rodata_text;
        announce(where);
        crash_write(where);
    } else if (!strcmp(mode, "heap")) {
        void *p = code_block();
        printf("block=%p %d\n", p, BLOCK_SIZE);
        announce(p);
        call_block(p);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    printf("not reached %p\n", keep);
    return 0;
}
