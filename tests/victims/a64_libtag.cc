// a64_libtag.cc - libtag's answers on aarch64 (tests/integration/test_aarch64.py):
// an -O2 C++ program, built with and without -mbranch-protection=standard,
// run under qemu-aarch64-static with the cross-built libtag preloaded.
//
//   double-free  new, delete, delete again: three stacks, each a function
//                of its own (LINE markers below name their lines)
//   uaf          every block guarded (LIBTAG_GUARD_RATE=1): a read of a
//                deleted object in a leaf, caught at the instruction
//   leak         three blocks lost at exit, one kept reachable
//
// It prints "pid N", "block 0x..." and, after a survived bad access,
// "survived".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

struct Node {
    long key;
    char name[40];
};

void *keep;  // a reachable block: not a leak

__attribute__((noinline)) Node *make_node(long key)
{
    Node *n = new Node;  // LINE alloc
    n->key = key;
    std::snprintf(n->name, sizeof n->name, "node %ld", key);
    return n;
}

__attribute__((noinline)) void retire(Node *n)
{
    delete n;  // LINE free
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void retire_again(Node *n)
{
    delete n;  // LINE free-again
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) long peek(const Node *n)
{
    return *(const volatile long *)&n->key;  // LINE peek
}

__attribute__((noinline)) void *lose(size_t n)
{
    void *p = std::malloc(n);  // LINE lose
    std::memset(p, 7, n);
    return p;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    std::printf("pid %d\n", (int)getpid());
    if (!std::strcmp(mode, "double-free")) {
        Node *n = make_node(7);
        std::printf("block %#lx\n", (unsigned long)n);
        std::fflush(stdout);
        retire(n);
        retire_again(n);
    } else if (!std::strcmp(mode, "uaf")) {
        Node *n = make_node(9);
        std::printf("block %#lx\n", (unsigned long)n);
        std::fflush(stdout);
        retire(n);
        long v = peek(n);
        std::printf("value %ld\n", v & 0xff);
    } else if (!std::strcmp(mode, "leak")) {
        for (int i = 0; i < 3; i++)
            std::printf("lost %#lx\n", (unsigned long)lose(100 + i));
        keep = lose(200);
        std::printf("kept %#lx\n", (unsigned long)keep);
    }
    std::printf("survived\n");
    return 0;
}
