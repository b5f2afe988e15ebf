/* contract_floor.c - the least the heap issue's contract can cost, built
 * beside the product to measure a floor, not a tool.
 *
 * An interposer that does, at every malloc and free, only what the contract
 * asks and nothing else libtag does: a 16-byte tag in front of the block
 * (time, stack id, size, state, thread, a 16-bit check) and an 8-byte
 * canary after it; a full stack at every malloc and every free, walked from
 * frame pointers and hashed (one probe of an intern table); the free
 * checked by arithmetic on the address (its slot in its span) and against
 * the tag and the canary; the payload's first 256 bytes filled when freed
 * and checked when the block leaves a 1 MiB FIFO quarantine a thread; the
 * coarse monotonic clock.  No check value on the free record (stack,
 * time, thread) the ring keeps, no per-stack counters, no guard sampling,
 * no sweep, no snapshot, no errno care, no report (a failed check is
 * counted, the block leaked), no thread but the main one walks (the others
 * record one frame), no aligned blocks above 16 bytes (ENOMEM), a thread's
 * ring is never unmapped.  Where the frame pointers are not there (an -O2
 * build), the walk stops at the first frame that does not chain upwards
 * on the stack.
 *
 * The heap is libtag's (its seam, libtag/src/heap/heap.h and CMake's
 * libtag_heap, as heap_shim.c), or Debian's mimalloc with -DON_MIMALLOC
 * (whose frees cannot be checked by slot: it exports no such answer).
 * bench/CMakeLists.txt builds both (contract_floor_mi.so where
 * libmimalloc-dev is installed); bench/contract_floor.py asks CMake for
 * them:
 *   cmake -S . -B build/bench -DFORENSICS_BENCH=ON
 *   cmake --build build/bench --target contract_floor contract_floor_mi
 *
 * Settings (environment): CF_DEPTH=1 records the return address alone
 * (no walk); CF_QUARANTINE=0 hands a freed block back at once.  At exit,
 * CF_STATS=1 prints the counts (stacks interned, failed checks).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef ON_MIMALLOC
#include <mimalloc.h>
#define H_ALLOC(n) mi_malloc(n)
#define H_FREE(p) mi_free(p)
#define H_USABLE(p) mi_usable_size(p)
#else
#include "heap/heap.h"
static __thread struct tag_heap_cache cache[TAG_HEAP_CLASSES] __attribute__((tls_model("initial-exec")));
#define H_ALLOC(n) _tag_heap_alloc(cache, (n), 0)
#define H_FREE(p) _tag_heap_free(cache, (p))
#define H_USABLE(p) _tag_heap_usable(p)
#endif

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define M1 0x9e3779b97f4a7c15ull
#define M2 0xc2b2ae3d27d4eb4full
#define FILL 256u
#define SLOTS 4096u
#define MAXF 64u
#define ST_LIVE 1ull
#define ST_FREED 2ull
#define CHECK_SHIFT 48

struct tag {
    uint64_t w0;  /* time (ms) << 32 | stack id */
    uint64_t w1;  /* size 32 bits | state 2 | thread 14 | check 16 */
};
#define OVERHEAD (sizeof(struct tag) + 8)

struct qent {
    char *user;
    uint32_t stack, time;
    uint64_t tid;
};
struct ring {
    uint32_t head, count;
    uint64_t bytes;
    struct qent e[SLOTS];
};
struct thr {
    uint32_t tid, main;
    struct ring *q;
};
static __thread struct thr self __attribute__((tls_model("initial-exec")));

static uint64_t secret, t0_ns, budget = 1u << 20;
static unsigned char pattern[FILL];  /* FILL bytes of 0xfd */
static unsigned depth = MAXF;
static int ready;
extern void *__libc_stack_end;

/* the intern table: a stack's hash to its id (the slot), its frames kept
 * once in an append-only array */
#define TBITS 20
static uint64_t *table;
static uintptr_t *frames;
static uint64_t frames_used, nstacks, bad;

static void init(void)
{
    static int lock;
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE))
        ;
    if (!ready) {
        secret = M1 ^ (uint64_t)(uintptr_t)&lock;
#ifndef ON_MIMALLOC
        _tag_ctl.secret = secret;
        _tag_heap_init();
#endif
        table = mmap(NULL, sizeof(uint64_t) << TBITS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        frames = mmap(NULL, 64u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        const char *v = getenv("CF_DEPTH");
        if (v)
            depth = (unsigned)atoi(v) < 1 ? 1 : (unsigned)atoi(v) > MAXF ? MAXF : (unsigned)atoi(v);
        if ((v = getenv("CF_QUARANTINE")))
            budget = strtoull(v, NULL, 0);
        memset(pattern, 0xfd, sizeof pattern);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        t0_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
}

static void thr_init(struct thr *t)
{
    t->tid = (uint32_t)syscall(SYS_gettid);
    t->main = t->tid == (uint32_t)getpid();
    t->q = mmap(NULL, sizeof(struct ring), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

static inline struct thr *me(void)
{
    if (UNLIKELY(!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)))
        init();
    struct thr *t = &self;
    if (UNLIKELY(!t->q))
        thr_init(t);
    return t;
}

static __attribute__((noinline)) uint32_t intern_new(uint64_t h, const uintptr_t *pcs, unsigned n, uint64_t i)
{
    uint64_t mask = (1u << TBITS) - 1;
    for (;; i = (i + 1) & mask) {
        uint64_t cur = __atomic_load_n(&table[i], __ATOMIC_ACQUIRE);
        if (cur == h)
            return (uint32_t)i + 1;
        uint64_t zero = 0;
        if (cur == 0 && __atomic_compare_exchange_n(&table[i], &zero, h, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            uint64_t at = __atomic_fetch_add(&frames_used, n + 1, __ATOMIC_RELAXED);
            if (at + n + 1 <= (64u << 20) / sizeof(uintptr_t)) {
                frames[at] = n;
                memcpy(&frames[at + 1], pcs, n * sizeof *pcs);
            }
            __atomic_fetch_add(&nstacks, 1, __ATOMIC_RELAXED);
            return (uint32_t)i + 1;
        }
    }
}

/* The stack of the call that reached malloc/free: ret, then the frames
 * above frame (the interposer's own, which has a frame pointer). */
static inline __attribute__((always_inline)) uint32_t capture(const struct thr *t, void *ret, void **frame)
{
    uintptr_t pcs[MAXF];
    unsigned n = 1;
    pcs[0] = (uintptr_t)ret;
    uint64_t h = ((uint64_t)(uintptr_t)ret ^ secret) * M1;
    if (depth > 1 && t->main) {
        uintptr_t lo = (uintptr_t)frame, hi = (uintptr_t)__libc_stack_end;
        void **f = frame[0];
        while (n < depth && (uintptr_t)f > lo && (uintptr_t)f < hi && !((uintptr_t)f & 7)) {
            uintptr_t pc = (uintptr_t)f[1];
            if (!pc)
                break;
            pcs[n++] = pc;
            h = (((h << 23) | (h >> 41)) ^ pc) * M1;
            lo = (uintptr_t)f;
            f = f[0];
        }
    }
    h |= 1;  /* 0 marks an empty slot */
    uint64_t i = h >> (64 - TBITS);
    if (LIKELY(__atomic_load_n(&table[i], __ATOMIC_ACQUIRE) == h))
        return (uint32_t)i + 1;
    return intern_new(h, pcs, n, i);
}

static inline uint32_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint32_t)(((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec - t0_ns) / 1000000u);
}

static inline uint64_t check_of(uint64_t addr, uint64_t w0, uint64_t w1)
{
    return (((addr ^ secret ^ w0) * M1 ^ (w1 & ~(0xffffull << CHECK_SHIFT))) * M2) >> (64 - 16) << CHECK_SHIFT;
}
static inline uint64_t canary_of(uint64_t addr)
{
    return ((addr ^ secret) * M2) ^ (addr >> 4);
}

static inline char *tag_live(char *raw, size_t n, uint32_t stack, uint32_t tid)
{
    struct tag *tg = (struct tag *)raw;
    uint64_t addr = (uint64_t)(uintptr_t)raw;
    uint64_t w0 = (uint64_t)now_ms() << 32 | stack;
    uint64_t w1 = (uint64_t)(uint32_t)n | ST_LIVE << 32 | (uint64_t)(tid & 0x3fff) << 34;
    tg->w0 = w0;
    tg->w1 = w1 | check_of(addr, w0, w1);
    uint64_t c = canary_of(addr);
    memcpy(raw + sizeof *tg + n, &c, sizeof c);
    return raw + sizeof *tg;
}

static inline void *alloc_at(const struct thr *t, size_t n, uint32_t stack)
{
    if (UNLIKELY(n > UINT32_MAX - 64)) {
        errno = ENOMEM;
        return NULL;
    }
    char *raw = H_ALLOC(OVERHEAD + n);
    if (UNLIKELY(!raw))
        return NULL;
    return tag_live(raw, n, stack, t->tid);
}

static inline void *alloc(size_t n, void *ret, void **frame)
{
    struct thr *t = me();
    return alloc_at(t, n, capture(t, ret, frame));
}

/* the block's tag, if user is a live block of ours (its slot's start on
 * libtag's heap, checked by arithmetic), else NULL */
static inline struct tag *live_of(char *user)
{
    struct tag *tg = (struct tag *)(user - sizeof(struct tag));
    uint64_t addr = (uint64_t)(uintptr_t)tg;
#ifndef ON_MIMALLOC
    if (UNLIKELY(!_tag_heap_has(tg) || (addr & 15)))
        return NULL;
    uint32_t off;
    struct tag_slice *s = _tag_heap_span_off(tg, &off);
    if (UNLIKELY(!(s->kind == TAG_SPAN_SMALL ? _tag_small_slot_start(s, off) : off == 0)))
        return NULL;
#endif
    uint64_t w1 = tg->w1;
    if (UNLIKELY((w1 >> 32 & 3) != ST_LIVE || (w1 & (0xffffull << CHECK_SHIFT)) != check_of(addr, tg->w0, w1)))
        return NULL;
    uint64_t c;
    memcpy(&c, user + (uint32_t)w1, sizeof c);
    if (UNLIKELY(c != canary_of(addr)))
        return NULL;
    return tg;
}

static inline int pattern_ok(const char *p, size_t n)
{
    return memcmp(p, pattern, n) == 0;  /* glibc's, vectorised */
}

static void evict(struct ring *q)
{
    struct qent *e = &q->e[q->head];
    struct tag *tg = (struct tag *)(e->user - sizeof(struct tag));
    if (q->count > 8)  /* the tag of the block 8 evictions ahead, as libtag */
        __builtin_prefetch(q->e[(q->head + 8) % SLOTS].user - sizeof(struct tag));
    uint64_t w1 = tg->w1, size = (uint32_t)w1;
    if ((w1 >> 32 & 3) != ST_FREED || (w1 & (0xffffull << CHECK_SHIFT)) != check_of((uint64_t)(uintptr_t)tg, tg->w0, w1) ||
        !pattern_ok(e->user, size < FILL ? size : FILL)) {
        __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);  /* kept: leaked */
    } else {
        tg->w1 = 0;
        H_FREE(tg);
    }
    q->head = (q->head + 1) % SLOTS;
    q->count--;
    q->bytes -= size < q->bytes ? size : q->bytes;
}

static inline void release_at(struct thr *t, char *user, struct tag *tg, uint32_t stack)
{
    uint64_t w1 = tg->w1, size = (uint32_t)w1;
    memset(user, 0xfd, size < FILL ? size : FILL);
    w1 = (w1 & ~(3ull << 32 | 0xffffull << CHECK_SHIFT)) | ST_FREED << 32;
    tg->w1 = w1 | check_of((uint64_t)(uintptr_t)tg, tg->w0, w1);
    struct ring *q = t->q;
    if (UNLIKELY(size > budget || !q)) {
        tg->w1 = 0;
        H_FREE(tg);
        return;
    }
    struct qent *e = &q->e[(q->head + q->count) % SLOTS];
    e->user = user;
    e->stack = stack;
    e->time = now_ms();
    e->tid = t->tid;
    q->count++;
    q->bytes += size;
    while (q->count == SLOTS || (q->bytes > budget && q->count > 1))
        evict(q);
}

static inline void release(char *user, void *ret, void **frame)
{
    struct thr *t = me();
    struct tag *tg = live_of(user);
    if (UNLIKELY(!tg)) {
        __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
        return;
    }
    release_at(t, user, tg, capture(t, ret, frame));
}

#define RET __builtin_return_address(0)
#define FRAME ((void **)__builtin_frame_address(0))

EXPORT void *malloc(size_t n) { return alloc(n, RET, FRAME); }
EXPORT void free(void *p)
{
    if (p)
        release(p, RET, FRAME);
}
EXPORT void *calloc(size_t a, size_t b)
{
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = alloc(n, RET, FRAME);
    if (p)
        memset(p, 0, n);
    return p;
}
EXPORT size_t malloc_usable_size(void *p)
{
    return p ? (uint32_t)((struct tag *)((char *)p - sizeof(struct tag)))->w1 : 0;
}
EXPORT void *realloc(void *p, size_t n)
{
    if (!p)
        return alloc(n, RET, FRAME);
    if (n == 0) {
        release(p, RET, FRAME);
        return NULL;
    }
    struct tag *tg = live_of(p);
    if (UNLIKELY(!tg)) {
        __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
        errno = ENOMEM;
        return NULL;
    }
    /* one capture: the new block's allocation and the old one's free */
    struct thr *t = me();
    uint32_t stack = capture(t, RET, FRAME);
    size_t old = (uint32_t)tg->w1, room = H_USABLE(tg) - OVERHEAD;
    if (n <= room && 2 * n > room)  /* in place: tagged anew */
        return tag_live((char *)tg, n, stack, t->tid);
    void *q = alloc_at(t, n, stack);
    if (q) {
        memcpy(q, p, old < n ? old : n);
        release_at(t, p, tg, stack);
    }
    return q;
}
/* aligned blocks are outside the contract measured here */
EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    (void)out, (void)align, (void)n;
    return ENOMEM;
}
EXPORT void *aligned_alloc(size_t align, size_t n) { return align <= 16 ? alloc(n, RET, FRAME) : (errno = ENOMEM, NULL); }
EXPORT void *memalign(size_t align, size_t n) { return align <= 16 ? alloc(n, RET, FRAME) : (errno = ENOMEM, NULL); }

#ifndef ON_MIMALLOC
__attribute__((constructor)) static void cf_atfork(void)
{
    pthread_atfork(_tag_heap_atfork_prepare, _tag_heap_atfork_release, _tag_heap_atfork_release);
}
#endif

__attribute__((destructor)) static void cf_stats(void)
{
    const char *v = getenv("CF_STATS");
    if (v && *v == '1')
        fprintf(stderr, "contract_floor: %llu stacks, %llu failed checks, depth %u, quarantine %llu\n",
                (unsigned long long)nstacks, (unsigned long long)bad, depth, (unsigned long long)budget);
}
