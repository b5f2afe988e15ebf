/* who_anomaly.c - one heap misuse (argv[1]) with a distinct function for
 * every stack an inspector must show, or an on-demand snapshot of a heap
 * whose biggest allocation stack is known.
 *
 *   double-free            make_block(48) <- do_double_free <- main;
 *                          first_release <- do_double_free frees it, then
 *                          second_release <- do_double_free frees it again
 *   invalid-free-interior  make_block(128) <- do_invalid_interior; then
 *                          bad_release(p + 32) <- do_invalid_interior
 *   invalid-free-stack     bad_release(&local[32]) <- do_invalid_stack
 *   heap-overflow          make_block(40) <- do_overflow; 8 bytes written past
 *                          its end (printed: "written=HEX"); overflow_release
 *                          <- do_overflow frees it
 *   use-after-free         make_block(64) <- do_use_after_free; first_release
 *                          frees it; a write at p + 40; churn <- do_use_after_free
 *                          frees 256 blocks, pushing p out of the quarantine
 *                          (run with a small LIBTAG_QUARANTINE, e.g. 4096)
 *   on-demand              hoard <- main allocates HOARD_BLOCKS x HOARD_SIZE
 *                          bytes, then raise(SIGUSR2)
 *
 * Prints "tid N" (the only thread), "address=0x..." (the pointer the
 * anomaly is about) and, for on-demand, "hoarded 0x..." for each block and
 * "stats LIVE_BLOCKS LIVE_BYTES" from
 * libtag_stats() just before the snapshot; "survived" at the end.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "libtag.h"
#include "overwrite.h"

#define HOARD_BLOCKS 40
#define HOARD_SIZE 1000

static void say(void *p)
{
    printf("address=%p\n", p);
    fflush(stdout);
}

__attribute__((noinline)) static char *make_block(size_t n)
{
    char *p = malloc(n);
    memset(p, 7, n);
    return p;
}

__attribute__((noinline)) static void first_release(void *p) { free(p); }
__attribute__((noinline)) static void second_release(void *p) { free(p); }
__attribute__((noinline)) static void bad_release(void *p) { free(p); }
__attribute__((noinline)) static void overflow_release(void *p) { free(p); }

__attribute__((noinline)) static void churn(void)
{
    for (int i = 0; i < 256; i++) {  /* 256 x 64 bytes > a small quarantine */
        char *volatile q = malloc(64);
        free(q);
    }
}

__attribute__((noinline)) static void do_double_free(void)
{
    char *p = make_block(48);
    first_release(p);
    say(p);
    second_release(p);
}

__attribute__((noinline)) static void do_invalid_interior(void)
{
    char *p = make_block(128);
    char *volatile q = p + 32;
    say(q);
    bad_release(q);
    free(p);
}

__attribute__((noinline)) static void do_invalid_stack(void)
{
    _Alignas(16) char local[64];
    memset(local, 2, sizeof local);
    void *volatile p = local + 32;
    say(p);
    bad_release(p);
}

__attribute__((noinline)) static void do_overflow(void)
{
    char *p = make_block(40);
    char *volatile end = p + 40;
    say(p);
    overwrite(end, 0x41, 8);
    print_written(end, 8);
    overflow_release(p);
}

__attribute__((noinline)) static void do_use_after_free(void)
{
    char *p = make_block(64);
    first_release(p);
    say(p);
    char *volatile dangling = p;
    dangling[40] = 0x42;   /* in the fill pattern */
    churn();
}

static void *hoarded[HOARD_BLOCKS];

__attribute__((noinline)) static void hoard(void)
{
    for (int i = 0; i < HOARD_BLOCKS; i++)
        hoarded[i] = make_block(HOARD_SIZE);
}

int main(int argc, char **argv)
{
    const char *kind = argc > 1 ? argv[1] : "";
    printf("tid %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    if (!strcmp(kind, "double-free"))
        do_double_free();
    else if (!strcmp(kind, "invalid-free-interior"))
        do_invalid_interior();
    else if (!strcmp(kind, "invalid-free-stack"))
        do_invalid_stack();
    else if (!strcmp(kind, "heap-overflow"))
        do_overflow();
    else if (!strcmp(kind, "use-after-free"))
        do_use_after_free();
    else if (!strcmp(kind, "on-demand")) {
        hoard();
        for (int i = 0; i < HOARD_BLOCKS; i++)
            printf("hoarded %p\n", hoarded[i]);
        void (*stats_fn)(struct libtag_stats *) =
            (void (*)(struct libtag_stats *))dlsym(RTLD_DEFAULT, "libtag_stats");
        struct libtag_stats st;
        memset(&st, 0, sizeof st);
        if (stats_fn)
            stats_fn(&st);
        printf("stats %llu %llu\n", (unsigned long long)st.live_blocks,
               (unsigned long long)st.live_bytes);
        fflush(stdout);
        raise(SIGUSR2);
    } else {
        fprintf(stderr, "unknown kind %s\n", kind);
        return 2;
    }
    printf("survived\n");
    return 0;
}
