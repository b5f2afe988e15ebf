// truth_cxx.cc - a C++ virtual call on a deleted object.
//
// make_shape allocates a Circle (new), forget deletes it, and draw calls a
// virtual function through the dangling pointer: the object's vtable pointer
// now holds libtag's free pattern 0xfdfd..., so `call *0x10(%rax)` faults on
// a non-canonical address (a general-protection fault, no address from the
// kernel).  Prints "pid PID", "tid TID" and "object ADDR SIZE" (the deleted
// Circle) first.
#include <cstdio>
#include <sys/syscall.h>
#include <unistd.h>

struct Shape {
    virtual ~Shape() {}
    virtual long area() const = 0;
    long id = 0;
};

struct Circle : Shape {
    long r = 3;
    long area() const override { return 3 * r * r; }
};

__attribute__((noinline)) static Shape *make_shape()
{
    return new Circle;
}

__attribute__((noinline)) static void forget(Shape *s)
{
    delete s;
}

__attribute__((noinline)) static long draw(const Shape *s)
{
    return s->area();
}

int main()
{
    std::printf("pid %d\ntid %d\n", (int)getpid(), (int)syscall(SYS_gettid));
    Shape *s = make_shape();
    std::printf("object %p %d\n", (void *)s, (int)sizeof(Circle));
    std::fflush(stdout);
    forget(s);
    std::printf("area %ld\n", draw(s));
    return 0;
}
