/* rob_hostile.c - a heap that lies: the victim damages libtag's structures
 * itself, then snapshots (SIGUSR2), so the reader meets the damage in a real
 * core.  Used by tests/integration/test_hostile_heap.py.
 *
 *   rob_hostile MODE
 *     overflow   writes past a live block up to the end of the next block's
 *                tag: its canary, its slot's slack and the 16 bytes of the
 *                next slot's tag (32 bytes with libtag's 96-byte slots)
 *     control    overwrites counts and sizes of the control block through
 *                libtag_control(): stack_count and stack_capacity 0xffffffff,
 *                thread_capacity 0xffffffff, anomaly kind 77, reason 99
 *     sizes      overwrites the control block's tag_size (a layout no reader
 *                can trust)
 *     cycle      makes the innermost stack node of a block's allocation stack
 *                its own parent, and another's parent point above it
 *     truncate   lowers the control block's stack_count to 2: the stack
 *                table seems cut short
 *     shadow     points this thread's record at a shadow stack that is not
 *                mapped
 *
 * Prints "pid N", then "victim ADDR SIZE" (the block the damage is about),
 * "other ADDR SIZE" (an untouched block), "stack ID" where relevant, and
 * "done" after the snapshot.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libtag.h"
#include "tag_abi.h"

extern const void *libtag_control(void) __attribute__((weak));

static struct libtag_control *ctl(void)
{
    if (!libtag_control) {
        fprintf(stderr, "not under libtag\n");
        exit(3);
    }
    /* libtag's control block lives in its writable .bss: the const in the
     * API is a promise of libtag's, not a page protection. */
    return (struct libtag_control *)(uintptr_t)libtag_control();
}

__attribute__((noinline)) static void *alloc_victim(size_t n)
{
    void *p = malloc(n);
    memset(p, 'v', n);
    return p;
}

__attribute__((noinline)) static void *alloc_other(size_t n)
{
    void *p = malloc(n);
    memset(p, 'o', n);
    return p;
}

static uint32_t stack_of(const void *user)
{
    const struct libtag_tag *t = (const struct libtag_tag *)((const char *)user - sizeof(struct libtag_tag));
    return t->alloc_stack;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    printf("pid %d\n", (int)getpid());
    char *a = alloc_victim(64);
    char *b = alloc_other(64);
    printf("victim %p 64\n", (void *)a);
    printf("other %p 64\n", (void *)b);
    struct libtag_control *c = ctl();

    if (strcmp(mode, "overflow") == 0) {
        /* b is the next slot after a in libtag's heap (64 bytes + tag +
         * canary round to one 96-byte slot): the bytes from a's end to b
         * are a's canary, its slot's slack and b's tag. */
        if (b < a + 64 + sizeof(struct libtag_tag)) {
            fprintf(stderr, "the other block is not after the victim\n");
            return 2;
        }
        printf("smashed %p\n", (void *)b);
        memset(a + 64, 'X', (size_t)(b - a) - 64);
    } else if (strcmp(mode, "control") == 0) {
        c->stack_count = 0xffffffffu;
        c->stack_capacity = 0xffffffffu;
        c->thread_capacity = 0xffffffffu;
        c->anomaly.kind = 77;
        c->anomaly.address = (uint64_t)(uintptr_t)a;
        c->reason = 99;
    } else if (strcmp(mode, "sizes") == 0) {
        c->tag_size = 48;
    } else if (strcmp(mode, "cycle") == 0) {
        struct libtag_stack_node *nodes = (struct libtag_stack_node *)(uintptr_t)c->stack_nodes;
        uint32_t ia = stack_of(a), ib = stack_of(b);
        printf("stack %u %u\n", ia, ib);
        nodes[ia].parent = ia;          /* a node that is its own parent */
        nodes[ib].parent = ib + 5;      /* a link forward: into a cycle or the unknown */
    } else if (strcmp(mode, "truncate") == 0) {
        printf("stack %u\n", stack_of(a));
        c->stack_count = 2;
    } else if (strcmp(mode, "shadow") == 0) {
        struct libtag_thread *recs = (struct libtag_thread *)(uintptr_t)c->threads;
        for (uint32_t i = 0; i < c->thread_count; i++)
            recs[i].shadow = 0x10000;   /* the NULL page's neighbour: never mapped */
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    fflush(stdout);
    raise(SIGUSR2);
    printf("done\n");
    fflush(stdout);
    /* Leave without freeing: a free of the damaged blocks would be
     * libtag's anomaly, not the reader's problem this test is about. */
    _exit(0);
}
