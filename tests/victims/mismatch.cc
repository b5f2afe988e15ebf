// mismatch.cc - a block released by the wrong family, as argv[1] names it:
//
//   new[]-delete   new char[32], released with delete
//   malloc-delete  malloc(24), released with delete
//   new-free       new long, released with free()
//
// alloc_victim makes the block and release_victim releases it.  Prints
// "block=0x...", "size=N", "tid=N", then after the release "live_delta=N"
// (libtag_stats' live blocks after minus before the pair: 0 = the block was
// released, not leaked) and "survived"; exits 0.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>

#include "libtag.h"
#pragma weak libtag_stats  // resolved by the preloaded libtag

// C names, so the stacks read "alloc_victim", not "alloc_victim(char const*)"
extern "C" {
__attribute__((noinline)) static void *alloc_victim(const char *kind)
{
    void *p;
    if (!strcmp(kind, "new[]-delete"))
        p = new char[32];
    else if (!strcmp(kind, "malloc-delete"))
        p = malloc(24);
    else
        p = new long(7);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

__attribute__((noinline)) static void release_victim(const char *kind, void *p)
{
    __asm__ volatile("" : "+r"(p));
    if (!strcmp(kind, "new[]-delete"))
        delete static_cast<char *>(p);  // new[] needs delete[]
    else if (!strcmp(kind, "malloc-delete"))
        delete static_cast<char *>(p);  // malloc needs free()
    else
        free(p);                         // new needs delete
}
}

int main(int argc, char **argv)
{
    const char *kind = argc > 1 ? argv[1] : "";
    if (strcmp(kind, "new[]-delete") && strcmp(kind, "malloc-delete") && strcmp(kind, "new-free")) {
        fprintf(stderr, "usage: mismatch new[]-delete|malloc-delete|new-free\n");
        return 2;
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
    printf("tid=%ld\n", (long)syscall(SYS_gettid));  // stdout's buffer first
    struct libtag_stats before, after;
    libtag_stats(&before);
    void *p = alloc_victim(kind);
    printf("block=%p\nsize=%d\n", p,
           !strcmp(kind, "new[]-delete") ? 32 : !strcmp(kind, "malloc-delete") ? 24 : (int)sizeof(long));
    release_victim(kind, p);
    libtag_stats(&after);
    printf("live_delta=%lld\n", (long long)(after.live_blocks - before.live_blocks));
    printf("survived\n");
    return 0;
}
