/* rob_churn.c - 16 threads churning allocations while snapshots are taken.
 *
 *   rob_churn SECONDS
 *
 * Each thread owns SLOTS slots of table[thread]; in a loop it picks a slot
 * with its own xorshift generator: an empty slot gets a new block (malloc or
 * calloc, 32 bytes to 2 KB, one in 64 up to 192 KB so glibc mmaps it), a full
 * one is verified and then freed or grown with realloc.  Every block starts
 * with a header (magic, tid, slot, seq, size) and its payload is filled with
 * seq's low byte; before a block is freed, realloc'ed or at the end, every
 * byte is checked.  Order matters for a reader of a snapshot: a slot is set
 * (release store) only after its block is filled, and cleared before the
 * block is freed, so every non-NULL slot in any snapshot points at a live,
 * filled block whose tag says header.size.
 *
 * After SECONDS the threads stop; each replays its sequence of choices
 * without touching the heap and compares the sum of what it read back from
 * its blocks with the sum the replay predicts.  Prints "table ADDR",
 * "thread I TID ops N sum S replay R errors E" per thread and "result ok"
 * (exit 0) or "result bad" (exit 1).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define THREADS 16
#define SLOTS 512
#define MAGIC 0x524f42434855524eull /* "NRUHCBOR" */

struct hdr {
    uint64_t magic;
    uint32_t tid;
    uint32_t slot;
    uint64_t seq;
    uint64_t size;  /* bytes of the block, header included */
};

struct hdr *table[THREADS][SLOTS];
static volatile int stop;

struct result {
    uint32_t tid;
    uint64_t ops, sum, replay, errors;
};
static struct result results[THREADS];

static uint64_t next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static uint64_t pick_size(uint64_t r)
{
    if ((r >> 40) % 64 == 0)
        return 65536 + (r >> 20) % (128 * 1024);
    return sizeof(struct hdr) + (r >> 20) % 2000;
}

static void fill(struct hdr *h, uint32_t tid, uint32_t slot, uint64_t seq, uint64_t size, uint64_t from)
{
    h->magic = MAGIC;
    h->tid = tid;
    h->slot = slot;
    h->seq = seq;
    h->size = size;
    if (from < sizeof *h)
        from = sizeof *h;
    memset((char *)h + from, (int)(seq & 0xff), size - from);
}

/* The block's checksum contribution; counts a mismatch in *errors. */
static uint64_t verify(const struct hdr *h, uint32_t tid, uint32_t slot, uint64_t upto, uint64_t *errors)
{
    if (h->magic != MAGIC || h->tid != tid || h->slot != slot) {
        (*errors)++;
        return 0;
    }
    const unsigned char *p = (const unsigned char *)h;
    unsigned char want = (unsigned char)(h->seq & 0xff);
    for (uint64_t i = sizeof *h; i < upto; i++)
        if (p[i] != want) {
            (*errors)++;
            break;
        }
    return h->seq * 31 + h->size;
}

static void *worker(void *arg)
{
    uint32_t me = (uint32_t)(uintptr_t)arg;
    uint32_t tid = (uint32_t)syscall(SYS_gettid);
    struct result *res = &results[me];
    uint64_t x = 0x9E3779B97F4A7C15ull * (me + 1), seq = 0, sum = 0, errors = 0, ops = 0;
    res->tid = tid;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        for (int k = 0; k < 256; k++, ops++) {
            uint64_t r = next(&x);
            uint32_t slot = (uint32_t)(r % SLOTS);
            struct hdr *h = table[me][slot];
            if (!h) {
                uint64_t size = pick_size(r);
                h = (r >> 8) % 8 == 0 ? calloc(1, size) : malloc(size);
                if (!h) {
                    errors++;
                    continue;
                }
                fill(h, tid, slot, ++seq, size, 0);
                __atomic_store_n(&table[me][slot], h, __ATOMIC_RELEASE);
                continue;
            }
            sum += verify(h, tid, slot, h->size, &errors);
            __atomic_store_n(&table[me][slot], NULL, __ATOMIC_RELEASE);
            if ((r >> 12) % 4 == 0) {  /* grow or shrink it instead */
                uint64_t old = h->size, size = pick_size(r * 3);
                struct hdr *n = realloc(h, size);
                if (!n) {
                    errors++;
                    continue;
                }
                uint64_t keep = old < size ? old : size;
                sum += verify(n, tid, slot, keep, &errors);
                fill(n, tid, slot, ++seq, size, 0);
                __atomic_store_n(&table[me][slot], n, __ATOMIC_RELEASE);
            } else {
                free(h);
            }
        }
    }
    for (uint32_t s = 0; s < SLOTS; s++) {
        struct hdr *h = table[me][s];
        if (h) {
            sum += verify(h, tid, s, h->size, &errors);
            __atomic_store_n(&table[me][s], NULL, __ATOMIC_RELEASE);
            free(h);
        }
    }
    /* The replay: the same choices, the blocks' (seq, size) kept aside. */
    static __thread uint64_t rseq[SLOTS], rsize[SLOTS];
    uint64_t y = 0x9E3779B97F4A7C15ull * (me + 1), s2 = 0, q = 0;
    memset(rseq, 0, sizeof rseq);
    for (uint64_t i = 0; i < ops; i++) {
        uint64_t r = next(&y);
        uint32_t slot = (uint32_t)(r % SLOTS);
        if (!rseq[slot]) {
            rseq[slot] = ++q;
            rsize[slot] = pick_size(r);
            continue;
        }
        s2 += rseq[slot] * 31 + rsize[slot];
        if ((r >> 12) % 4 == 0) {
            uint64_t size = pick_size(r * 3);
            s2 += rseq[slot] * 31 + rsize[slot];  /* verified again after realloc */
            rseq[slot] = ++q;
            rsize[slot] = size;
        } else {
            rseq[slot] = 0;
        }
    }
    for (uint32_t s = 0; s < SLOTS; s++)
        if (rseq[s])
            s2 += rseq[s] * 31 + rsize[s];
    res->ops = ops;
    res->sum = sum;
    res->replay = s2;
    res->errors = errors;
    return NULL;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    pthread_t th[THREADS];
    printf("pid %d\ntable %p\n", (int)getpid(), (void *)table);
    fflush(stdout);
    for (uintptr_t i = 0; i < THREADS; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)i) != 0)
            return 2;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)  /* a snapshot signal may interrupt it */
        ;
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    int ok = 1;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        struct result *r = &results[i];
        printf("thread %d %u ops %lu sum %lu replay %lu errors %lu\n", i, r->tid,
               (unsigned long)r->ops, (unsigned long)r->sum, (unsigned long)r->replay,
               (unsigned long)r->errors);
        ok &= r->sum == r->replay && r->errors == 0 && r->ops > 0;
    }
    printf("result %s\n", ok ? "ok" : "bad");
    return ok ? 0 : 1;
}
