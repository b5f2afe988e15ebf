// rs_stacks_cxx.cc - C++ stacks the reader must unwind and symbolise as
// gdb does.  Built -O2 without frame pointers, not instrumented.
//
//   rs_stacks_cxx park    allocations with markers, a std::thread parked in
//                         read(), then park_done() (a breakpoint for gdb)
//   rs_stacks_cxx throw   a worker std::thread throws an exception nobody
//                         catches: std::terminate -> abort
//
// Park mode prints "block <marker> <address>", "thread parked <tid>" and
// "main <tid>", as rs_stacks.c does.  Markers (set around the call that
// allocates, for a conditional gdb breakpoint on operator new or malloc):
//   1  Shape::make -> make_inline (inlined) -> operator new
//   2  std::string::assign allocating the string's buffer (libstdc++
//      calls operator new for the program)
//   3  std::vector growing (push_back -> _M_realloc_insert -> operator new)
//      in a worker std::thread
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rs_park.h"

#define KEEP() __asm__ volatile("" ::: "memory")

volatile int marker;
static void *blocks[4];

namespace shapes {

struct Shape {
    double w, h;
    virtual ~Shape() {}
    virtual double area() const { return w * h; }
    static Shape *make(double w, double h);
};

static inline __attribute__((always_inline)) Shape *make_inline(double w, double h)
{
    Shape *s = new Shape;
    s->w = w;
    s->h = h;
    KEEP();
    return s;
}

__attribute__((noipa)) Shape *Shape::make(double w, double h)
{
    Shape *s = make_inline(w, h + 1);
    KEEP();
    return s;
}

}  // namespace shapes

__attribute__((noipa)) static void grow(std::vector<long> *v)
{
    marker = 3;
    v->push_back(42);
    marker = 0;
    blocks[3] = v->data();
    KEEP();
}

static int park_fds[2];
static volatile pid_t parked_tid;

__attribute__((noipa)) static void park_here()
{
    char c;
    parked_tid = rs_gettid();
    while (read(park_fds[0], &c, 1) < 0)
        ;
    KEEP();
}

__attribute__((noipa)) static void parked_worker()
{
    park_here();
    KEEP();
}

volatile int parked_all;
extern "C" __attribute__((noipa)) void park_done()
{
    parked_all = 1;  // gdb's breakpoint: a line of the body, not the entry
    KEEP();
}

__attribute__((noipa)) static void fail_deep(int v)
{
    if (v > 0)
        throw std::runtime_error("nobody catches this");
    KEEP();
}

__attribute__((noipa)) static void throwing_worker()
{
    fail_deep(1);
    KEEP();
}

int main(int argc, char **argv)
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "park";
    if (strcmp(mode, "throw") == 0) {
        std::thread t(throwing_worker);
        t.join();
        return 0;
    }
    marker = 1;
    shapes::Shape *s = shapes::Shape::make(2, 3);
    marker = 0;
    blocks[1] = s;
    // the string's own object is allocated unmarked; its buffer with marker 2
    std::string *str = new std::string;
    marker = 2;
    str->assign(200, 'y');
    marker = 0;
    blocks[2] = (void *)str->data();
    std::vector<long> v;
    std::thread g(grow, &v);
    g.join();
    if (pipe(park_fds) != 0)
        return 1;
    std::thread p(parked_worker);
    while (!parked_tid)
        rs_nap();
    rs_wait_in_read(parked_tid);
    for (int m = 1; m < 4; m++)
        printf("block %d %p\n", m, blocks[m]);
    printf("thread parked %d\n", (int)parked_tid);
    printf("main %d\n", (int)rs_gettid());
    park_done();
    if (write(park_fds[1], "x", 1) != 1)
        return 1;
    p.join();
    delete str;
    delete s;
    return 0;
}
