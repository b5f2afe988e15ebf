/* uw_jumps.c - instrumented code that leaves frames without their exit
 * hooks: longjmp, nested setjmp, a signal handler that longjmps out (on the
 * thread's stack and on an alternate signal stack).
 *
 * After the jumps main calls fresh_alloc, which allocates, then probe(),
 * which prints the thread's shadow depth as libtag keeps it ("depth N":
 * main and probe = 2) and the shadow overflows so far; then the block's
 * stack ("frame <kind> 0x<pc>" lines, see lt_print_stack).
 *
 *   jump N       longjmp out of N frames (thrower at depth N + 1)
 *   many         200 longjmps out of 3 frames, each allocating (printf)
 *                before it jumps
 *   nested       setjmp in main and in level1; longjmp to level1's from
 *                three frames down, level1 allocates, then longjmp to main's
 *   signal       raise() three frames down; the handler siglongjmps to main
 *   altsignal    the same with the handler on a sigaltstack
 *   deep         longjmp out of 3 frames, then main calls deep_call (not
 *                instrumented), whose 8 KiB frame overwrites the frames
 *                left, and which calls fresh_alloc: deeper than the frames
 *                left, so the enter hook sees its new entry below theirs
 *   tailexit     tail_exit (void: at -O2 gcc reaches its exit hook by a
 *                jump after its epilogue) calls catcher (not instrumented),
 *                which setjmps and calls thrower, which longjmps back: the
 *                exit finds thrower's dead entry inside tail_exit's
 *   realign      host(k) alloca()s 16 k + 1 bytes, then calls realigned,
 *                whose 64-byte aligned local realigns its stack: the same
 *                stack pointer at its enter hook for CFAs 16 bytes apart;
 *                realigned allocates (blocks "realign0" to "realign7")
 */
#include <alloca.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "lt_reader.c"

#define KEEP() __asm__ volatile("" ::: "memory")

static jmp_buf main_jb, level1_jb;
static sigjmp_buf sig_jb;
static void *blocks[2];

__attribute__((noipa)) static void *fresh_alloc(size_t n)
{
    void *p = malloc(n);
    KEEP();
    return p;
}

__attribute__((noipa)) static void probe(void)
{
    const struct libtag_thread *r = lt_record(lt_gettid());
    const struct libtag_shadow *s = (const struct libtag_shadow *)(uintptr_t)r->shadow;
    struct libtag_stats st;
    libtag_stats(&st);
    printf("depth %u overflows %llu\n", s->depth, (unsigned long long)st.shadow_overflows);
}

__attribute__((noipa)) static void thrower(jmp_buf jb, int chatter)
{
    if (chatter)
        printf("jumping\n");  /* stdio allocates its buffer from here */
    longjmp(jb, 1);
}

__attribute__((noipa)) static void down(int n, jmp_buf jb, int chatter)
{
    if (n > 1)
        down(n - 1, jb, chatter);
    else
        thrower(jb, chatter);
    KEEP();
}

__attribute__((noipa)) static void level1(void)
{
    if (setjmp(level1_jb) == 0) {
        down(3, level1_jb, 0);
        KEEP();
    }
    blocks[1] = fresh_alloc(11);
    down(3, main_jb, 0);
    KEEP();
}

/* Not instrumented, and deeper than the frames a longjmp just left: its
 * own writes overwrite their return address slots. */
__attribute__((no_instrument_function, noipa)) static void *deep_call(void)
{
    volatile char pad[8192];
    for (size_t i = 0; i < sizeof pad; i++)
        pad[i] = (char)(i * 7 + 1);
    void *p = fresh_alloc(13);
    pad[0] = 0;
    return p;
}

__attribute__((noipa)) static void throw_back(void) { longjmp(main_jb, 1); }

__attribute__((noipa, no_instrument_function)) static void catcher(void)
{
    if (setjmp(main_jb) == 0)
        throw_back();
}

__attribute__((noipa)) void tail_exit(void)
{
    catcher();
}

#define REALIGNS 8
static void *realigned_blocks[REALIGNS];

__attribute__((noipa)) static void sink(void *p)
{
    (void)p;
    KEEP();
}

__attribute__((noipa)) static void *realigned(size_t n)
{
    char buf[64] __attribute__((aligned(64)));
    sink(buf);
    void *p = malloc(n);
    KEEP();
    return p;
}

__attribute__((noipa)) static void host(int k)
{
    char *a = alloca(16 * (size_t)k + 1);
    memset(a, 0x55, 16 * (size_t)k + 1);
    __asm__ volatile("" ::"r"(a) : "memory");
    realigned_blocks[k] = realigned((size_t)k + 1);
    KEEP();
}

static void handler(int sig)
{
    (void)sig;
    siglongjmp(sig_jb, 1);
}

__attribute__((noipa)) static void raiser(int n)
{
    if (n > 1)
        raiser(n - 1);
    else
        raise(SIGUSR1);
    KEEP();
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    const char *what = argc > 1 ? argv[1] : "jump";
    if (strcmp(what, "jump") == 0) {
        int n = argc > 2 ? atoi(argv[2]) : 3;
        if (setjmp(main_jb) == 0)
            down(n, main_jb, 0);
    } else if (strcmp(what, "many") == 0) {
        for (volatile int i = 0; i < 200; i++)
            if (setjmp(main_jb) == 0)
                down(3, main_jb, 1);
    } else if (strcmp(what, "deep") == 0) {
        free(fresh_alloc(1));  /* its enter hook's CFA offset is known now */
        if (setjmp(main_jb) == 0)
            down(3, main_jb, 0);
        blocks[1] = deep_call();
    } else if (strcmp(what, "nested") == 0) {
        if (setjmp(main_jb) == 0)
            level1();
    } else if (strcmp(what, "tailexit") == 0) {
        tail_exit();
    } else if (strcmp(what, "realign") == 0) {
        for (int k = 0; k < REALIGNS; k++)
            host(k);
    } else if (strcmp(what, "signal") == 0 || strcmp(what, "altsignal") == 0) {
        static char altstack[64 * 1024];
        if (strcmp(what, "altsignal") == 0) {
            stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
            sigaltstack(&ss, NULL);
        }
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = handler;
        sa.sa_flags = what[0] == 'a' ? SA_ONSTACK : 0;
        sigaction(SIGUSR1, &sa, NULL);
        for (volatile int i = 0; i < 50; i++)
            if (sigsetjmp(sig_jb, 1) == 0)
                raiser(3);
    }
    /* from main itself: the stack must be fresh_alloc <- main */
    blocks[0] = fresh_alloc(42);
    probe();
    printf("alloc\n");
    lt_print_stack(lt_tag(blocks[0])->alloc_stack);
    if (blocks[1]) {
        printf("alloc1\n");
        lt_print_stack(lt_tag(blocks[1])->alloc_stack);
    }
    for (int k = 0; k < REALIGNS; k++) {
        if (realigned_blocks[k]) {
            printf("realign%d\n", k);
            lt_print_stack(lt_tag(realigned_blocks[k])->alloc_stack);
        }
    }
    return 0;
}
