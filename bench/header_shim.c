/* header_shim.c - the least a tagging malloc interposer through glibc can
 * cost: the floor under libtag's figures in bench/run_real.py and
 * bench/parts.py.
 *
 * Every block gets what libtag's layout gives it (tag_abi.h) and nothing
 * else: a 16-byte header in front (size, pad, a magic word tied to the
 * address) and an 8-byte canary after the payload, both written at
 * allocation and checked at free; realloc always moves.  No stacks, no
 * clock, no quarantine, no statistics, no thread state.  So "header /
 * base" is what the extra 24 bytes a block and the interposition cost the
 * program (glibc's bins, the cache footprint, the calls), and "libtag /
 * header" is what libtag's own work costs on top.
 *
 * Build: gcc -O2 -shared -fPIC -o header_shim.so header_shim.c
 * With -DHEADER_BYTES=32: the 32-byte header of libtag's tag before ABI 4
 * (the figures in docs/history/benchmarks-2026.md).
 * With -DSHIM_MIMALLOC (and -lmimalloc): the same on mimalloc's blocks.
 * Not a tool: a damaged header or canary traps (SIGILL), nothing more.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#ifdef SHIM_MIMALLOC
/* -DSHIM_MIMALLOC -lmimalloc (Debian's libmimalloc-dev): the same header
 * on mimalloc's blocks, the measurement behind docs/design.md "The heap". */
#include <mimalloc.h>
#define __libc_malloc mi_malloc
#define __libc_calloc mi_calloc
#define __libc_memalign(align, n) mi_malloc_aligned(n, align)
#define __libc_free mi_free
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAGIC 0x7461672d666c6f72ull /* "tag-flor" */
#define CANARY 0x9e3779b97f4a7c15ull

#ifndef HEADER_BYTES
#define HEADER_BYTES 16   /* libtag's tag (tag_abi.h) */
#endif
struct header {
#if HEADER_BYTES == 32
    uint64_t size;
    uint64_t pad;     /* bytes from the chunk's start to this header */
    uint64_t spare;
#elif HEADER_BYTES == 16
    uint32_t size;
    uint32_t pad;
#else
#error "HEADER_BYTES is 16 or 32"
#endif
    uint64_t magic;   /* MAGIC ^ the header's address */
};
_Static_assert(sizeof(struct header) == HEADER_BYTES, "header size");
#define OVERHEAD (HEADER_BYTES + 8)

static void *finish(char *raw, size_t pad, size_t size)
{
    if (!raw)
        return NULL;
    struct header *h = (struct header *)(raw + pad);
    h->size = size;
    h->pad = pad;
#if HEADER_BYTES == 32
    h->spare = 0;
#endif
    h->magic = MAGIC ^ (uintptr_t)h;
    uint64_t c = CANARY ^ (uintptr_t)h;
    memcpy((char *)(h + 1) + size, &c, sizeof c);
    return h + 1;
}

static struct header *checked(void *p)
{
    struct header *h = (struct header *)p - 1;
    uint64_t c;
    memcpy(&c, (char *)p + h->size, sizeof c);
    if (h->magic != (MAGIC ^ (uintptr_t)h) || c != (CANARY ^ (uintptr_t)h))
        __builtin_trap();
    return h;
}

static int too_big(size_t size, size_t align)
{
    size_t max = HEADER_BYTES == 16 ? UINT32_MAX : SIZE_MAX / 2;
    if (size > max - align - OVERHEAD) {
        errno = ENOMEM;
        return 1;
    }
    return 0;
}

EXPORT void *malloc(size_t size)
{
    if (too_big(size, 64))
        return NULL;
    return finish(__libc_malloc(size + OVERHEAD), 0, size);
}

EXPORT void *calloc(size_t n, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (too_big(total, 64))
        return NULL;
    return finish(__libc_calloc(1, total + OVERHEAD), 0, total);
}

EXPORT void free(void *p)
{
    if (!p)
        return;
    int saved = errno;
    struct header *h = checked(p);
    h->magic = 0;
    __libc_free((char *)h - h->pad);
    errno = saved;
}

EXPORT void *realloc(void *p, size_t size)
{
    if (!p)
        return malloc(size);
    if (size == 0) {
        free(p);
        return NULL;
    }
    size_t old = checked(p)->size;
    void *q = malloc(size);
    if (!q)
        return NULL;
    memcpy(q, p, old < size ? old : size);
    free(p);
    return q;
}

EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, total);
}

static void *aligned(size_t align, size_t size)
{
    if (align <= 16)
        return malloc(size);
    if (align & (align - 1)) {
        size_t a = 32;
        while (a < align)
            a <<= 1;
        align = a;
    }
    if (too_big(size, align))
        return NULL;
    /* the header just below the first aligned boundary past its own size */
    return finish(__libc_memalign(align, align + size + 8), align - HEADER_BYTES, size);
}

EXPORT void *memalign(size_t align, size_t size) { return aligned(align, size); }
EXPORT void *aligned_alloc(size_t align, size_t size) { return aligned(align, size); }
EXPORT void *valloc(size_t size) { return aligned((size_t)sysconf(_SC_PAGESIZE), size); }

EXPORT void *pvalloc(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > SIZE_MAX - page) {
        errno = ENOMEM;
        return NULL;
    }
    return aligned(page, (size + page - 1) & ~(page - 1));
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
    if (align % sizeof(void *) != 0 || (align & (align - 1)) != 0 || align == 0)
        return EINVAL;
    void *p = aligned(align, size);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

EXPORT size_t malloc_usable_size(void *p)
{
    return p ? checked(p)->size : 0;
}
