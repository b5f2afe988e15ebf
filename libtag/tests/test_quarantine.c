/* test_quarantine.c - a thread's quarantine alone (src/alloc/quarantine.h,
 * CMake's libtag_quarantine: the quarantine with the tag and the heap):
 * freed blocks leave in the order they came, as the byte budget and the
 * ring's slots push them out, each handed back to the heap with its tag
 * cleared; a block larger than the budget never waits; a held block's free
 * record is found; and a write after free is reported at its own offset
 * when the block leaves, or counted by the snapshot child's check.
 *
 * What the quarantine asks of the folder above it (alloc/anomaly.c's
 * report, alloc/damage.c's verdict) this test gives, recording each call.
 * One thread; the quarantine's threads and snapshots are tests/integration's
 * (test_libtag_semantics.py, test_quarantine_fill.py), under libtag. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/control.h"
#include "base/options.h"
#include "heap/heap.h"
#include "stacks/thread.h"
#include "alloc/anomaly.h"
#include "alloc/damage.h"
#include "alloc/quarantine.h"
#include "alloc/tag.h"

#include "check.h"

/* ------------------------------------------ what the quarantine asks above */
static struct {
    int n;                       /* reports */
    struct tag_report r;         /* the last one */
    struct libtag_free_rec rec;  /* its free record, copied */
} reported;
static int records_made, damaged_asked;
static uint64_t leaked;

void _tag_anomaly(const struct tag_report *r, void *ret, void *frame)
{
    (void)ret, (void)frame;
    reported.n++;
    reported.r = *r;
    if (r->rec)
        reported.rec = *r->rec;
}
void _tag_anomaly_record(const struct tag_report *r, uint32_t tid, uint32_t stack, uint32_t time)
{
    (void)tid, (void)stack, (void)time;
    records_made++;
    reported.r = *r;
}
enum tag_damage _tag_damaged(void *user, const struct libtag_free_rec *rec, void *ret, void *frame)
{
    (void)user, (void)rec, (void)ret, (void)frame;
    damaged_asked++;
    return TAG_DAMAGE_NONE;
}
void _tag_leak_damaged(uint64_t bytes)
{
    leaked += bytes;
}

/* ------------------------------------------------------------- a thread */
static struct tag_thread_state self;
static struct libtag_thread record;
enum { TID = 4242, FREE_STACK = 77 };

static void thread_init(uint64_t budget)
{
    memset(&self, 0, sizeof self);
    memset(&record, 0, sizeof record);
    self.rec = &record;
    self.tid = TID;
    _tag_ctl.threads = (uint64_t)(uintptr_t)&record;
    _tag_ctl.thread_count = 1;
    _tag_ctl.thread_capacity = 1;
    _tag_opt.quarantine_bytes = budget;
    reported.n = records_made = damaged_asked = 0;
    leaked = 0;
}

/* A live block of size bytes, as malloc() makes one: its tag in front,
 * its canary after. */
static char *block(size_t size)
{
    size_t payload = size < TAG_MIN_PAYLOAD ? TAG_MIN_PAYLOAD : size;
    char *raw = _tag_heap_alloc(self.heap_cache, sizeof(struct libtag_tag) + payload + TAG_CANARY_SIZE, 0);
    CHECK(raw != NULL);
    char *user = raw + sizeof(struct libtag_tag);
    _tag_write_live(user, size, 0, 5, TID, 1000, TAG_ALLOC_MALLOC);
    CHECK(_tag_lookup(user) == TAG_IS_LIVE);
    memset(user, 0x5a, size);
    return user;
}

/* free() of it: the tag marked freed, the payload patterned, the block put. */
static void release(char *user, size_t size, uint32_t now)
{
    _tag_write_freed(user, size);
    CHECK(_tag_lookup(user) == TAG_IS_FREED);
    _tag_quarantine_put(&self, user, size, FREE_STACK, now);
}

/* the ring's blocks, oldest first */
static uint32_t held(char **out, uint32_t max)
{
    const struct libtag_quarantine_ring *q = self.quarantine;
    uint32_t n = 0;
    for (uint32_t k = 0; q && k < q->count && n < max; k++)
        out[n++] = (char *)(uintptr_t)q->e[(q->head + k) % TAG_QUARANTINE_SLOTS].user;
    return n;
}

/* ----------------------------------------------------------------- tests */

/* Blocks of 100 bytes under a budget of 1000: ten wait; each further put
 * sends the oldest back to the heap (its tag cleared: no reader sees it as
 * a block), so the ring always holds the newest ten in free order. */
static void evicts_oldest_first_within_budget(void)
{
    enum { N = 25, SIZE = 100, BUDGET = 1000 };
    thread_init(BUDGET);
    char *b[N];
    for (int i = 0; i < N; i++)
        b[i] = block(SIZE);
    for (int i = 0; i < N; i++) {
        release(b[i], SIZE, 2000 + (uint32_t)i);
        const struct libtag_quarantine_ring *q = self.quarantine;
        CHECK(q != NULL);
        uint32_t want = i + 1 < BUDGET / SIZE ? (uint32_t)i + 1 : BUDGET / SIZE;
        CHECK(q->count == want);
        CHECK(q->bytes == (uint64_t)want * SIZE);
        char *h[N];
        CHECK(held(h, N) == want);
        for (uint32_t k = 0; k < want; k++)
            CHECK(h[k] == b[i + 1 - want + k]);
    }
    /* the fifteen evicted: tags cleared, no report */
    for (int i = 0; i < N - BUDGET / SIZE; i++)
        CHECK(_tag_of(b[i])->bits == 0 && _tag_lookup(b[i]) == TAG_NOT_OURS);
    for (int i = N - BUDGET / SIZE; i < N; i++)
        CHECK(_tag_lookup(b[i]) == TAG_IS_FREED);
    CHECK(reported.n == 0 && leaked == 0);
    /* the record the ring keeps of a held block, and none of a block
     * never freed (an entry left behind by an eviction stays until a put
     * reuses its slot: the finder's callers ask only of freed tags) */
    struct libtag_free_rec rec;
    CHECK(_tag_quarantine_find(b[N - 1], &rec) == 1);
    CHECK(rec.free_stack == FREE_STACK && rec.free_tid == TID && rec.free_time == 2000 + N - 1);
    char *live = block(3000);  /* another class: a slot never freed */
    CHECK(_tag_quarantine_find(live, &rec) == 0);
    /* the flush (process exit) empties the ring, in order, and keeps it */
    _tag_quarantine_flush(&self);
    CHECK(self.quarantine != NULL && self.quarantine->count == 0 && self.quarantine->bytes == 0);
    for (int i = 0; i < N; i++)
        CHECK(_tag_lookup(b[i]) == TAG_NOT_OURS);
    /* the heap has them back: the last handed back comes out first */
    CHECK(_tag_heap_alloc(self.heap_cache, sizeof(struct libtag_tag) + SIZE + TAG_CANARY_SIZE, 0) ==
          b[N - 1] - sizeof(struct libtag_tag));
    (void)live;
    _tag_quarantine_drain(&self);
    CHECK(self.quarantine == NULL && record.quarantine == 0);
}

/* Blocks of different sizes: the bytes held never pass the budget after a
 * put, and a put takes out only as many as make room (the newest stays). */
static void byte_budget(void)
{
    enum { N = 64, BUDGET = 4096 };
    thread_init(BUDGET);
    static const size_t sizes[] = {16, 1000, 24, 3000, 40, 4096, 8, 2000, 100};
    uint64_t sum = 0;
    for (int i = 0; i < N; i++) {
        size_t size = sizes[i % (sizeof sizes / sizeof sizes[0])];
        char *b = block(size);
        release(b, size, 3000);
        const struct libtag_quarantine_ring *q = self.quarantine;
        CHECK(q->bytes <= BUDGET);
        char *h[TAG_QUARANTINE_SLOTS];
        uint32_t n = held(h, TAG_QUARANTINE_SLOTS);
        CHECK(n == q->count && n >= 1 && h[n - 1] == b);
        sum = 0;
        for (uint32_t k = 0; k < n; k++)
            sum += _tag_size(_tag_of(h[k]));
        CHECK(sum == q->bytes);
    }
    /* larger than the whole budget: handed back at once, never held */
    uint32_t count = self.quarantine->count;
    char *big = block(BUDGET + 1);
    release(big, BUDGET + 1, 3000);
    CHECK(self.quarantine->count == count);
    CHECK(_tag_lookup(big) == TAG_NOT_OURS);
    CHECK(reported.n == 0);
    _tag_quarantine_drain(&self);
}

/* Tiny blocks under a budget they never reach: the ring's slots are what
 * pushes the oldest out, one a put once it is full. */
static void ring_full(void)
{
    enum { SIZE = 16 };
    thread_init(1u << 30);
    static char *b[TAG_QUARANTINE_SLOTS + 10];
    for (uint32_t i = 0; i < TAG_QUARANTINE_SLOTS + 10; i++)
        b[i] = block(SIZE);  /* all first: an evicted slot is not reused */
    for (uint32_t i = 0; i < TAG_QUARANTINE_SLOTS + 10; i++)
        release(b[i], SIZE, 4000);
    const struct libtag_quarantine_ring *q = self.quarantine;
    CHECK(q->count == TAG_QUARANTINE_SLOTS);
    CHECK(q->bytes == (uint64_t)TAG_QUARANTINE_SLOTS * SIZE);
    CHECK(q->head == 10);
    for (uint32_t i = 0; i < 10; i++)
        CHECK(_tag_lookup(b[i]) == TAG_NOT_OURS);
    CHECK(_tag_lookup(b[10]) == TAG_IS_FREED);
    CHECK((char *)(uintptr_t)q->e[q->head].user == b[10]);
    _tag_quarantine_drain(&self);
}

/* A byte written at offset off of a freed block of size bytes is reported
 * as a use-after-free at block + off when the block leaves, with the
 * block's free record; a byte past the patterned part is not looked at. */
static void write_after_free_at(size_t size, size_t off, int seen)
{
    thread_init(1u << 20);
    char *b = block(size);
    release(b, size, 5000);
    b[off] = 0x41;  /* through a dangling pointer */
    _tag_quarantine_flush(&self);
    if (!seen) {
        CHECK(reported.n == 0);
    } else {
        CHECK(reported.n == 1);
        CHECK(reported.r.kind == TAG_ANOMALY_USE_AFTER_FREE);
        CHECK(reported.r.block == b);
        CHECK(reported.r.address == b + off);
        CHECK(reported.rec.free_stack == FREE_STACK && reported.rec.free_tid == TID &&
              reported.rec.free_time == 5000);
    }
    CHECK(_tag_lookup(b) == TAG_NOT_OURS);  /* handed back all the same */
    _tag_quarantine_drain(&self);
}

static void write_after_free(void)
{
    _tag_opt.quarantine_fill = TAG_QUARANTINE_DEFAULT_FILL;
    write_after_free_at(100, 0, 1);
    write_after_free_at(100, 37, 1);
    write_after_free_at(100, 99, 1);
    write_after_free_at(5, 4, 1);     /* under 8 bytes: byte by byte */
    write_after_free_at(12, 7, 1);    /* 8..15: two overlapping words */
    write_after_free_at(4096, 4095, 1);
    write_after_free_at(6000, 4095, 1);
    write_after_free_at(6000, 4096, 0);  /* past the fill: not patterned */
    /* a smaller fill watches less */
    _tag_opt.quarantine_fill = 256;
    write_after_free_at(1000, 255, 1);
    write_after_free_at(1000, 256, 0);
    _tag_opt.quarantine_fill = TAG_QUARANTINE_DEFAULT_FILL;
}

/* The snapshot child's check: every held block's pattern, the first
 * written one recorded as the anomaly (at its offset) and all counted. */
static void check_all(void)
{
    thread_init(1u << 20);
    memset(&_tag_ctl.anomaly, 0, sizeof _tag_ctl.anomaly);
    _tag_ctl.latent_uaf = _tag_ctl.anomaly_count = 0;
    char *a = block(64), *b = block(64), *c = block(64);
    release(a, 64, 6000);
    release(b, 64, 6001);
    release(c, 64, 6002);
    b[10] = 1;
    c[63] = 2;
    _tag_quarantine_check_all();
    CHECK(_tag_ctl.latent_uaf == 2);
    CHECK(records_made == 1 && _tag_ctl.anomaly_count == 1);
    CHECK(reported.r.kind == TAG_ANOMALY_USE_AFTER_FREE && reported.r.address == b + 10);
    CHECK(self.quarantine->count == 3);  /* only looked at */
    _tag_quarantine_drain(&self);
}

/* A held block whose tag was written over (below its start, after free):
 * the damage verdict is asked, a heap-underflow reported and the block
 * kept from the heap (leaked); its size went with its tag, so its bytes
 * stay counted in the ring's (quarantine.c's trim allows for that). */
static void damaged_tag(void)
{
    thread_init(1u << 20);
    char *b = block(48);
    release(b, 48, 7000);
    _tag_of(b)->bits ^= 1ull << 40;
    _tag_quarantine_flush(&self);
    CHECK(damaged_asked == 1);
    CHECK(reported.n == 1 && reported.r.kind == TAG_ANOMALY_HEAP_UNDERFLOW && reported.r.block == b);
    CHECK(self.quarantine->count == 0 && self.quarantine->bytes == 48);
    CHECK(leaked == 0);
    _tag_quarantine_drain(&self);
}

int main(void)
{
    _tag_ctl.secret = 0x9e3779b97f4a7c15ull;
    _tag_heap_init();
    _tag_opt.quarantine_fill = TAG_QUARANTINE_DEFAULT_FILL;
    /* twice: the pattern's SSE2 code, then AVX2's where the CPU has it */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            _tag_pattern_init();
        evicts_oldest_first_within_budget();
        byte_budget();
        ring_full();
        write_after_free();
        check_all();
        damaged_tag();
    }
    printf("test_quarantine: %d checks passed\n", checks);
    return 0;
}
