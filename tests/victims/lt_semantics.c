/* lt_semantics.c - what the malloc family does toward a program.
 *
 * Run with and without libtag; every line except those starting "usable "
 * must be the same (tests/integration/test_libtag_semantics.py).  "usable"
 * lines carry malloc_usable_size, which is exact under libtag and glibc's
 * rounded-up chunk size without it.  Nothing printed depends on addresses.
 */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Sizes reach the allocator through opaque() so the compiler cannot fold
 * or warn about a call whose arguments it knows. */
#pragma GCC diagnostic ignored "-Walloc-size-larger-than="
static size_t opaque(size_t x)
{
    __asm__("" : "+r"(x));
    return x;
}
#define O(x) opaque((size_t)(x))

#define SENTINEL_ERRNO EXDEV   /* set before a call to see whether it changes */
#define UNTOUCHED ((void *)0x5a5a5a5a5a5a5a5aull)

static const char *ename(int e)
{
    static char buf[32];
    switch (e) {
    case 0: return "0";
    case ENOMEM: return "ENOMEM";
    case EINVAL: return "EINVAL";
    case EXDEV: return "unchanged";
    default: snprintf(buf, sizeof buf, "errno%d", e); return buf;
    }
}

/* Required alignment of a memalign-like result: the power of two at or
 * above align, at least 16 (glibc's MALLOC_ALIGNMENT on x86_64). */
static size_t want_align(size_t align)
{
    size_t a = 16;
    while (a < align)
        a <<= 1;
    return a;
}

static void result(const char *what, void *p, int err, size_t align)
{
    if (p)
        printf("%s -> ptr aligned=%d errno=%s\n", what,
               (uintptr_t)p % align == 0, ename(err));
    else
        printf("%s -> NULL errno=%s\n", what, ename(err));
}

static void usable(const char *what, void *p, size_t requested)
{
    printf("usable %s requested=%zu got=%zu\n", what, requested, malloc_usable_size(p));
}

/* Fill all of p's usable bytes: under libtag that must not touch the canary. */
static void fill_usable(void *p, int c)
{
    memset(p, c, malloc_usable_size(p));
}

static int is_pattern(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31 + seed))
            return 0;
    return 1;
}

static void pattern(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31 + seed);
}

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

#define CALL(label, expr, align)                              \
    do {                                                      \
        errno = SENTINEL_ERRNO;                               \
        void *p_ = (expr);                                    \
        int e_ = errno;                                       \
        result(label, p_, e_, align);                         \
        if (p_) { usable(label, p_, last_req); fill_usable(p_, 0xee); free(p_); } \
    } while (0)

static size_t last_req;

static void test_malloc(void)
{
    static const size_t sizes[] = {0, 1, 15, 16, 17, 100, 4096, 200000, 1 << 22};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char label[64];
        snprintf(label, sizeof label, "malloc(%zu)", sizes[i]);
        last_req = sizes[i];
        CALL(label, malloc(O(sizes[i])), 16);
    }
    const struct { const char *name; size_t n; } huge[] = {
        {"SIZE_MAX", SIZE_MAX}, {"SIZE_MAX-4096", SIZE_MAX - 4096},
        {"PTRDIFF_MAX", PTRDIFF_MAX}, {"PTRDIFF_MAX+1", (size_t)PTRDIFF_MAX + 1},
        {"2^48", (size_t)1 << 48}, {"2^48-1", ((size_t)1 << 48) - 1},
        {"2^47", (size_t)1 << 47},
    };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        char label[64];
        snprintf(label, sizeof label, "malloc(%s)", huge[i].name);
        last_req = huge[i].n;
        CALL(label, malloc(O(huge[i].n)), 16);
    }
}

static void test_free(void)
{
    errno = SENTINEL_ERRNO;
    free(NULL);
    printf("free(NULL) errno=%s\n", ename(errno));
    void *p = malloc(100);
    errno = SENTINEL_ERRNO;
    free(p);
    printf("free(p) errno=%s\n", ename(errno));
    p = malloc(1 << 22);   /* mmapped by glibc: munmap on free */
    errno = SENTINEL_ERRNO;
    free(p);
    printf("free(big) errno=%s\n", ename(errno));
    /* errno 0 stays 0 too */
    p = malloc(24);
    errno = 0;
    free(p);
    printf("free(p) from 0 errno=%s\n", ename(errno));
}

static void test_calloc(void)
{
    /* Dirty the heap first: freed, written blocks are what calloc reuses. */
    enum { N = 96, SZ = 65536 };
    void *dirty[N];
    for (int i = 0; i < N; i++) {
        dirty[i] = malloc(SZ);
        memset(dirty[i], 0xab, SZ);
    }
    for (int i = 0; i < N; i++)
        free(dirty[i]);
    static const size_t sizes[] = {0, 1, 24, 100, 4000, 65536, 300000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int round = 0; round < 8; round++) {
            void *d = malloc(sizes[i] ? sizes[i] : 1);
            memset(d, 0xcd, sizes[i] ? sizes[i] : 1);
            free(d);
            errno = SENTINEL_ERRNO;
            unsigned char *p = calloc(1, sizes[i]);
            int e = errno;
            unsigned char *q = calloc(sizes[i], 1);
            if (round == 0) {
                char label[64];
                snprintf(label, sizeof label, "calloc(1,%zu)", sizes[i]);
                result(label, p, e, 16);
                usable(label, p, sizes[i]);
            }
            if (!all_zero(p, sizes[i]) || !all_zero(q, sizes[i]))
                printf("calloc(%zu) round %d NOT ZERO\n", sizes[i], round);
            free(p);
            free(q);
        }
    }
    printf("calloc zeroing checked\n");
    last_req = 21;
    CALL("calloc(7,3)", calloc(O(7), O(3)), 16);
    last_req = 0;
    CALL("calloc(SIZE_MAX,0)", calloc(O(SIZE_MAX), O(0)), 16);
    CALL("calloc(0,SIZE_MAX)", calloc(O(0), O(SIZE_MAX)), 16);
    CALL("calloc(SIZE_MAX/2,3)", calloc(O(SIZE_MAX / 2), O(3)), 16);
    CALL("calloc(2^32,2^32)", calloc(O((size_t)1 << 32), O((size_t)1 << 32)), 16);
    CALL("calloc(2^33,2^31)", calloc(O((size_t)1 << 33), O((size_t)1 << 31)), 16);
    CALL("calloc(1,SIZE_MAX)", calloc(O(1), O(SIZE_MAX)), 16);
    CALL("calloc(1,PTRDIFF_MAX)", calloc(O(1), O(PTRDIFF_MAX)), 16);
}

static void test_realloc(void)
{
    errno = SENTINEL_ERRNO;
    unsigned char *p = realloc(NULL, 100);
    result("realloc(NULL,100)", p, errno, 16);
    usable("realloc(NULL,100)", p, 100);
    pattern(p, 100, 1);

    static const size_t steps[] = {200, 5000, 300000, 1 << 22, 100000, 4000, 30, 1, 64};
    size_t have = 100;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        size_t n = steps[i];
        errno = SENTINEL_ERRNO;
        unsigned char *q = realloc(p, n);
        int e = errno;
        char label[64];
        snprintf(label, sizeof label, "realloc(%zu->%zu)", have, n);
        result(label, q, e, 16);
        usable(label, q, n);
        size_t keep = have < n ? have : n;
        printf("%s content kept=%d\n", label, is_pattern(q, keep, 1));
        pattern(q, n, 1);
        p = q;
        have = n;
    }
    /* same size */
    errno = SENTINEL_ERRNO;
    unsigned char *q = realloc(p, have);
    printf("realloc same size kept=%d errno=%s\n", is_pattern(q, have, 1), ename(errno));
    p = q;

    /* failure: NULL + ENOMEM, the old block untouched and still usable */
    const struct { const char *name; size_t n; } huge[] = {
        {"SIZE_MAX", SIZE_MAX}, {"PTRDIFF_MAX+1", (size_t)PTRDIFF_MAX + 1},
        {"2^48", (size_t)1 << 48}, {"2^47", (size_t)1 << 47},
    };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        errno = SENTINEL_ERRNO;
        q = realloc(p, O(huge[i].n));
        int e = errno;
        char label[64];
        snprintf(label, sizeof label, "realloc(p,%s)", huge[i].name);
        result(label, q, e, 16);
        printf("%s old kept=%d\n", label, is_pattern(p, have, 1));
        if (q) { free(q); p = malloc(have); pattern(p, have, 1); }
    }
    /* realloc(p, 0): glibc frees p and returns NULL; errno untouched */
    errno = SENTINEL_ERRNO;
    q = realloc(p, 0);
    result("realloc(p,0)", q, errno, 16);
    free(q);
    /* realloc(NULL, 0) is malloc(0) */
    errno = SENTINEL_ERRNO;
    q = realloc(NULL, 0);
    result("realloc(NULL,0)", q, errno, 16);
    usable("realloc(NULL,0)", q, 0);
    free(q);
}

static void test_reallocarray(void)
{
    errno = SENTINEL_ERRNO;
    unsigned char *p = reallocarray(NULL, 10, 10);
    result("reallocarray(NULL,10,10)", p, errno, 16);
    usable("reallocarray(NULL,10,10)", p, 100);
    pattern(p, 100, 7);
    errno = SENTINEL_ERRNO;
    unsigned char *q = reallocarray(p, 300, 10);
    result("reallocarray(p,300,10)", q, errno, 16);
    usable("reallocarray(p,300,10)", q, 3000);
    printf("reallocarray grow kept=%d\n", is_pattern(q, 100, 7));
    p = q;
    pattern(p, 3000, 7);
    const struct { const char *name; size_t a, b; } bad[] = {
        {"SIZE_MAX/2,3", SIZE_MAX / 2, 3}, {"2^32,2^32", (size_t)1 << 32, (size_t)1 << 32},
        {"3,SIZE_MAX/2", 3, SIZE_MAX / 2}, {"1,SIZE_MAX", 1, SIZE_MAX},
        {"2^24,2^24", (size_t)1 << 24, (size_t)1 << 24},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        errno = SENTINEL_ERRNO;
        q = reallocarray(p, O(bad[i].a), O(bad[i].b));
        int e = errno;
        char label[64];
        snprintf(label, sizeof label, "reallocarray(p,%s)", bad[i].name);
        result(label, q, e, 16);
        printf("%s old kept=%d\n", label, is_pattern(p, 3000, 7));
        if (q) { free(q); p = malloc(3000); pattern(p, 3000, 7); }
    }
    errno = SENTINEL_ERRNO;
    q = reallocarray(p, 4, 5);
    printf("reallocarray shrink kept=%d errno=%s\n", is_pattern(q, 20, 7), ename(errno));
    usable("reallocarray(p,4,5)", q, 20);
    errno = SENTINEL_ERRNO;
    p = reallocarray(q, 0, 5);   /* realloc(q, 0): frees, NULL */
    result("reallocarray(p,0,5)", p, errno, 16);
}

static const size_t aligns[] = {0, 1, 2, 8, 16, 24, 32, 48, 64, 100, 256, 4096, 65536, 1 << 21};

static void test_memalign_like(const char *name, void *(*fn)(size_t, size_t))
{
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        static const size_t sizes[] = {0, 1, 100, 5000};
        for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++) {
            char label[80];
            snprintf(label, sizeof label, "%s(%zu,%zu)", name, aligns[i], sizes[j]);
            last_req = sizes[j];
            CALL(label, fn(O(aligns[i]), O(sizes[j])), want_align(aligns[i]));
        }
    }
    const struct { const char *name; size_t a, n; } bad[] = {
        {"SIZE_MAX,10", SIZE_MAX, 10},
        {"SIZE_MAX/2+2,10", SIZE_MAX / 2 + 2, 10},
        {"2^63,10", (size_t)1 << 63, 10},
        {"64,SIZE_MAX", 64, SIZE_MAX},
        {"64,SIZE_MAX-100", 64, SIZE_MAX - 100},
        {"4096,PTRDIFF_MAX", 4096, PTRDIFF_MAX},
        {"64,2^48", 64, (size_t)1 << 48},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char label[80];
        snprintf(label, sizeof label, "%s(%s)", name, bad[i].name);
        last_req = bad[i].n;
        CALL(label, fn(O(bad[i].a), O(bad[i].n)), 16);
    }
}

static void test_posix_memalign(void)
{
    static const size_t pm_aligns[] = {0, 1, 4, 8, 12, 16, 24, 32, 40, 64, 4096, 1 << 20,
                                       ((size_t)1 << 63) + 8, (size_t)1 << 63};
    static const size_t sizes[] = {0, 100, SIZE_MAX, (size_t)1 << 48};
    for (size_t i = 0; i < sizeof pm_aligns / sizeof pm_aligns[0]; i++) {
        for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++) {
            void *p = UNTOUCHED;
            int rc = posix_memalign(&p, pm_aligns[i], sizes[j]);
            printf("posix_memalign(%zu,%zu) -> %s", pm_aligns[i], sizes[j], rc ? ename(rc) : "0");
            if (rc) {
                printf(" memptr untouched=%d\n", p == UNTOUCHED);
            } else {
                printf(" aligned=%d\n", (uintptr_t)p % want_align(pm_aligns[i]) == 0);
                char label[80];
                snprintf(label, sizeof label, "posix_memalign(%zu,%zu)", pm_aligns[i], sizes[j]);
                usable(label, p, sizes[j]);
                fill_usable(p, 0x11);
                free(p);
            }
        }
    }
}

static void test_valloc(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    static const size_t sizes[] = {0, 1, 100, 4096, 5000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char label[64];
        snprintf(label, sizeof label, "valloc(%zu)", sizes[i]);
        last_req = sizes[i];
        CALL(label, valloc(O(sizes[i])), page);
        snprintf(label, sizeof label, "pvalloc(%zu)", sizes[i]);
        /* pvalloc rounds the size up to whole pages (at least one byte). */
        last_req = sizes[i] ? (sizes[i] + page - 1) / page * page : 0;
        CALL(label, pvalloc(O(sizes[i])), page);
    }
    last_req = 0;
    CALL("valloc(SIZE_MAX)", valloc(O(SIZE_MAX)), page);
    CALL("valloc(PTRDIFF_MAX)", valloc(O(PTRDIFF_MAX)), page);
    CALL("pvalloc(SIZE_MAX)", pvalloc(O(SIZE_MAX)), page);
    CALL("pvalloc(SIZE_MAX-100)", pvalloc(O(SIZE_MAX - 100)), page);
    CALL("pvalloc(SIZE_MAX-5000)", pvalloc(O(SIZE_MAX - 5000)), page);
    CALL("pvalloc(PTRDIFF_MAX)", pvalloc(O(PTRDIFF_MAX)), page);
}

static void test_usable(void)
{
    printf("malloc_usable_size(NULL)=%zu\n", malloc_usable_size(NULL));
    /* errno after a successful malloc stays what it was */
    errno = SENTINEL_ERRNO;
    void *p = malloc(10);
    printf("malloc(10) success errno=%s\n", ename(errno));
    free(p);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_malloc();
    test_free();
    test_calloc();
    test_realloc();
    test_reallocarray();
    test_memalign_like("memalign", memalign);
    test_memalign_like("aligned_alloc", aligned_alloc);
    test_posix_memalign();
    test_valloc();
    test_usable();
    printf("done\n");
    return 0;
}
