// uw_stacks_cxx.cc - C++ allocations whose stacks a test compares with
// gdb's bt (see uw_stacks.c: same markers protocol, same output).
//
// Built -O2 without frame pointers.  Markers:
//   1  new through a chain of calls (operator new in libstdc++ -> malloc)
//   2  std::vector growing (libstdc++ allocating for the program), in a
//      std::thread
//   3  the exception object of a throw three calls deep
//      (__cxa_allocate_exception -> malloc)
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <thread>
#include <vector>

#include "lt_reader.c"

#define MARKERS 4
extern "C" {
volatile int marker;
}
static void *blocks[MARKERS];

#define KEEP() __asm__ volatile("" ::: "memory")

struct Node {
    long payload[12];
};

__attribute__((noipa)) static Node *make_node()
{
    Node *n = new Node();
    KEEP();
    return n;
}

__attribute__((noipa)) static Node *build(int m)
{
    marker = m;
    Node *n = make_node();
    marker = 0;
    KEEP();
    return n;
}

__attribute__((noipa)) static void grow(std::vector<long> *v)
{
    marker = 2;
    v->push_back(42);  // the first push_back allocates
    marker = 0;
    KEEP();
}

__attribute__((noipa)) static void thread_main(std::vector<long> *v)
{
    grow(v);
    KEEP();
}

struct Boom {
    long why[20];  // big enough that libstdc++'s emergency pool is not used
};

__attribute__((noipa)) static void thrower(int depth)
{
    if (depth == 0) {
        marker = 3;
        throw Boom();
    }
    thrower(depth - 1);
    KEEP();
}

// The exception object is the block __cxa_allocate_exception returns,
// minus its header: record the caught object's address and find the block
// around it by scanning back for a valid tag that starts its heap slot (or
// that its slot's forward record leads to): a 16-bit check alone passes one
// stray word in 65536.
static void *block_around(const void *p)
{
    for (uintptr_t a = ((uintptr_t)p & ~(uintptr_t)15); a > (uintptr_t)p - 4096; a -= 16)
        if (lt_tag((const void *)a) && lt_pad(lt_tag((const void *)a)) >= 0)
            return (void *)a;
    return nullptr;
}

int main()
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    blocks[1] = build(1);
    std::vector<long> v;
    std::thread th(thread_main, &v);
    th.join();
    blocks[2] = v.data();
    try {
        thrower(3);
    } catch (const Boom &b) {
        marker = 0;
        blocks[3] = block_around(&b);
        for (int m = 1; m < MARKERS; m++)
            lt_print_marked_stack(m, blocks[m]);
    }
    delete static_cast<Node *>(blocks[1]);
    return 0;
}
