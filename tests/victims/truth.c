/* truth.c - programs that know the answer forensics must give, and print it.
 *
 *   truth snapshot     a live block held only by the global kv_inst (at
 *                      kv_inst+8), a freed block; an on-demand snapshot
 *                      (raise(LIBTAG_SIGNAL)), exit 0.  Prints:
 *                        pid PID / tid TID
 *                        live ADDR SIZE        make_value <- main
 *                        kv_inst ADDR          the global struct; .value at +8
 *                        freed ADDR SIZE       make_value <- main, freed by drop <- main
 *                        res_ms MS             CLOCK_MONOTONIC_COARSE resolution, ms (ceil)
 *                        t_alloc_before MS / t_alloc_after MS / t_free_before MS /
 *                        t_free_after MS / t_snapshot MS: CLOCK_REALTIME, ms since the epoch
 *   truth freed-ptr    reads a field of a node through the `next` pointer of
 *                      a node it freed: the pointer is the free pattern
 *                      0xfdfd..., a non-canonical address, so the kernel
 *                      raises SIGSEGV as a general-protection fault with no
 *                      address (SI_KERNEL).  Prints pid, tid, "node ADDR SIZE"
 *                      (the freed node whose field held the pointer) first.
 *   truth freed-arg    the same pointer, loaded by main from the freed node
 *                      and passed to id_of, which dereferences it: the load
 *                      is in the caller.  Prints what freed-ptr prints.
 *   truth wild         a live node whose `next` holds 0x4141414141414141
 *                      (not libtag's pattern, in no block): next_id faults
 *                      the same way, and no freed block explains it.  Prints
 *                      pid, tid, "node ADDR SIZE" (the live node) first.
 *   truth abort        abort() in do_abort <- main.  Prints pid, tid first.
 *   truth uaf          frees four 64-byte blocks, then writes through the
 *                      dangling pointers at offsets 0, 8, 24 and 63 (the
 *                      last byte), and takes an on-demand snapshot before
 *                      libtag evicts them.  Prints "uaf ADDR OFFSET BYTES" per
 *                      block (BYTES: hex of what was written).
 *
 * Built with -DREBUILT, a function comes first in the text, so every
 * function of the first build sits at another address: the "rebuilt binary"
 * whose names must never be given to the first build's core.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LIVE_SIZE 40
#define FREED_SIZE 56

struct kv {
    long key;
    char *value;
};

struct kv kv_inst = {7, NULL};

#ifdef REBUILT
__attribute__((noinline)) int rebuilt_pad(int x)
{
    volatile int acc = x;
    for (int i = 0; i < 100; i++)
        acc = acc * 31 + i;
    return acc;
}
#endif

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

__attribute__((noinline)) static char *make_value(size_t size)
{
    char *p = malloc(size);
    memset(p, 0x33, size);
    return p;
}

__attribute__((noinline)) static void drop(void *p)
{
    free(p);
}

struct node {
    long id;
    struct node *next;
    char pad[32];
};

/* The pointer n->next is loaded from n, then dereferenced: the base
 * register of the faulting load came from n + 8. */
__attribute__((noinline)) static long next_id(struct node *n)
{
    return n->next->id;
}

/* A node whose next points at a second node, printed ("node ADDR SIZE")
 * and then freed: its words hold libtag's free pattern.  Always inlined and
 * never instrumented: its allocations and free are main's, as the tests'
 * stacks say. */
static inline __attribute__((always_inline, no_instrument_function)) struct node *freed_node(void)
{
    struct node *n = malloc(sizeof *n);
    n->id = 1;
    n->next = malloc(sizeof *n);
    n->next->id = 2;
    printf("node %p %d\n", (void *)n, (int)sizeof *n);
    fflush(stdout);
    drop(n);
    return n;
}

/* The pointer is an argument: the load that produced it is the caller's. */
__attribute__((noipa)) static long id_of(struct node *m)
{
    return m->id;
}

__attribute__((noinline)) static void do_abort(void)
{
    abort();
}

static void take_snapshot(void)
{
    fflush(stdout);
    raise(SIGUSR2);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "snapshot";
    printf("pid %d\ntid %d\n", (int)getpid(), (int)syscall(SYS_gettid));
#ifdef REBUILT
    printf("pad %d\n", rebuilt_pad(argc));
#endif
    if (strcmp(mode, "snapshot") == 0) {
        struct timespec res;
        clock_getres(CLOCK_MONOTONIC_COARSE, &res);
        printf("res_ms %ld\n", (res.tv_nsec + 999999) / 1000000);
        printf("t_alloc_before %ld\n", now_ms());
        kv_inst.value = make_value(LIVE_SIZE);
        printf("t_alloc_after %ld\n", now_ms());
        char *gone = make_value(FREED_SIZE);
        printf("t_free_before %ld\n", now_ms());
        drop(gone);
        printf("t_free_after %ld\n", now_ms());
        printf("live %p %d\nkv_inst %p\nfreed %p %d\n", (void *)kv_inst.value, LIVE_SIZE,
               (void *)&kv_inst, (void *)gone, FREED_SIZE);
        printf("t_snapshot %ld\n", now_ms());
        take_snapshot();
        return 0;
    }
    if (strcmp(mode, "freed-ptr") == 0) {
        struct node *n = freed_node();
        printf("id %ld\n", next_id(n));
        return 0;
    }
    if (strcmp(mode, "freed-arg") == 0) {
        struct node *n = freed_node();
        printf("id %ld\n", id_of(n->next));
        return 0;
    }
    if (strcmp(mode, "wild") == 0) {
        struct node *n = malloc(sizeof *n);
        n->id = 1;
        memset(&n->next, 0x41, sizeof n->next);
        printf("node %p %d\n", (void *)n, (int)sizeof *n);
        fflush(stdout);
        printf("id %ld\n", next_id(n));
        return 0;
    }
    if (strcmp(mode, "abort") == 0) {
        fflush(stdout);
        do_abort();
    }
    if (strcmp(mode, "uaf") == 0) {
        static const int offsets[] = {0, 8, 24, 63};
        unsigned char *blocks[4];
        for (int i = 0; i < 4; i++)
            blocks[i] = (unsigned char *)make_value(64);
        for (int i = 0; i < 4; i++)
            drop(blocks[i]);
        for (int i = 0; i < 4; i++) {
            unsigned char *at = blocks[i] + offsets[i];
            at[0] = (unsigned char)(0x41 + i);
            if (offsets[i] < 63)
                at[1] = 0x00;
            printf("uaf %p %d %02x%s\n", (void *)blocks[i], offsets[i], 0x41 + i,
                   offsets[i] < 63 ? "00" : "");
        }
        take_snapshot();
        return 0;
    }
    fprintf(stderr, "truth: unknown mode %s\n", mode);
    return 2;
}
