/* lt_small_stacks.c - threads with the smallest stacks POSIX lets a program
 * ask for (PTHREAD_STACK_MIN) and with 32 KiB stacks, each allocating and
 * freeing, one of each group down a call chain.
 *
 * glibc carves a library's static TLS out of each new thread's stack: when
 * libtag kept its ~34 KiB per-thread state there, pthread_create of such a
 * thread failed with EINVAL under LD_PRELOAD=libtag.so (or the thread ran
 * out of stack), where it works without libtag.
 *
 * stdout is the same with and without libtag (a test compares them):
 *   stack <label> thread <i> create=<errno> join=<errno> sum=<checksum>
 * stderr, under libtag only, what libtag recorded of each thread's blocks:
 *   libtag <label> thread <i> kept=<n> tags_ok=<n> stacks_set=<n> depth=<frames>
 * (depth: frames of the stack of the block made at the bottom of the call
 * chain; 0 in the threads without one).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "lt_reader.c"

#define NTHREADS 4
#define ITERS 2000
#define RING 16
#define KEEP 8
#define CHAIN 24

struct worker {
    int index;
    uint64_t sum;
    void *keep[KEEP];
    void *deep;                /* made at the bottom of the chain */
    uint32_t tid;
};

static size_t next_size(uint64_t *seed)
{
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = *seed >> 33;
    return (r % 32 == 0) ? 2048 + r % 3000 : 1 + r % 300;
}

/* A call chain of n frames with an allocation at its bottom. */
__attribute__((noinline)) static void *chain(int n, size_t size)
{
    if (n == 0) {
        char *p = malloc(size);
        if (p)
            memset(p, 0x5a, size);
        return p;
    }
    void *p = chain(n - 1, size + 1);
    __asm__ volatile("" ::: "memory");  /* no tail call: every frame stays */
    return p;
}

static void *run(void *arg)
{
    struct worker *w = arg;
    w->tid = lt_gettid();
    uint64_t seed = (uint64_t)w->index * 104729 + 7;
    void *ring[RING] = {0};
    size_t ring_size[RING] = {0};
    for (int i = 0; i < ITERS; i++) {
        int slot = i % RING;
        if (ring[slot]) {
            const unsigned char *c = ring[slot];
            w->sum = w->sum * 31 + c[0] + c[ring_size[slot] - 1];
            free(ring[slot]);
        }
        size_t n = next_size(&seed);
        ring[slot] = i % 7 == 0 ? calloc(1, n) : malloc(n);
        ring_size[slot] = n;
        memset(ring[slot], (int)(i & 0xff), n);
        if (w->index == 0 && i % 100 == 0) {
            void *d = chain(CHAIN, 40);
            w->sum = w->sum * 31 + ((unsigned char *)d)[0];
            free(d);
        }
    }
    for (int i = 0; i < RING; i++)
        free(ring[i]);
    for (int i = 0; i < KEEP; i++) {
        w->keep[i] = malloc(64 + (size_t)i);
        memset(w->keep[i], w->index, 64 + (size_t)i);
    }
    if (w->index == 0)
        w->deep = chain(CHAIN, 40);
    return NULL;
}

/* Frames of stack id (0 without libtag). */
static unsigned stack_depth(uint32_t id)
{
    const struct libtag_control *c = lt_ctl();
    if (!c)
        return 0;
    const struct libtag_stack_node *nodes =
        (const struct libtag_stack_node *)(uintptr_t)c->stack_nodes;
    unsigned n = 0;
    while (id != 0 && id < c->stack_count && n < 1000) {
        id = nodes[id].parent;
        n++;
    }
    return n;
}

static void group(const char *label, size_t stack)
{
    struct worker w[NTHREADS];
    pthread_t th[NTHREADS];
    int created[NTHREADS];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    int rc = pthread_attr_setstacksize(&attr, stack);
    if (rc)
        printf("stack %s setstacksize=%d\n", label, rc);
    for (int i = 0; i < NTHREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].index = i;
        created[i] = pthread_create(&th[i], &attr, run, &w[i]);
    }
    pthread_attr_destroy(&attr);
    for (int i = 0; i < NTHREADS; i++) {
        int joined = created[i] ? -1 : pthread_join(th[i], NULL);
        printf("stack %s thread %d create=%d join=%d sum=%llx\n", label, i, created[i],
               joined, (unsigned long long)w[i].sum);
        if (created[i])
            continue;
        if (lt_ctl()) {
            int tags_ok = 0, stacks_set = 0;
            for (int k = 0; k < KEEP; k++) {
                const struct libtag_tag *t = lt_tag(w[i].keep[k]);
                if (t && lt_state(t) == TAG_STATE_LIVE && lt_tid_is(t, w[i].tid) &&
                    lt_size(t) == 64 + (uint64_t)k && lt_canary_ok(w[i].keep[k]))
                    tags_ok++;
                if (t && t->alloc_stack != 0)
                    stacks_set++;
            }
            const struct libtag_tag *d = lt_tag(w[i].deep);
            fprintf(stderr, "libtag %s thread %d kept=%d tags_ok=%d stacks_set=%d depth=%u\n",
                    label, i, KEEP, tags_ok, stacks_set, d ? stack_depth(d->alloc_stack) : 0);
        }
        for (int k = 0; k < KEEP; k++)
            free(w[i].keep[k]);
        free(w[i].deep);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    group("min", PTHREAD_STACK_MIN);
    group("32k", 32768);
    return 0;
}
