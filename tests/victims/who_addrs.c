/* who_addrs.c - a program that knows the answer to "who owns this address?"
 * for every kind of address, prints it, then snapshots itself.
 *
 *   who_addrs snapshot   print the facts, raise(SIGUSR2) (an on-demand
 *                        snapshot into $LIBTAG_DIR), exit 0
 *   who_addrs wait       print the facts and "ready pid=N" last, then block
 *                        in read(0) until stdin closes (for whoowns --pid)
 *
 * The facts (one per line, addresses as 0x...):
 *
 *   pid PID
 *   main_tid TID                   the main thread
 *   worker_tid TID                 the thread that allocated the freed block
 *   live ADDR SIZE                 allocated by main: alloc_target <- setup_target <- main
 *   freed ADDR SIZE                allocated by the worker: worker_alloc <- worker_main,
 *                                  freed by main: release_freed <- main
 *   holder ADDR                    a live block that holds the live block's pointer
 *   ref_global ADDR                the global word holding the live block's pointer
 *   ref_heap ADDR                  the word inside holder holding it
 *   ref_stack ADDR                 main's stack slot holding it
 *   stack ADDR                     a stack variable of main (no block)
 *   global ADDR                    a global array of this program (no block)
 *
 * The live block's pointer is held by exactly those three words (and, inside
 * the block itself, one word that points 16 bytes into it): the program
 * never keeps it anywhere else, it clears the caller-saved registers and the
 * dead stack below main's frame before the snapshot, so a conservative scan
 * finds three referrers and no more.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "scrub.h"  /* scrub, scrub_registers */

#define LIVE_SIZE 100
#define FREED_SIZE 72

static void *g_ref;               /* referrer 1: a global */
static char g_plain[64];          /* a global that is no block */
static void *g_freed;             /* the worker's block, until main frees it */
static pid_t g_worker_tid;

static pid_t tid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

__attribute__((noinline)) static void *worker_alloc(void)
{
    char *p = malloc(FREED_SIZE);
    memset(p, 0x5a, FREED_SIZE);
    return p;
}

__attribute__((noinline)) static void *worker_main(void *arg)
{
    (void)arg;
    g_worker_tid = tid();
    g_freed = worker_alloc();
    return NULL;
}

__attribute__((noinline)) static void release_freed(void *p)
{
    free(p);
}

__attribute__((noinline)) static char *alloc_target(void)
{
    char *p = malloc(LIVE_SIZE);
    memset(p, 0x11, LIVE_SIZE);
    /* one word of the block points into the block itself (self_ref): not a
     * referrer, only counted */
    char *self = p + 16;
    memcpy(p + 48, &self, sizeof self);
    return p;
}

/* Allocates the target and stores its pointer in the three holders only;
 * prints the target through a byte-wise copy so the full pointer does not
 * linger in printf's registers. */
__attribute__((noinline)) static void setup_target(void **holder, void **stack_slot)
{
    char *p = alloc_target();
    g_ref = p;
    holder[3] = p;
    *stack_slot = p;
    unsigned char bytes[sizeof p];
    memcpy(bytes, (void *)&g_ref, sizeof bytes);
    printf("live 0x");
    int started = 0;
    for (int i = (int)sizeof bytes - 1; i >= 0; i--) {
        if (!started && bytes[i] == 0)
            continue;
        printf(started ? "%02x" : "%x", bytes[i]);
        started = 1;
    }
    printf(" %d\n", LIVE_SIZE);
}


int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "snapshot";
    void *volatile slot = NULL;       /* referrer 3: main's stack */
    volatile long local = 42;         /* a stack variable that is no block */

    printf("pid %d\n", (int)getpid());
    printf("main_tid %d\n", (int)tid());

    pthread_t th;
    pthread_create(&th, NULL, worker_main, NULL);
    pthread_join(th, NULL);
    printf("worker_tid %d\n", (int)g_worker_tid);
    printf("freed %p %d\n", g_freed, FREED_SIZE);
    release_freed(g_freed);

    void **holder = calloc(8, sizeof(void *));   /* referrer 2: a live block */
    setup_target(holder, (void **)&slot);
    printf("holder %p\n", (void *)holder);
    printf("ref_global %p\n", (void *)&g_ref);
    printf("ref_heap %p\n", (void *)&holder[3]);
    printf("ref_stack %p\n", (void *)&slot);
    printf("stack %p\n", (void *)&local);
    printf("global %p\n", (void *)&g_plain[8]);
    g_plain[8] = (char)local;

    if (strcmp(mode, "wait") == 0) {
        printf("ready pid=%d\n", (int)getpid());
        fflush(stdout);
        scrub();
        scrub_registers();
        char c;
        while (read(0, &c, 1) > 0)
            ;
    } else {
        fflush(stdout);
        scrub();
        scrub_registers();
        raise(SIGUSR2);
    }
    return 0;
}
