// transparency.cpp - what a marked frame does to tools that read return
// addresses from the stack.  Run under tramp.so in marker mode:
//
//   g++ -O2 -fno-omit-frame-pointer -o transparency transparency.cpp
//   TRAMP_MODE=marker TRAMP_PLACE=inner LD_PRELOAD=./tramp.so ./transparency backtrace
//   TRAMP_MODE=marker TRAMP_PLACE=inner LD_PRELOAD=./tramp.so ./transparency throw
//
// backtrace: outer() -> mid() -> probe(), which mallocs (so the marker goes on
//   the return slot of probe's caller chain) and then prints backtrace();
// throw: the same, but probe() throws after its malloc and outer() catches.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <execinfo.h>
#include <stdexcept>

static void *volatile sinkp;

__attribute__((noinline)) static void *xalloc(size_t n)
{
    void *p = malloc(n);
    asm volatile("" ::: "memory");
    return p;
}

__attribute__((noinline)) static void probe(int what)
{
    sinkp = xalloc(16);  // the capture marks a frame of this stack
    free(sinkp);         // and so does this one
    if (what == 0) {
        void *pcs[16];
        int n = backtrace(pcs, 16);
        backtrace_symbols_fd(pcs, n, 1);
    } else {
        throw std::runtime_error("thrown through a marked frame");
    }
    asm volatile("" ::: "memory");
}

__attribute__((noinline)) static void mid(int what)
{
    probe(what);
    asm volatile("" ::: "memory");
}

__attribute__((noinline)) static void outer(int what)
{
    try {
        mid(what);
    } catch (const std::exception &e) {
        printf("caught: %s\n", e.what());
    }
    asm volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
    int what = argc > 1 && !strcmp(argv[1], "throw");
    outer(what);
    printf("done\n");
    return 0;
}
