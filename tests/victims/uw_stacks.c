/* uw_stacks.c - allocations whose stacks a test compares with gdb's bt.
 *
 * Built -O2 without frame pointers and without -finstrument-functions, so
 * libtag's stacks come from the binaries' CFI.  Each marked allocation sets
 * `marker` around the malloc that makes it, so a gdb breakpoint on malloc
 * with the condition `marker == N` stops at exactly that allocation and
 * prints bt.  At the end the victim prints, per marker, the stack libtag
 * recorded in the block's tag: "stack <marker> <pc> <pc> ...", innermost
 * first, kinds on the side ("kinds <marker> 1 1 ...").
 *
 * Markers:
 *   1  main -> outer -> middle -> inner -> malloc
 *   2  the same chain in a worker thread
 *   3  strdup (libc allocates for the program)
 *   4  fopen (libc allocates its FILE)
 *   5  recursion 40 deep, then malloc
 *   6  an always_inline helper that allocates, inside a noinline function
 *   7  malloc from a function whose rbp holds a fake frame pointing at the
 *      bytes "key" (what a frame-pointer walk once took for a frame)
 *   8  malloc in a signal handler (the walk crosses the signal frame into
 *      the interrupted code)
 *   9  the same with the handler on a sigaltstack (the walk goes from the
 *      alternate stack back to the thread's own)
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_reader.c"

#define MARKERS 10
volatile int marker;
static void *blocks[MARKERS];

#define KEEP() __asm__ volatile("" ::: "memory")  /* no tail call: a real frame */

__attribute__((noipa)) static void *inner(size_t n)
{
    void *p = malloc(n);
    KEEP();
    return p;
}

__attribute__((noipa)) static void *middle(size_t n)
{
    void *p = inner(n + 1);
    KEEP();
    return p;
}

__attribute__((noipa)) static void *outer(size_t n)
{
    void *p = middle(n + 1);
    KEEP();
    return p;
}

__attribute__((noipa)) static void *mark(int m, void *(*fn)(size_t), size_t n)
{
    marker = m;
    void *p = fn(n);
    marker = 0;
    blocks[m] = p;
    return p;
}

__attribute__((noipa)) static void *worker(void *arg)
{
    (void)arg;
    mark(2, outer, 200);
    return NULL;
}

__attribute__((noipa)) static char *dup_name(const char *s)
{
    char *p = strdup(s);
    KEEP();
    return p;
}

__attribute__((noipa)) static FILE *open_self(void)
{
    FILE *f = fopen("/proc/self/stat", "r");
    KEEP();
    return f;
}

__attribute__((noipa)) static void *recurse(int depth, size_t n)
{
    void *p = depth ? recurse(depth - 1, n) : malloc(n);
    KEEP();
    return p;
}

static inline __attribute__((always_inline)) void *inline_alloc(size_t n)
{
    void *p = malloc(n);
    KEEP();
    return p;
}

__attribute__((noipa)) static void *host_of_inline(size_t n)
{
    void *p = inline_alloc(n + 7);
    KEEP();
    return p;
}

/* malloc with rbp pointing at a fake frame {next = 0, return = "key"}:
 * no CFI, so an unwinder can only try frame pointers here. */
void *junk_rbp_alloc(size_t n);
__asm__(".text\n"
        ".globl junk_rbp_alloc\n"
        ".type junk_rbp_alloc, @function\n"
        "junk_rbp_alloc:\n"
        "  push %rbp\n"
        "  sub $16, %rsp\n"
        "  movq $0, (%rsp)\n"
        "  movq $0x79656b, 8(%rsp)\n"
        "  mov %rsp, %rbp\n"
        "  call malloc@PLT\n"
        "  add $16, %rsp\n"
        "  pop %rbp\n"
        "  ret\n"
        ".size junk_rbp_alloc, .-junk_rbp_alloc\n");

__attribute__((noipa)) static void handler(int sig)
{
    (void)sig;
    marker = 8;
    blocks[8] = malloc(808);  /* not async-signal-safe; fine for this test */
    marker = 0;
}

__attribute__((noipa)) static void alt_handler(int sig)
{
    (void)sig;
    marker = 9;
    blocks[9] = malloc(909);
    marker = 0;
}

__attribute__((noipa)) static void interrupted(void)
{
    raise(SIGUSR1);
    KEEP();
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    mark(1, outer, 100);
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    pthread_join(th, NULL);
    marker = 3;
    blocks[3] = dup_name("a name that libc copies into a block of its own");
    marker = 4;
    FILE *f = open_self();
    marker = 0;
    blocks[4] = f;  /* glibc's FILE is the block fopen allocated */
    marker = 5;
    blocks[5] = recurse(40, 500);
    marker = 0;
    mark(6, host_of_inline, 600);
    mark(7, junk_rbp_alloc, 700);
    signal(SIGUSR1, handler);
    interrupted();
    static char altstack[64 * 1024];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = alt_handler;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    interrupted();
    for (int m = 1; m < MARKERS; m++)
        lt_print_marked_stack(m, blocks[m]);
    if (f)
        fclose(f);
    return 0;
}
