/* heap_stress: 16 threads allocate blocks of every size class (and large
 * and aligned ones), fill each with a pattern of its own address, and hand
 * a share of them to the next thread, which checks the pattern and frees
 * them: cross-thread frees, under churn.  A block handed out twice, or
 * memory the heap gave to two blocks at once, breaks some pattern.  Midway
 * one thread forks; the child allocates and frees on the heap it inherited.
 * Prints what it checked; the test compares with the expected counts.
 *
 * heap_stress counts: the per-stack counters.  16 threads allocate from
 * three call sites (site_cross: freed by the next thread; site_own: freed
 * by the thread later, half left live; site_temp: freed at once), and
 * before them main alone from site_peak (10 blocks of 1000 bytes held
 * together) and from site_handoff (blocks a helper thread frees: a peak of
 * 2,000,000 bytes held by one thread, freed by another); each thread
 * counts per site what it allocated, the bytes, what was
 * freed and the temporaries (a block freed by the thread that allocated it
 * before it allocated anything else), and print the sums once every
 * thread has exited.  The test compares them with the counters summed
 * over libtag's per-thread shards in the exit snapshot's core. */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "libtag.h"
/* weak: the test preloads libtag; built alone the victim still links */
extern void libtag_stats(struct libtag_stats *) __attribute__((weak));

#define THREADS 16
#define ROUNDS 20000
#define LIVE 256
#define QUEUE 1024

struct queue {
    pthread_mutex_t lock;
    void *items[QUEUE];
    size_t sizes[QUEUE];
    unsigned head, count;
};
static struct queue queues[THREADS];
static long corrupt, handed, received, aligned_bad, zero_bad, fork_status = -1;

static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

static size_t pick_size(uint64_t r)
{
    switch (r % 16) {
    case 0: return 600 * 1024 + (r >> 8) % (3 << 20);   /* large: a span each */
    case 1: case 2: return 8192 + (r >> 8) % (400 * 1024); /* medium classes */
    default: return 1 + (r >> 8) % 2048;                /* small classes */
    }
}

static void fill(unsigned char *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    size_t m = n < 256 ? n : 256;
    for (size_t i = 0; i < m; i++)
        p[i] = (unsigned char)(a >> (i % 8 * 8)) ^ (unsigned char)i;
    if (n > 8)
        memcpy(p + n - 8, &a, 8);
}

static int intact(const unsigned char *p, size_t n)
{
    uintptr_t a = (uintptr_t)p, tail;
    size_t m = n < 256 ? n : 256;
    if (n > 8 && m > n - 8)
        m = n - 8;  /* the last 8 bytes hold the address */
    for (size_t i = 0; i < m; i++)
        if (p[i] != ((unsigned char)(a >> (i % 8 * 8)) ^ (unsigned char)i))
            return 0;
    if (n > 8) {
        memcpy(&tail, p + n - 8, 8);
        if (tail != a)
            return 0;
    }
    return 1;
}

static void *alloc_one(uint64_t r, size_t *n)
{
    *n = pick_size(r);
    unsigned char *p;
    switch ((r >> 40) % 8) {
    case 0: {
        size_t align = (size_t)16 << ((r >> 44) % 10);  /* 16 .. 8192 */
        p = aligned_alloc(align, *n);
        if (p && ((uintptr_t)p & (align - 1)))
            __atomic_fetch_add(&aligned_bad, 1, __ATOMIC_RELAXED);
        break;
    }
    case 1:
        p = calloc(1, *n);
        if (p) {
            for (size_t i = 0; i < *n; i += 509)
                if (p[i]) {
                    __atomic_fetch_add(&zero_bad, 1, __ATOMIC_RELAXED);
                    break;
                }
        }
        break;
    case 2:
        p = malloc(*n / 2 + 1);
        p = realloc(p, *n);
        break;
    default:
        p = malloc(*n);
    }
    if (p)
        fill(p, *n);
    return p;
}

static void check_free(void *p, size_t n)
{
    if (!intact(p, n))
        __atomic_fetch_add(&corrupt, 1, __ATOMIC_RELAXED);
    free(p);
}

static void drain(unsigned me)
{
    struct queue *q = &queues[me];
    pthread_mutex_lock(&q->lock);
    while (q->count) {
        check_free(q->items[q->head], q->sizes[q->head]);
        q->head = (q->head + 1) % QUEUE;
        q->count--;
        __atomic_fetch_add(&received, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&q->lock);
}

static void *worker(void *arg)
{
    unsigned me = (unsigned)(uintptr_t)arg;
    uint64_t s = me * 2654435761u + 17;
    void *live[LIVE] = {0};
    size_t sizes[LIVE] = {0};
    for (long i = 0; i < ROUNDS; i++) {
        uint64_t r = rng(&s);
        unsigned k = r % LIVE;
        if (live[k]) {
            struct queue *q = &queues[(me + 1) % THREADS];
            int handed_off = 0;
            if ((r >> 20) % 3 == 0) {  /* a third go to the next thread */
                pthread_mutex_lock(&q->lock);
                if (q->count < QUEUE) {
                    unsigned at = (q->head + q->count) % QUEUE;
                    q->items[at] = live[k];
                    q->sizes[at] = sizes[k];
                    q->count++;
                    handed_off = 1;
                }
                pthread_mutex_unlock(&q->lock);
            }
            if (handed_off)
                __atomic_fetch_add(&handed, 1, __ATOMIC_RELAXED);
            else
                check_free(live[k], sizes[k]);
        }
        live[k] = alloc_one(r >> 3, &sizes[k]);
        if (i % 64 == 0)
            drain(me);
        if (me == 3 && i == ROUNDS / 2) {
            pid_t pid = fork();
            if (pid == 0) {
                /* the child: one thread, the heap as the fork found it */
                for (int j = 0; j < 2000; j++) {
                    size_t n;
                    void *p = alloc_one(rng(&s), &n);
                    check_free(p, n);
                }
                _exit(corrupt == 0 ? 0 : 1);
            }
            int st;
            waitpid(pid, &st, 0);
            fork_status = WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
        }
    }
    for (unsigned k = 0; k < LIVE; k++)
        if (live[k])
            check_free(live[k], sizes[k]);
    return NULL;
}

/* A large block grows in place, first thing on a fresh heap: at the heap's
 * end, then into the slices a freed neighbour left (one larger than the
 * 1 MiB quarantine goes straight back), its bytes kept.  Printed after:
 * stdout's buffer would take the slices after the block. */
static void grow_large(void)
{
    char *a = malloc(600 << 10);
    memset(a, 0x5a, 600 << 10);
    char *b = realloc(a, 900 << 10);
    char *next = malloc(1200 << 10);
    free(next);
    char *c = realloc(b, 1800 << 10);
    int kept = c[0] == 0x5a && c[(600 << 10) - 1] == 0x5a;
    printf("grow_at_end=%d grow_into_free=%d kept=%d\n", a == b, b == c, kept);
    free(c);
}

/* ------------------------------------------------------------ counts -- */
enum { SITE_CROSS, SITE_OWN, SITE_TEMP, SITE_PEAK, SITE_HANDOFF, SITES };
static const char *const site_names[SITES] = {"site_cross", "site_own", "site_temp", "site_peak",
                                              "site_handoff"};
#define COUNT_ROUNDS 20000
#define COUNT_WINDOW 128
struct site_count {
    long allocs, temporaries, alloc_bytes, freed_bytes;
};
/* [thread][site], main's row, then the helper's of site_handoff: each row
 * written by its thread alone */
#define MAIN THREADS
#define HELPER (THREADS + 1)
static struct site_count counted[THREADS + 2][SITES];
static struct queue handoff[THREADS];

/* Each block starts with its site and size: whoever frees it counts it. */
struct stamp {
    uint32_t site, size;
};
static void *last_alloc[THREADS + 2];  /* each thread's newest block */

static void *stamped(void *p, unsigned me, unsigned site, size_t n)
{
    struct stamp st = {site, (uint32_t)n};
    memcpy(p, &st, sizeof st);
    counted[me][site].allocs++;
    counted[me][site].alloc_bytes += (long)n;
    last_alloc[me] = p;
    return p;
}
/* One call of malloc each, and a call after it: not a tail call, so the
 * site is the stack's innermost frame of the program. */
__attribute__((noinline)) static void *site_cross(unsigned me, size_t n)
{
    return stamped(malloc(n), me, SITE_CROSS, n);
}
__attribute__((noinline)) static void *site_own(unsigned me, size_t n)
{
    return stamped(malloc(n), me, SITE_OWN, n);
}
__attribute__((noinline)) static void *site_temp(unsigned me, size_t n)
{
    return stamped(malloc(n), me, SITE_TEMP, n);
}
__attribute__((noinline)) static void *site_peak(unsigned me, size_t n)
{
    return stamped(malloc(n), me, SITE_PEAK, n);
}
__attribute__((noinline)) static void *site_handoff(unsigned me, size_t n)
{
    return stamped(malloc(n), me, SITE_HANDOFF, n);
}

static void counted_free(unsigned me, void *p)
{
    struct stamp st;
    memcpy(&st, p, sizeof st);
    counted[me][st.site].freed_bytes += st.size;
    if (p == last_alloc[me]) {
        counted[me][st.site].temporaries++;
        last_alloc[me] = NULL;
    }
    free(p);
}

static void counted_drain(unsigned me, unsigned q_of)
{
    struct queue *q = &handoff[q_of];
    pthread_mutex_lock(&q->lock);
    while (q->count) {
        counted_free(me, q->items[q->head]);
        q->head = (q->head + 1) % QUEUE;
        q->count--;
    }
    pthread_mutex_unlock(&q->lock);
}

static void *count_worker(void *arg)
{
    unsigned me = (unsigned)(uintptr_t)arg;
    uint64_t s = me * 2654435761u + 99;
    void *win[COUNT_WINDOW] = {0};
    for (long i = 0; i < COUNT_ROUNDS; i++) {
        uint64_t r = rng(&s);
        size_t n = sizeof(struct stamp) + (r >> 16) % 3000;
        switch (r % 8) {
        case 0: case 1: case 2: {
            void *p = site_cross(me, n);
            struct queue *q = &handoff[(me + 1) % THREADS];
            pthread_mutex_lock(&q->lock);
            int full = q->count == QUEUE;
            if (!full) {
                q->items[(q->head + q->count) % QUEUE] = p;
                q->count++;
            }
            pthread_mutex_unlock(&q->lock);
            if (full)
                counted_free(me, p);
            break;
        }
        case 3: case 4: case 5: {
            unsigned k = (unsigned)(r >> 40) % COUNT_WINDOW;
            if (win[k])
                counted_free(me, win[k]);
            win[k] = site_own(me, n);
            break;
        }
        default:
            counted_free(me, site_temp(me, n));
        }
        if (i % 64 == 0)
            counted_drain(me, me);
    }
    for (unsigned k = 0; k < COUNT_WINDOW; k += 2)  /* half stay live */
        if (win[k])
            counted_free(me, win[k]);
    return NULL;
}

/* site_handoff: main allocates 200 blocks of 10,000 bytes, the helper
 * frees them all, then main allocates 50 more, which the helper frees: the
 * stack's true peak is 2,000,000 bytes, allocated by one thread and freed
 * by another. */
static void *handed_over[200];
static pthread_barrier_t handoff_turn;

static void *handoff_helper(void *arg)
{
    for (int round = 0; round < 2; round++) {
        pthread_barrier_wait(&handoff_turn);  /* main's blocks are there */
        for (int i = 0; i < (round ? 50 : 200); i++)
            counted_free(HELPER, handed_over[i]);
        pthread_barrier_wait(&handoff_turn);
    }
    return arg;
}

static int counts(void)
{
    pthread_t helper;
    pthread_barrier_init(&handoff_turn, NULL, 2);
    pthread_create(&helper, NULL, handoff_helper, NULL);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < (round ? 50 : 200); i++)
            handed_over[i] = site_handoff(MAIN, 10000);
        pthread_barrier_wait(&handoff_turn);
        pthread_barrier_wait(&handoff_turn);  /* the helper freed them */
    }
    pthread_join(helper, NULL);
    /* main alone: 10 blocks of 1000 bytes held together, then freed (last:
     * main's newest block is then one it freed itself, as libtag sees it
     * too, whatever the C library allocates in main after) */
    void *held[10];
    for (int i = 0; i < 10; i++)
        held[i] = site_peak(MAIN, 1000);
    for (int i = 0; i < 10; i++)
        counted_free(MAIN, held[i]);
    pthread_t t[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        pthread_mutex_init(&handoff[i].lock, NULL);
    for (unsigned i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, count_worker, (void *)(uintptr_t)i);
    for (unsigned i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (unsigned i = 0; i < THREADS; i++)  /* what the exited threads left */
        counted_drain(MAIN, i);
    for (unsigned site = 0; site < SITES; site++) {
        struct site_count sum = {0};
        for (unsigned me = 0; me <= HELPER; me++) {
            sum.allocs += counted[me][site].allocs;
            sum.temporaries += counted[me][site].temporaries;
            sum.alloc_bytes += counted[me][site].alloc_bytes;
            sum.freed_bytes += counted[me][site].freed_bytes;
        }
        printf("count %s allocs=%ld temporaries=%ld live_bytes=%ld alloc_bytes=%ld\n",
               site_names[site], sum.allocs, sum.temporaries, sum.alloc_bytes - sum.freed_bytes,
               sum.alloc_bytes);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "counts") == 0)
        return counts();
    pthread_t t[THREADS];
    grow_large();
    for (unsigned i = 0; i < THREADS; i++)
        pthread_mutex_init(&queues[i].lock, NULL);
    for (unsigned i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    for (unsigned i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (unsigned i = 0; i < THREADS; i++)
        drain(i);
    /* mallinfo2 says what libtag's counters say is in use (no allocation
     * between the two) */
    struct mallinfo2 mi = mallinfo2();
    struct libtag_stats st = {0};
    if (libtag_stats)
        libtag_stats(&st);
    printf("handed=%ld received=%ld\n", handed, received);
    printf("corrupt=%ld aligned_bad=%ld zero_bad=%ld fork_child=%ld\n", corrupt, aligned_bad,
           zero_bad, fork_status);
    printf("in_use=%zu live_bytes=%lu\n", mi.uordblks, (unsigned long)st.live_bytes);
    printf("trim=%d\n", malloc_trim(0));
    /* realloc within the slot keeps the block where it is (100 bytes and a
     * tag sit in a 160-byte slot; 104 fit it too), beyond it moves it */
    char *p = malloc(100), *q = realloc(p, 104);
    printf("realloc_in_place=%d\n", p == q);
    char *r = realloc(q, 4000);
    printf("realloc_moved=%d\n", r != q);
    free(r);
    return 0;
}
