/* lt_threads.c - 8 threads allocate and free concurrently; at the end every
 * counter and every tag must add up.
 *
 * Each thread: ITERS rounds of malloc/calloc/realloc/free over a ring of
 * RING live blocks (sizes from a per-thread sequence, so expected counts
 * are exact), then HANDOFF blocks for its neighbour, a barrier, and it
 * frees the HANDOFF blocks its other neighbour made (cross-thread free),
 * checking each freed tag says "freed by me, allocated by them".  It keeps
 * KEEP blocks live until after the join, filled with its own byte.
 *
 * Output (all after the join, from main):
 *   thread <i> <field> got=<n> want=<n>   for allocs frees alloc_bytes free_bytes
 *   thread <i> exited=<0|1>
 *   thread <i> handoff freed_ok=<n> want=<n>
 *   thread <i> kept tags_ok=<n> content_ok=<n> want=<n>
 *   total <field> got=<n> want=<n>        libtag_stats against the records
 *   threads_new got=<n> want=8
 * Without libtag: "no-libtag".
 */
#include <pthread.h>
#include <stdlib.h>

#include "lt_reader.c"

#define NTHREADS 8
#define ITERS 20000
#define RING 64
#define HANDOFF 200
#define KEEP 50

struct worker {
    int index;
    uint32_t tid;
    /* what the thread did, counted by itself */
    uint64_t allocs, frees, alloc_bytes, free_bytes;
    unsigned handoff_freed_ok;
    void *handoff[HANDOFF];        /* made by this thread, freed by index+1 */
    size_t handoff_size[HANDOFF];
    void *keep[KEEP];
    size_t keep_size[KEEP];
};

static struct worker workers[NTHREADS];
static pthread_barrier_t barrier;

static size_t next_size(uint64_t *seed)
{
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = *seed >> 33;
    /* mostly small, sometimes a page or two */
    return (r % 16 == 0) ? 4096 + r % 8000 : r % 600;
}

static void *run(void *arg)
{
    struct worker *w = arg;
    w->tid = lt_gettid();
    uint64_t seed = (uint64_t)w->index * 7919 + 1;
    unsigned char mark = (unsigned char)(0x40 + w->index);
    void *ring[RING] = {0};
    size_t ring_size[RING] = {0};

    for (int i = 0; i < ITERS; i++) {
        int slot = i % RING;
        if (ring[slot]) {
            if (i % 5 == 0) {
                /* realloc: one alloc of the new size, one free of the old */
                size_t n = next_size(&seed) + 1;
                void *q = realloc(ring[slot], n);
                w->allocs++;
                w->alloc_bytes += n;
                w->frees++;
                w->free_bytes += ring_size[slot];
                memset(q, mark, n);
                ring[slot] = q;
                ring_size[slot] = n;
                continue;
            }
            free(ring[slot]);
            w->frees++;
            w->free_bytes += ring_size[slot];
        }
        size_t n = next_size(&seed);
        void *p = (i % 3 == 0) ? calloc(1, n) : malloc(n);
        w->allocs++;
        w->alloc_bytes += n;
        memset(p, mark, n);
        ring[slot] = p;
        ring_size[slot] = n;
    }
    for (int s = 0; s < RING; s++) {
        free(ring[s]);
        w->frees++;
        w->free_bytes += ring_size[s];
    }
    for (int k = 0; k < HANDOFF; k++) {
        size_t n = 16 + (size_t)k;
        w->handoff[k] = malloc(n);
        w->handoff_size[k] = n;
        w->allocs++;
        w->alloc_bytes += n;
    }
    for (int k = 0; k < KEEP; k++) {
        size_t n = 1 + (size_t)k * 3;
        w->keep[k] = malloc(n);
        w->keep_size[k] = n;
        memset(w->keep[k], mark, n);
        w->allocs++;
        w->alloc_bytes += n;
    }
    pthread_barrier_wait(&barrier);
    /* Free the blocks the previous thread made; they wait in *this*
     * thread's quarantine, so their tags can be read right after. */
    struct worker *prev = &workers[(w->index + NTHREADS - 1) % NTHREADS];
    for (int k = 0; k < HANDOFF; k++) {
        free(prev->handoff[k]);
        w->frees++;
        w->free_bytes += prev->handoff_size[k];
    }
    for (int k = 0; k < HANDOFF; k++) {
        const struct libtag_tag *t = lt_tag(prev->handoff[k]);
        const struct libtag_free_rec *f = lt_free_rec(prev->handoff[k]);
        if (t && f && lt_state(t) == TAG_STATE_FREED && lt_tid_is(t, prev->tid) &&
            f->free_tid == w->tid && lt_size(t) == prev->handoff_size[k])
            w->handoff_freed_ok++;
    }
    /* Everyone has read before anyone exits and drains its quarantine. */
    pthread_barrier_wait(&barrier);
    return NULL;
}

static void field(int i, const char *name, uint64_t got, uint64_t want)
{
    printf("thread %d %s got=%llu want=%llu\n", i, name, (unsigned long long)got,
           (unsigned long long)want);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    printf("libtag\n");   /* stdout's buffer is allocated before the counters */
    struct libtag_stats s0, s1;
    libtag_stats(&s0);
    struct libtag_thread m0 = *lt_record(lt_gettid()), m1;
    pthread_barrier_init(&barrier, NULL, NTHREADS);
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        workers[i].index = i;
        pthread_create(&th[i], NULL, run, &workers[i]);
    }
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    libtag_stats(&s1);
    m1 = *lt_record(lt_gettid());

    uint64_t sum_allocs = 0, sum_frees = 0, sum_ab = 0, sum_fb = 0;
    for (int i = 0; i < NTHREADS; i++) {
        struct worker *w = &workers[i];
        const struct libtag_thread *r = lt_record(w->tid);
        if (!r) {
            printf("thread %d record missing\n", i);
            continue;
        }
        field(i, "allocs", r->allocs, w->allocs);
        field(i, "frees", r->frees, w->frees);
        field(i, "alloc_bytes", r->alloc_bytes, w->alloc_bytes);
        field(i, "free_bytes", r->free_bytes, w->free_bytes);
        printf("thread %d exited=%d\n", i, (r->flags & TAG_THREAD_EXITED) != 0);
        printf("thread %d handoff freed_ok=%u want=%d\n", i, w->handoff_freed_ok, HANDOFF);
        unsigned tags_ok = 0, content_ok = 0;
        for (int k = 0; k < KEEP; k++) {
            const struct libtag_tag *t = lt_tag(w->keep[k]);
            if (t && lt_state(t) == TAG_STATE_LIVE && lt_tid_is(t, w->tid) &&
                lt_size(t) == w->keep_size[k] && t->alloc_stack != 0 &&
                lt_canary_ok(w->keep[k]))
                tags_ok++;
            const unsigned char *p = w->keep[k];
            int same = 1;
            for (size_t b = 0; b < w->keep_size[k]; b++)
                same &= p[b] == (unsigned char)(0x40 + i);
            content_ok += same;
        }
        printf("thread %d kept tags_ok=%u content_ok=%u want=%d\n", i, tags_ok, content_ok, KEEP);
        sum_allocs += r->allocs;
        sum_frees += r->frees;
        sum_ab += r->alloc_bytes;
        sum_fb += r->free_bytes;
    }
    /* Between s0 and s1 only main (pthread_create's own allocations) and
     * the workers (records created after s0) ran. */
    uint64_t want_allocs = sum_allocs + (m1.allocs - m0.allocs);
    uint64_t want_frees = sum_frees + (m1.frees - m0.frees);
    uint64_t want_ab = sum_ab + (m1.alloc_bytes - m0.alloc_bytes);
    uint64_t want_fb = sum_fb + (m1.free_bytes - m0.free_bytes);
    printf("total allocs got=%llu want=%llu\n", (unsigned long long)(s1.allocs - s0.allocs),
           (unsigned long long)want_allocs);
    printf("total frees got=%llu want=%llu\n", (unsigned long long)(s1.frees - s0.frees),
           (unsigned long long)want_frees);
    printf("total live_blocks got=%lld want=%lld\n",
           (long long)(s1.live_blocks - s0.live_blocks), (long long)(want_allocs - want_frees));
    printf("total live_bytes got=%lld want=%lld\n",
           (long long)(s1.live_bytes - s0.live_bytes), (long long)(want_ab - want_fb));
    printf("total workers_live_blocks got=%lld want=%d\n",
           (long long)(sum_allocs - sum_frees), NTHREADS * KEEP);
    printf("threads_new got=%u want=%d\n", s1.thread_count - s0.thread_count, NTHREADS);
    printf("anomalies got=%u want=0\n", s1.anomalies);
    return 0;
}
