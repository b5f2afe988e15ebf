/* a64_worker.c - a plain program (no libtag) for the aarch64 tests: main
 * keeps a block in a global and starts a worker thread, which allocates in
 * its own arena and then writes through a null pointer three calls deep
 * (noinline functions, so that -O2 keeps every frame).  The kernel's (or
 * qemu-user's) core is read and its stack compared with gdb's.
 *
 * Facts, one per line, before the crash:
 *   pid PID
 *   held PTR      the 4000-byte block main keeps in `held`
 *   worker PTR    a 200-byte block the worker keeps in `kept`
 *   thread TID    the worker's thread id
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

void *held;
void *kept;
static int *volatile nowhere;

__attribute__((noinline)) void crash_here(int n)
{
    *nowhere = n;  /* SIGSEGV */
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void middle(int n)
{
    crash_here(n + 1);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void outer(int n)
{
    middle(n + 1);
    __asm__ volatile("" ::: "memory");
}

static void *worker(void *arg)
{
    (void)arg;
    kept = malloc(200);
    memset(kept, 0x77, 200);
    printf("worker %p\n", kept);
    printf("thread %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    outer(1);
    return NULL;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("pid %d\n", (int)getpid());
    held = malloc(4000);
    memset(held, 0x48, 4000);
    printf("held %p\n", held);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    return 0;
}
