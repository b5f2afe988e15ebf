/* leak_shapes.c - a victim that builds one heap structure of each leak shape,
 * prints every block with the kind a leak checker must give it, then looks at
 * itself: a libtag snapshot (raise(SIGUSR2)) or valgrind's leak check
 * (VALGRIND_DO_LEAK_CHECK), at the same point of the program.
 *
 *   leak_shapes snapshot|valgrind|abort
 *
 * (abort: raise(SIGABRT) at that point instead - the kernel's core of a
 * process that never ran libtag, read from glibc's heap.)
 *
 * Shapes, each allocated from its own function so each has its own stack:
 *   list      5 nodes of 48 B, the head pointer dropped: head definite, 4 indirect
 *   ring      3 nodes of 64 B pointing round in a cycle, nothing points in:
 *             the lowest-addressed node definite, the other 2 indirect
 *   global    72 B pointed to only by a global: reachable
 *   stack     88 B pointed to only from a worker thread's stack: reachable
 *   interior  100 B pointed to only by a global holding start+40: possible
 *   register  120 B held only in register r12 of a worker thread blocked in a
 *             read(2) system call: reachable
 *
 * Prints "block SHAPE ADDR SIZE" per block and "thread SHAPE TID" per worker,
 * then "ready", then takes the look.  Builders print; main never holds a
 * pointer to a block, and a scrub of the dead stack below main's frame
 * removes the builders' stale copies.
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

#include "scrub.h"
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#else  /* valgrind's headers not installed: the "valgrind" mode cannot run anyway */
#define VALGRIND_DO_LEAK_CHECK abort()
#endif

#define NOINLINE __attribute__((noinline))

struct node {
    struct node *next;
    char pad[40];  /* 48 bytes */
};

struct ring {
    struct ring *next;
    char pad[56];  /* 64 bytes */
};

void *g_keep;      /* the "global" shape */
char *g_interior;  /* the "interior" shape: start + 40 */

static int stack_pipe[2], reg_pipe[2], ready_pipe[2];
static char sink;

static void report(const char *shape, void *p, size_t size)
{
    printf("block %s %#lx %zu\n", shape, (unsigned long)(uintptr_t)p, size);
    fflush(stdout);
}

NOINLINE static struct node *new_list_node(void) { return calloc(1, sizeof(struct node)); }

NOINLINE static void make_list(void)
{
    struct node *head = NULL;
    for (int i = 0; i < 5; i++) {
        struct node *n = new_list_node();
        n->next = head;
        head = n;
        report("list", n, sizeof *n);
    }
    printf("head list %#lx\n", (unsigned long)(uintptr_t)head);
}

NOINLINE static struct ring *new_ring_node(void) { return calloc(1, sizeof(struct ring)); }

NOINLINE static void make_ring(void)
{
    struct ring *first = NULL, *prev = NULL;
    for (int i = 0; i < 3; i++) {
        struct ring *r = new_ring_node();
        report("ring", r, sizeof *r);
        if (prev)
            prev->next = r;
        else
            first = r;
        prev = r;
    }
    prev->next = first;
}

NOINLINE static void *alloc_global_only(void) { return calloc(1, 72); }

NOINLINE static void make_global(void)
{
    g_keep = alloc_global_only();
    report("global", g_keep, 72);
}

NOINLINE static void *alloc_interior_only(void) { return calloc(1, 100); }

NOINLINE static void make_interior(void)
{
    char *p = alloc_interior_only();
    g_interior = p + 40;
    report("interior", p, 100);
}

NOINLINE static void *alloc_stack_only(void) { return calloc(1, 88); }

static void say_ready(void)
{
    char c = 'r';
    if (write(ready_pipe[1], &c, 1) != 1)
        abort();
}

static void *stack_worker(void *arg)
{
    (void)arg;
    void *volatile keep = alloc_stack_only();  /* the one copy: this stack slot */
    report("stack", keep, 88);
    printf("thread stack %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    say_ready();
    char c;
    while (read(stack_pipe[0], &c, 1) < 0)
        ;
    free(keep);
    return NULL;
}

NOINLINE static void *alloc_register_only(void) { return calloc(1, 120); }

static void *register_worker(void *arg)
{
    (void)arg;
    uintptr_t p = (uintptr_t)alloc_register_only();
    /* report it masked: no stack slot may hold the pointer itself */
    uintptr_t masked = p ^ 0x5a5a5a5a5a5a5a5aull;
    printf("block register %#lx %d\n", (unsigned long)(masked ^ 0x5a5a5a5a5a5a5a5aull), 120);
    printf("thread register %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    say_ready();
    /* From here the pointer lives in r12 only: read(2) by a raw system call
     * (which keeps every register but rax, rcx and r11), retried on EINTR. */
    __asm__ volatile(
        "mov %0, %%r12\n\t"
        "xor %0, %0\n\t"
        "1:\n\t"
        "xor %%eax, %%eax\n\t"          /* SYS_read */
        "mov %1, %%edi\n\t"
        "lea %2, %%rsi\n\t"
        "mov $1, %%edx\n\t"
        "syscall\n\t"
        "cmp $-4, %%rax\n\t"            /* -EINTR */
        "je 1b\n\t"
        "mov %%r12, %0\n\t"
        : "+r"(p)
        : "r"(reg_pipe[0]), "m"(sink)
        : "rax", "rcx", "r11", "rdi", "rsi", "rdx", "r12", "memory");
    free((void *)p);
    return NULL;
}

/* Zero the dead stack below main's frame, where the builders' frames (and
 * their copies of the pointers) were. */
int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: leak_shapes snapshot|valgrind|abort\n");
        return 2;
    }
    if (pipe(stack_pipe) || pipe(reg_pipe) || pipe(ready_pipe))
        return 1;
    printf("pid %d\n", getpid());
    make_list();
    make_ring();
    make_global();
    make_interior();
    pthread_t ts, tr;
    pthread_create(&ts, NULL, stack_worker, NULL);
    pthread_create(&tr, NULL, register_worker, NULL);
    char c;
    for (int i = 0; i < 2; i++)
        if (read(ready_pipe[0], &c, 1) != 1)
            return 1;
    usleep(100 * 1000);  /* let both workers reach their read(2) */
    printf("ready\n");
    fflush(stdout);
    scrub();
    if (strcmp(argv[1], "valgrind") == 0)
        VALGRIND_DO_LEAK_CHECK;
    else if (strcmp(argv[1], "abort") == 0)
        raise(SIGABRT);
    else
        raise(SIGUSR2);
    if (write(stack_pipe[1], "x", 1) != 1 || write(reg_pipe[1], "x", 1) != 1)
        return 1;
    pthread_join(ts, NULL);
    pthread_join(tr, NULL);
    printf("done\n");
    return 0;
}
