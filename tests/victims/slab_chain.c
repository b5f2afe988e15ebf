/* slab_chain.c - a block kept alive through a chain, and a block held only
 * by a local variable: the retention paths whoowns must name.
 *
 *   slab_chain        print the facts, raise(SIGUSR2) (an on-demand snapshot
 *                     into $LIBTAG_DIR) from inside hold_on_stack, exit 0
 *   slab_chain abort  the same, but raise(SIGABRT): without libtag, the
 *                     kernel's core of a process glibc's heap answers for
 *
 * The chain: the global `registry` points at a table (a malloc'ed struct of
 * pointer slots), whose slot SLAB_SLOT points at a 4096-byte "slab page"
 * cut into 64 objects of 64 bytes, each free object's first word pointing
 * at the next (a free list inside the slab: 63 words of the slab pointing
 * into it).  Nothing else holds the table or the slab.
 *
 * The crowd: a block pointed to by every one of the CROWD words of another
 * block (held by the global `crowd_root`): CROWD referrers, no more.
 *
 * The stack root: hold_on_stack keeps its block in a local variable only
 * (its stack slot printed), and takes the snapshot while that frame is live.
 *
 * The caller-saved registers and the dead stack below the frames are zeroed
 * before the snapshot (as in who_addrs.c), so no stale copy is a root.
 *
 * The facts (one per line, addresses as 0x...):
 *
 *   pid PID
 *   main_tid TID
 *   registry ADDR           the global's address
 *   table ADDR SIZE         the table block
 *   slot ADDR OFFSET        the table's word that holds the slab, its offset
 *   slab ADDR SIZE          the slab page
 *   crowd ADDR SIZE         the block with CROWD referrers
 *   crowd_holder ADDR SIZE  the block whose every word points at it
 *   crowd_root ADDR         the global that holds crowd_holder
 *   freed ADDR SIZE         a block freed before the snapshot
 *   leaked ADDR SIZE        a live block whose only pointer was dropped
 *   stack_block ADDR SIZE   the block held by hold_on_stack's local only
 *   stack_slot ADDR         that local's address
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "scrub.h"  /* scrub, scrub_registers */

#define SLAB_SIZE 4096
#define OBJ_SIZE 64
#define SLAB_SLOT 5
#define CROWD 250
#define CROWD_SIZE 40
#define STACK_BLOCK_SIZE 48
#define FREED_SIZE 24
#define LEAKED_SIZE 56

struct table {
    long count;
    void *slots[15];
};

struct table *registry;
void **crowd_root;

__attribute__((noinline)) static void build_chain(void)
{
    struct table *t = calloc(1, sizeof *t);
    char *slab = malloc(SLAB_SIZE);
    memset(slab, 0, SLAB_SIZE);
    for (int i = 0; i + 1 < SLAB_SIZE / OBJ_SIZE; i++) {
        char *next = slab + (i + 1) * OBJ_SIZE;
        memcpy(slab + i * OBJ_SIZE, &next, sizeof next);
    }
    t->slots[SLAB_SLOT] = slab;
    t->count = 1;
    registry = t;
}

__attribute__((noinline)) static void build_crowd(void)
{
    void *popular = malloc(CROWD_SIZE);
    memset(popular, 0x22, CROWD_SIZE);
    void **holder = malloc(CROWD * sizeof(void *));
    for (int i = 0; i < CROWD; i++)
        holder[i] = popular;
    crowd_root = holder;
}

__attribute__((noinline)) static void leak_one(void)
{
    char *lost = malloc(LEAKED_SIZE);
    memset(lost, 0x44, LEAKED_SIZE);
    printf("leaked %p %d\n", (void *)lost, LEAKED_SIZE);
}

__attribute__((noinline)) static void report(void)
{
    printf("registry %p\n", (void *)&registry);
    printf("table %p %zu\n", (void *)registry, sizeof *registry);
    printf("slot %p %zu\n", (void *)&registry->slots[SLAB_SLOT],
           offsetof(struct table, slots) + SLAB_SLOT * sizeof(void *));
    printf("slab %p %d\n", registry->slots[SLAB_SLOT], SLAB_SIZE);
    printf("crowd %p %d\n", crowd_root[0], CROWD_SIZE);
    printf("crowd_holder %p %zu\n", (void *)crowd_root, CROWD * sizeof(void *));
    printf("crowd_root %p\n", (void *)&crowd_root);
}


/* Holds its block in a local only, and snapshots while its frame is live. */
__attribute__((noinline)) static void hold_on_stack(int sig)
{
    void *volatile mine = malloc(STACK_BLOCK_SIZE);
    memset(mine, 0x33, STACK_BLOCK_SIZE);
    printf("stack_block %p %d\n", mine, STACK_BLOCK_SIZE);
    printf("stack_slot %p\n", (void *)&mine);
    fflush(stdout);
    scrub();
    scrub_registers();
    raise(sig);
    free(mine);
}

int main(int argc, char **argv)
{
    int sig = argc > 1 && strcmp(argv[1], "abort") == 0 ? SIGABRT : SIGUSR2;
    printf("pid %d\n", (int)getpid());
    printf("main_tid %d\n", (int)syscall(SYS_gettid));
    void *gone = malloc(FREED_SIZE);
    printf("freed %p %d\n", gone, FREED_SIZE);
    free(gone);
    leak_one();
    build_chain();
    build_crowd();
    report();
    scrub();
    hold_on_stack(sig);
    return 0;
}
