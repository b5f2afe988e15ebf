// uw_throw.cc - a C++ exception through instrumented frames.
//
// main calls down(N), which throws N frames down; main catches, 100 times,
// then calls fresh_alloc, which allocates.  The victim prints that block's
// stack ("frame <kind> 0x<pc>" lines) and, from probe() called by main, the
// thread's shadow depth (main and probe = 2) and the shadow overflows.
#include <cstdlib>
#include <stdexcept>

#include "lt_reader.c"

#define KEEP() __asm__ volatile("" ::: "memory")

__attribute__((noipa)) static void *fresh_alloc(size_t n)
{
    void *p = malloc(n);
    KEEP();
    return p;
}

__attribute__((noipa)) static void probe()
{
    const struct libtag_thread *r = lt_record(lt_gettid());
    const struct libtag_shadow *s = (const struct libtag_shadow *)(uintptr_t)r->shadow;
    struct libtag_stats st;
    libtag_stats(&st);
    printf("depth %u overflows %llu\n", s->depth, (unsigned long long)st.shadow_overflows);
}

__attribute__((noipa)) static void down(int n)
{
    if (n > 1)
        down(n - 1);
    else
        throw std::runtime_error("deep");
    KEEP();
}

int main()
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    for (volatile int i = 0; i < 100; i++) {
        try {
            down(4);
        } catch (const std::exception &) {
        }
    }
    void *p = fresh_alloc(42);
    probe();
    printf("alloc\n");
    lt_print_stack(lt_tag(p)->alloc_stack);
    free(p);
    return 0;
}
