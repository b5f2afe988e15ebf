/* uw_garbage.c - stacks full of garbage must end a walk, never fault it and
 * never give a frame.
 *
 * Built -O2 without frame pointers.  20000 times, with a random word each
 * time (any 64 bits, a small number, a heap pointer, an address on this
 * stack, 0):
 *   ra   smash_ra overwrites its own return address slot (CFA - 8) with the
 *        word, allocates, and puts the slot back: the walk reads the word
 *        where a return address should be.
 *   fp   fake_frame_alloc (no CFI) allocates with rbp pointing into 4 KiB
 *        of such words on this stack: a frame-pointer walk follows them.
 * Each block's stack must be the caller of malloc alone, or that and frames
 * none of which is one of the garbage words.  Prints "checked N bad M".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_reader.c"

#define ROUNDS 20000
#define KEEP() __asm__ volatile("" ::: "memory")

static uint64_t state = 0x2545f4914f6cdd1dull;
static uint64_t words[512];  /* every garbage word used, to check against */
static long checked, bad;

static uint64_t rnd(void)
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static uint64_t garbage(void *heap, void *stack)
{
    switch (rnd() % 5) {
    case 0: return rnd();
    case 1: return rnd() % 4096;
    case 2: return (uint64_t)(uintptr_t)heap + (rnd() % 64) * 8;
    case 3: return (uint64_t)(uintptr_t)stack + (rnd() % 512) * 8 - 2048;
    default: return 0;
    }
}

static void check(void *block, uint64_t *used, int nused)
{
    const struct libtag_tag *t = lt_tag(block);
    const struct libtag_control *c = lt_ctl();
    const struct libtag_stack_node *nodes =
        (const struct libtag_stack_node *)(uintptr_t)c->stack_nodes;
    int ok = t != NULL && t->alloc_stack != 0;
    for (uint32_t id = ok ? t->alloc_stack : 0; id && id < c->stack_count; id = nodes[id].parent)
        for (int i = 0; i < nused; i++)
            if (used[i] && nodes[id].pc == used[i])
                ok = 0;
    checked++;
    if (!ok)
        bad++;
}

/* Its own return address slot is CFA - 8: gcc knows the CFA without a
 * frame pointer. */
__attribute__((noipa)) static void *smash_ra(size_t n, uint64_t word)
{
    uint64_t *slot = (uint64_t *)__builtin_dwarf_cfa() - 1;
    uint64_t saved = *slot;
    *slot = word;
    KEEP();
    void *p = malloc(n);
    KEEP();
    *slot = saved;
    KEEP();
    return p;
}

/* malloc(n) with rbp = frame: no CFI, so only frame pointers can go on. */
void *fake_frame_alloc(size_t n, void *frame);
__asm__(".text\n"
        ".globl fake_frame_alloc\n"
        ".type fake_frame_alloc, @function\n"
        "fake_frame_alloc:\n"
        "  push %rbp\n"
        "  mov %rsi, %rbp\n"
        "  call malloc@PLT\n"
        "  pop %rbp\n"
        "  ret\n"
        ".size fake_frame_alloc, .-fake_frame_alloc\n");

__attribute__((noipa)) static void run_fp(void)
{
    uint64_t area[512];
    void *heap = malloc(64);
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < 512; i++)
            area[i] = words[i] = garbage(heap, area);
        void *p = fake_frame_alloc(32, &area[rnd() % 500]);
        check(p, words, 512);
        free(p);
    }
    free(heap);
}

__attribute__((noipa)) static void run_ra(void)
{
    void *heap = malloc(64);
    uint64_t here = 0;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t w = garbage(heap, &here);
        void *p = smash_ra(32, w);
        check(p, &w, 1);
        free(p);
    }
    free(heap);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "fp") == 0)
        run_fp();
    else
        run_ra();
    printf("checked %ld bad %ld\n", checked, bad);
    return 0;
}
