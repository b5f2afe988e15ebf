/* heap_shim.c - libtag's heap alone, with nothing of libtag around it: no
 * tag, no canary, no stacks, no quarantine.  The "backing allocator alone"
 * column of bench/run_real.py and bench/parts.py: what the heap itself
 * costs or saves against glibc, before libtag's own work.
 *
 * The heap is libtag's own heap.c, through its seam (libtag/src/heap/heap.h,
 * CMake's libtag_heap): bench/CMakeLists.txt builds heap_shim.so, and
 * bench/benchlib.py heap_shim() asks CMake for it:
 *   cmake -S . -B build/bench -DFORENSICS_BENCH=ON
 *   cmake --build build/bench --target heap_shim   ->  build/bench/bench/heap_shim.so
 * Not a tool: no checks beyond the heap's own.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "heap/heap.h"

#define EXPORT __attribute__((visibility("default")))

static __thread struct tag_heap_cache cache[TAG_HEAP_CLASSES]
    __attribute__((tls_model("initial-exec")));
static int ready;

static void init(void)
{
    static int lock;
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE))
        ;
    if (!ready) {
        _tag_ctl.secret = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)&lock;
        _tag_heap_init();
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
}

/* fork() from one thread while another holds a heap lock: the child must
 * find them free (registered after libc is up; pthread_atfork allocates) */
__attribute__((constructor)) static void shim_atfork(void)
{
    pthread_atfork(_tag_heap_atfork_prepare, _tag_heap_atfork_release,
                   _tag_heap_atfork_release);
}

static inline void *alloc(size_t n, size_t align, int zero)
{
    if (__builtin_expect(!__atomic_load_n(&ready, __ATOMIC_ACQUIRE), 0))
        init();
    if (n == 0)
        n = 1;
    if (align <= 16)
        return _tag_heap_alloc(cache, n, zero);
    /* aligned: a large span of its own, which starts at its pointer (up to
     * 64 KiB alignment), so free() needs no "which slot" division */
    return _tag_heap_alloc_slow(cache, n > TAG_HEAP_SMALL_MAX ? n : TAG_HEAP_SMALL_MAX + 1,
                                align, zero);
}

EXPORT void *malloc(size_t n) { return alloc(n, 16, 0); }
EXPORT void *calloc(size_t a, size_t b)
{
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return alloc(n, 16, 1);
}
EXPORT void free(void *p)
{
    if (!p)
        return;
    _tag_heap_free(cache, p);
}
EXPORT size_t malloc_usable_size(void *p) { return p ? _tag_heap_usable(p) : 0; }
EXPORT void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (n == 0) {
        free(p);
        return NULL;
    }
    size_t room = _tag_heap_usable(p);
    if (n <= room && 2 * n > room)
        return p;
    if (n > room && n > TAG_HEAP_SMALL_MAX && _tag_heap_grow(p, n))
        return p;  /* a large block grown in place, as libtag's realloc does */
    void *q = malloc(n);
    if (q) {
        memcpy(q, p, room < n ? room : n);
        free(p);
    }
    return q;
}
EXPORT void *memalign(size_t align, size_t n) { return alloc(n, align, 0); }
EXPORT void *aligned_alloc(size_t align, size_t n) { return alloc(n, align, 0); }
EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    void *p = alloc(n, align, 0);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}
EXPORT void *valloc(size_t n) { return alloc(n, 4096, 0); }
