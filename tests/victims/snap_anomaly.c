/* snap_anomaly.c - one heap misuse of the kind named by argv[1]:
 *
 *   double-free            free(p) twice
 *   invalid-free-stack     free() of a stack address
 *   invalid-free-interior  free() of p + 32, inside a live block
 *   heap-overflow          write 8 bytes past the end of p, then free(p)
 *   use-after-free         write into p after free(p), then free enough other
 *                          blocks to push p out of the quarantine (run it with
 *                          a small LIBTAG_QUARANTINE, e.g. 4096)
 *
 * Prints "address=0x..." (the address the anomaly is about: the pointer
 * passed to free(), or the first byte written where it must not be) and,
 * when a block is involved, "block=0x..." before the misuse, and "survived"
 * after it, then exits 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "overwrite.h"

static void say(void *p)
{
    printf("address=%p\n", p);
    fflush(stdout);
}

static void say_block(void *p)
{
    printf("block=%p\n", p);
    fflush(stdout);
}

__attribute__((noinline)) static void do_double_free(void)
{
    char *p = malloc(48);
    memset(p, 1, 48);
    free(p);
    say(p);
    say_block(p);
    free(p);
}

__attribute__((noinline)) static void do_invalid_free_stack(void)
{
    _Alignas(16) char local[64];
    memset(local, 2, sizeof local);
    void *volatile p = local + 32;
    say(p);
    free(p);
}

__attribute__((noinline)) static void do_invalid_free_interior(void)
{
    char *p = malloc(128);
    memset(p, 3, 128);
    char *volatile q = p + 32;
    say(q);
    free(q);
    free(p);
}

__attribute__((noinline)) static void do_heap_overflow(void)
{
    char *p = malloc(40);
    char *volatile end = p + 40;
    say(end);
    say_block(p);
    overwrite(end, 0x41, 8);
    free(p);
}

__attribute__((noinline)) static void do_use_after_free(void)
{
    char *p = malloc(64);
    memset(p, 4, 64);
    free(p);
    say(p + 40);
    say_block(p);
    char *volatile dangling = p;
    dangling[40] = 0x42;   /* in the fill pattern */
    for (int i = 0; i < 256; i++) {  /* 256 x 64 bytes > a small quarantine */
        char *volatile q = malloc(64);  /* volatile: gcc drops free(malloc()) */
        free(q);
    }
}

int main(int argc, char **argv)
{
    const char *kind = argc > 1 ? argv[1] : "";
    if (!strcmp(kind, "double-free"))
        do_double_free();
    else if (!strcmp(kind, "invalid-free-stack"))
        do_invalid_free_stack();
    else if (!strcmp(kind, "invalid-free-interior"))
        do_invalid_free_interior();
    else if (!strcmp(kind, "heap-overflow"))
        do_heap_overflow();
    else if (!strcmp(kind, "use-after-free"))
        do_use_after_free();
    else {
        fprintf(stderr, "unknown kind %s\n", kind);
        return 2;
    }
    printf("survived\n");
    return 0;
}
