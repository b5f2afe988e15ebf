/* stack_table.c - interned call stacks.
 *
 * A stack is a chain of nodes (pc, kind, parent); its id is the index of its
 * innermost node, so a stack is stored once however many blocks share it and
 * a reader of a core walks parent links to recover the frames.  The node
 * array and the hash index live in memory libtag maps itself (MAP_NORESERVE:
 * only pages that are touched cost memory), never in the heap it tags.
 *
 * Concurrency: lookups are lock-free.  A node is completely written before
 * its id is published into a hash slot with a release store; readers load
 * slots with acquire.  Inserts (rare after warm-up) take table_lock, a
 * spinlock, and re-probe.  In front of the table each thread has a small
 * direct-mapped cache (tag_thread_state.cache), so the common capture touches no
 * shared cache line at all.
 *
 * Sized by use: the node and per-stack counter arrays are reserved for the
 * capacity (LIBTAG_STACK_NODES) but committed in steps as nodes are added,
 * and the hash index starts small and doubles when it is half full (under
 * the lock: every id re-hashed into a new index, published with one release
 * store).  A reader still probing the old index finds what was in it, or
 * misses a newer node and inserts under the lock, which re-probes the
 * current index; an old index is never written again and never unmapped.
 * So a program that interns millions of nodes is not held to a table sized
 * for a small one: a full table made every capture of numpy's test suite
 * fail its inserts under the lock (docs/design.md, "The stack table grows
 * by use").
 *
 * Full (the cap reached, or no memory to commit): an insert that finds no
 * room returns a TAG_FRAME_LOST child of the parent it was given, from a
 * reserve kept for these markers (a 64th of the cap), and a capture whose
 * parent is such a marker stays on it.  So a stack keeps the outer frames
 * the table holds and ends in a marker that says what is missing, never a
 * shorter stack that looks whole; the answer is the same every time, so
 * the per-thread cache keeps it and a full table costs a capture what a
 * hit does (no lock: the count is checked first).  The marker nodes are
 * found without the lock too; only a parent's first one takes it.
 */
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "base/options.h"
#include "base/prim.h"
#include "stacks/stack_table.h"
#include "stacks/thread.h"

/* The hash index: mask + 1 slots of node ids, 0 = empty. */
struct stack_index {
    uint32_t mask;
    uint32_t used;              /* ids in it */
    uint32_t slots[];
};
static struct libtag_stack_node *nodes;   /* [capacity], committed [0, committed) */
static struct stack_index *index_cur;     /* the current index (release/acquire) */
static uint32_t capacity;
static uint32_t ordinary;                 /* nodes other than markers: capacity - reserve */
static uint32_t lost_root;                /* the marker with no frames outside it */
static uint32_t committed;                /* nodes (and counters) committed */
static int table_lock;
#define FIRST_SLOTS (1u << 12)              /* 16 KiB: the first index */
#define COMMIT_NODES (1u << 16)             /* nodes committed a step (1 MiB) */
struct libtag_stack_stats *_tag_stats;    /* [capacity]: entries given out dense */
uint32_t *_tag_stats_slots;                /* [capacity] */
static uint32_t stats_limit;               /* entry numbers stay below it */

/* Per-stack counters for allocation stacks only.  A stack's entry number
 * is given at its first allocation: from a counter, published with a
 * compare-and-swap (a thread that loses takes the winner's; its number is
 * left unused).  Numbers start at TAG_SHARD_ENTRIES (stacks/stack_table.h,
 * _tag_shard_of: the lookup's one test), so they stay below the nodes
 * committed plus that (the shared entries are committed with the nodes,
 * TAG_SHARD_ENTRIES ahead, so no commit happens here) and below what a
 * thread's shard directory reaches: lock-free and async-signal-safe. */
TAG_COLD uint32_t _tag_stats_new(uint32_t stack)
{
    uint32_t limit = __atomic_load_n(&committed, __ATOMIC_RELAXED) + TAG_SHARD_ENTRIES;
    if (limit > stats_limit)
        limit = stats_limit;
    if (__atomic_load_n(&_tag_ctl.stack_stats_used, __ATOMIC_RELAXED) >= limit)
        return 0;  /* none left: the stack is counted nowhere (tag_abi.h) */
    uint32_t e = __atomic_fetch_add(&_tag_ctl.stack_stats_used, 1, __ATOMIC_RELAXED);
    if (TAG_UNLIKELY(e >= limit))
        return 0;
    uint32_t none = 0;
    if (!__atomic_compare_exchange_n(&_tag_stats_slots[stack], &none, e, 0, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED))
        e = none;
    return e;
}

/* The shards' chunks (tag_abi.h, "per-stack counters"): chunk k of the pool
 * (TAG_SHARD_ENTRIES entries, 128 KiB) is described by chunk record k.  One
 * reservation, never given back (a thread that exits leaves its counts in
 * the core), committed from its start in steps of SHARD_COMMIT_STEP
 * chunks under shard_lock, so the committed part is one mapping however
 * many threads claim chunks at once (committed a chunk at a time by the
 * threads that claimed them, it split where two commits crossed: 100
 * threads left it in two mappings).  Records
 * are claimed with one atomic add on control.stack_shard_count: a thread's
 * first count in each 2048 entry numbers, the only shared write a shard
 * costs. */
static char *shard_pool;                   /* capacity chunks, PROT_NONE until committed */
static struct libtag_shard_chunk *shard_recs;
static uint32_t shard_committed;           /* chunks [0, shard_committed) are read-write */
static int shard_lock;
#define SHARD_CHUNK_BYTES ((size_t)TAG_SHARD_ENTRIES * sizeof(struct libtag_stack_shard))
#define SHARD_CHUNKS_MAX 65536u             /* 8 GiB of address space */
#define SHARD_COMMIT_STEP 16u               /* 2 MiB of address space a step */

/* Reserve the pool: SHARD_CHUNKS_MAX chunks, fewer under an address-space
 * limit (a 16th of it) or when the kernel refuses; none at all leaves every
 * count to the shared entries (exact, but written by every thread). */
static void shard_pool_init(void)
{
    uint64_t chunks = SHARD_CHUNKS_MAX;
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
        while (chunks > 16 && chunks * SHARD_CHUNK_BYTES > as.rlim_cur / 16)
            chunks >>= 1;
    for (; chunks >= 16; chunks >>= 1) {
        void *p = mmap(NULL, chunks * SHARD_CHUNK_BYTES, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            continue;
        madvise(p, chunks * SHARD_CHUNK_BYTES, MADV_DONTDUMP);
        shard_recs = _tag_map(chunks * sizeof *shard_recs, 1);
        if (shard_recs == NULL) {
            munmap(p, chunks * SHARD_CHUNK_BYTES);
            return;
        }
        prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)p, chunks * SHARD_CHUNK_BYTES,
              (unsigned long)"libtag");
        shard_pool = p;
        _tag_ctl.stack_shards = (uint64_t)(uintptr_t)shard_recs;
        _tag_ctl.stack_shard_capacity = (uint32_t)chunks;
        return;
    }
}

/* Chunk k read-write: the committed part grows to the step past it.  0
 * when it cannot: no memory, or the lock stays held (perhaps by the code
 * this signal handler interrupted: a bounded wait, never a deadlock).
 * Async-signal-safe. */
static int shard_commit(uint32_t k)
{
    if (k < __atomic_load_n(&shard_committed, __ATOMIC_ACQUIRE))
        return 1;
    for (unsigned spins = 0; __atomic_exchange_n(&shard_lock, 1, __ATOMIC_ACQUIRE);) {
        if (++spins > (1u << 20))
            return 0;
        tag_arch_pause();
    }
    uint32_t have = shard_committed;
    int ok = 1;
    if (k >= have) {
        uint32_t want = (k / SHARD_COMMIT_STEP + 1) * SHARD_COMMIT_STEP;
        if (want > _tag_ctl.stack_shard_capacity)
            want = _tag_ctl.stack_shard_capacity;
        char *lo = shard_pool + (size_t)have * SHARD_CHUNK_BYTES;
        size_t len = (size_t)(want - have) * SHARD_CHUNK_BYTES;
        ok = mprotect(lo, len, PROT_READ | PROT_WRITE) == 0;
        if (ok) {
            madvise(lo, len, MADV_DODUMP);
            __atomic_store_n(&shard_committed, want, __ATOMIC_RELEASE);
        }
    }
    __atomic_store_n(&shard_lock, 0, __ATOMIC_RELEASE);
    return ok;
}

/* A new chunk of t's shard for entries [i << TAG_SHARD_SHIFT, ...), zeroed;
 * NULL when the pool is used up or cannot be committed. */
static struct libtag_stack_shard *shard_chunk_new(struct tag_thread_state *t, uint32_t i)
{
    uint32_t cap = _tag_ctl.stack_shard_capacity;
    if (__atomic_load_n(&_tag_ctl.stack_shard_count, __ATOMIC_RELAXED) >= cap)
        return NULL;
    uint32_t k = __atomic_fetch_add(&_tag_ctl.stack_shard_count, 1, __ATOMIC_RELAXED);
    if (k >= cap)
        return NULL;  /* (readers take min(count, capacity)) */
    if (!shard_commit(k))
        return NULL;  /* its record stays all zero: a reader skips it */
    char *c = shard_pool + (size_t)k * SHARD_CHUNK_BYTES;
    shard_recs[k].first = i << TAG_SHARD_SHIFT;
    shard_recs[k].tid = t->tid;
    /* last: a record with an address is complete */
    __atomic_store_n(&shard_recs[k].entries, (uint64_t)(uintptr_t)c, __ATOMIC_RELEASE);
    return (struct libtag_stack_shard *)c;
}

/* No shard for this count: into the shared entry, and the scratch entry
 * back, which never flushes nor peaks. */
static struct libtag_stack_shard *shard_none(struct tag_thread_state *t, uint32_t stack,
                                             uint64_t size, int is_free)
{
    _tag_stats_shared(stack, size, is_free);
    struct libtag_stack_shard *s = &t->shard_scratch;
    s->hi = s->top = (uint64_t)INT64_MAX;
    s->lo = (uint64_t)INT64_MIN;
    s->live_bytes = 0;
    return s;
}

TAG_COLD struct libtag_stack_shard *_tag_shard_slow(struct tag_thread_state *t, uint32_t stack,
                                                    uint64_t size, int is_free)
{
    uint32_t e = __atomic_load_n(&_tag_stats_slots[stack], __ATOMIC_RELAXED);
    if (e == 0 && (e = _tag_stats_new(stack)) == 0)
        return shard_none(t, stack, size, is_free);
    uint32_t i = e >> TAG_SHARD_SHIFT;
    if (t->shard_dir[i] == 0) {
        struct libtag_stack_shard *c = shard_pool ? shard_chunk_new(t, i) : NULL;
        if (c == NULL)
            return shard_none(t, stack, size, is_free);
        /* (a signal handler of this thread may have made one too, in
         * between: both stay listed, and a reader sums both) */
        t->shard_dir[i] = (uintptr_t)(c - ((size_t)i << TAG_SHARD_SHIFT));
    }
    return (struct libtag_stack_shard *)(t->shard_dir[i] + (uintptr_t)e * sizeof(struct libtag_stack_shard));
}

/* The shared write of a shard: what its live bytes moved since the last
 * one, added to the stack's estimate (flushed).  The new reference is
 * stored first, so a signal handler of this thread that flushes the same
 * entry in between adds only its own part. */
TAG_COLD void _tag_shard_flush(struct libtag_stack_shard *s, uint32_t stack)
{
    uint32_t e = __atomic_load_n(&_tag_stats_slots[stack], __ATOMIC_RELAXED);
    int64_t live = (int64_t)__atomic_load_n(&s->live_bytes, __ATOMIC_RELAXED);
    /* the reference of the last flush: hi - SLACK (all zero: none yet) */
    int64_t ref = s->hi || s->lo ? (int64_t)s->hi - TAG_SHARD_SLACK : 0;
    s->hi = (uint64_t)(live + TAG_SHARD_SLACK);
    s->lo = (uint64_t)(live - TAG_SHARD_SLACK);
    uint64_t g = __atomic_add_fetch(&_tag_stats[e].flushed, (uint64_t)(live - ref),
                                    __ATOMIC_RELAXED);
    s->base = g - (uint64_t)live;
    if ((int64_t)g > (int64_t)s->peak_bytes)
        s->peak_bytes = g;
    int64_t top = (int64_t)(s->peak_bytes - s->base);
    s->top = (uint64_t)(top < (int64_t)s->hi ? top : (int64_t)s->hi);
}

TAG_COLD void _tag_stats_shared(uint32_t stack, uint64_t size, int is_free)
{
    uint32_t e = __atomic_load_n(&_tag_stats_slots[stack], __ATOMIC_RELAXED);
    if (e == 0 && (is_free || (e = _tag_stats_new(stack)) == 0))
        return;  /* (a free of a stack that never allocated: none) */
    struct libtag_stack_stats *g = &_tag_stats[e];
    uint64_t d = is_free ? -size : size;
    if (!is_free)
        __atomic_fetch_add(&g->allocs, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g->live_bytes, d, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g->flushed, d, __ATOMIC_RELAXED);
}

/* Address space for bytes, not in cores until committed (gcore writes an
 * anonymous mapping whole: see heap.c), no memory until touched. */
static void *reserve(size_t bytes)
{
    size_t len = (bytes + TAG_PAGE_SIZE - 1) & ~(size_t)(TAG_PAGE_SIZE - 1);
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        _tag_fatal("libtag: cannot reserve %lu bytes for the stack table", (unsigned long)bytes);
    madvise(p, len, MADV_DONTDUMP);
    return p;
}

/* Make [lo, hi) of a reserve() usable (whole pages); 0 on failure. */
static int commit(void *base, size_t lo, size_t hi)
{
    uintptr_t a = ((uintptr_t)base + lo) & ~(uintptr_t)(TAG_PAGE_SIZE - 1);
    uintptr_t b = ((uintptr_t)base + hi + TAG_PAGE_SIZE - 1) & ~(uintptr_t)(TAG_PAGE_SIZE - 1);
    if (mprotect((void *)a, b - a, PROT_READ | PROT_WRITE) != 0)
        return 0;
    madvise((void *)a, b - a, MADV_DODUMP);
    return 1;
}

/* Called with table_lock held (or at init): nodes [0, n) and their counters
 * usable.  Async-signal-safe (system calls only). */
static int commit_nodes(uint32_t n)
{
    if (n <= committed)
        return 1;
    uint64_t want = ((uint64_t)n + COMMIT_NODES - 1) / COMMIT_NODES * COMMIT_NODES;
    if (want > capacity)
        want = capacity;
    if (!commit(nodes, (size_t)committed * sizeof *nodes, (size_t)want * sizeof *nodes))
        return 0;
    /* (entry numbers are given out no faster than nodes, from
     * TAG_SHARD_ENTRIES on: the shared entries are committed with the
     * nodes, that many ahead) */
    if (_tag_stats && (!commit(_tag_stats,
                               committed ? ((size_t)committed + TAG_SHARD_ENTRIES) * sizeof *_tag_stats : 0,
                               ((size_t)want + TAG_SHARD_ENTRIES) * sizeof *_tag_stats) ||
                       !commit(_tag_stats_slots, (size_t)committed * sizeof *_tag_stats_slots,
                               (size_t)want * sizeof *_tag_stats_slots)))
        return 0;
    committed = (uint32_t)want;
    return 1;
}

/* A new, empty index of nslots slots (libtag's own memory); NULL if none. */
static struct stack_index *index_new(uint32_t nslots)
{
    struct stack_index *ix = _tag_map(sizeof *ix + (size_t)nslots * sizeof ix->slots[0], 1);
    if (ix)
        ix->mask = nslots - 1;
    return ix;
}

void _tag_stack_table_init(uint32_t cap)
{
    capacity = cap;
    nodes = reserve((size_t)cap * sizeof *nodes);
    if (_tag_opt.stack_stats) {
        _tag_stats = reserve(((size_t)cap + TAG_SHARD_ENTRIES) * sizeof *_tag_stats);
        _tag_stats_slots = reserve((size_t)cap * sizeof *_tag_stats_slots);
        _tag_ctl.stack_stats = (uint64_t)(uintptr_t)_tag_stats;
        _tag_ctl.stack_stats_slots = (uint64_t)(uintptr_t)_tag_stats_slots;
        _tag_ctl.stack_stats_used = TAG_SHARD_ENTRIES;  /* the first number given */
        /* what a directory reaches */
        stats_limit = cap + TAG_SHARD_ENTRIES < (TAG_SHARD_DIR << TAG_SHARD_SHIFT)
                          ? cap + TAG_SHARD_ENTRIES
                          : TAG_SHARD_DIR << TAG_SHARD_SHIFT;
        shard_pool_init();
    }
    uint32_t first = FIRST_SLOTS;
    while (first / 2 > cap && first > 1024)
        first >>= 1;
    struct stack_index *ix = index_new(first);
    if (ix == NULL || !commit_nodes(1))
        _tag_fatal("libtag: cannot map the stack table");
    __atomic_store_n(&index_cur, ix, __ATOMIC_RELEASE);
    /* address space only: a page is resident once a stack on it allocates.
     * Node 0 is the root: the empty stack.  Written, though it is all
     * zeros (and so is its counter): a kernel core leaves out a private
     * mapping never written to, and a reader must find the root even in a
     * process that never allocated. */
    if (_tag_stats) {
        __atomic_store_n(&_tag_stats[0].allocs, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&_tag_stats_slots[0], 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&nodes[0].parent, 0, __ATOMIC_RELAXED);
    _tag_ctl.stack_nodes = (uint64_t)(uintptr_t)nodes;
    _tag_ctl.stack_capacity = cap;
    _tag_ctl.stack_count = 1;
    ordinary = cap - (cap / 64 < 16 ? 16 : cap / 64);
}

static inline uint64_t key_hash(uint32_t parent, uint32_t kind, uint64_t pc)
{
    uint64_t h = (pc ^ ((uint64_t)kind << 62)) * TAG_MIX1;
    h ^= (uint64_t)parent * TAG_MIX2;
    return h ^ (h >> 29);
}

/* Lock-free probe of index ix.  Returns the id, or 0 with *slot_out = the
 * empty slot. */
static uint32_t probe_in(const struct stack_index *ix, uint32_t parent, uint32_t kind,
                         uint64_t pc, uint64_t h, uint32_t *slot_out)
{
    for (uint32_t i = (uint32_t)h & ix->mask;; i = (i + 1) & ix->mask) {
        uint32_t id = __atomic_load_n(&ix->slots[i], __ATOMIC_ACQUIRE);
        if (id == 0) {
            *slot_out = i;
            return 0;
        }
        const struct libtag_stack_node *n = &nodes[id];
        if (n->pc == pc && n->parent == parent && n->kind == kind)
            return id;
    }
}

static uint32_t probe(uint32_t parent, uint32_t kind, uint64_t pc, uint64_t h,
                      uint32_t *slot_out)
{
    return probe_in(__atomic_load_n(&index_cur, __ATOMIC_ACQUIRE), parent, kind, pc, h,
                    slot_out);
}

/* Called with table_lock held: the index twice as large, every node of the
 * old one re-hashed into it, then published.  0: no memory for it (the old
 * index stays, and inserts go on while it has room). */
static int grow_index(struct stack_index *old)
{
    struct stack_index *ix = index_new((old->mask + 1) * 2);
    if (ix == NULL)
        return 0;
    uint32_t count = _tag_ctl.stack_count;
    for (uint32_t id = 1; id < count; id++) {
        const struct libtag_stack_node *n = &nodes[id];
        uint64_t h = key_hash(n->parent, n->kind, n->pc);
        uint32_t i = (uint32_t)h & ix->mask;
        while (ix->slots[i])
            i = (i + 1) & ix->mask;
        ix->slots[i] = id;
    }
    ix->used = count - 1;
    __atomic_store_n(&index_cur, ix, __ATOMIC_RELEASE);
    /* The old index's memory goes back to the kernel; its address range
     * stays, for a lock-free probe that took it before the publication:
     * that probe now reads zeros - an empty slot, "not there" - and the
     * insert that follows takes the lock and probes the new index. */
    madvise(old, sizeof *old + (size_t)(old->mask + 1) * sizeof old->slots[0], MADV_DONTNEED);
    return 1;
}

static void lock(void)
{
    while (__atomic_exchange_n(&table_lock, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&table_lock, __ATOMIC_RELAXED))
            tag_arch_pause();
}

static void unlock(void)
{
    __atomic_store_n(&table_lock, 0, __ATOMIC_RELEASE);
}

/* An insert that found no room: counted (control.stack_full counts these
 * failed inserts; the capture then ends in a TAG_FRAME_LOST marker). */
static uint32_t table_full(void)
{
    __atomic_fetch_add(&_tag_ctl.stack_full, 1, __ATOMIC_RELAXED);
    return 0;
}

/* Called with table_lock held: re-probe, another thread may have won. */
static uint32_t insert_held(uint32_t parent, uint32_t kind, uint64_t pc, uint64_t h)
{
    uint32_t slot;
    uint32_t id = probe(parent, kind, pc, h, &slot);
    if (id != 0)
        return id;
    uint32_t count = _tag_ctl.stack_count;
    struct stack_index *ix = __atomic_load_n(&index_cur, __ATOMIC_RELAXED);
    if (count >= (kind == TAG_FRAME_LOST ? capacity : ordinary) || !commit_nodes(count + 1))
        return table_full();
    if (2 * (ix->used + 1) > ix->mask + 1) {
        if (grow_index(ix)) {
            ix = __atomic_load_n(&index_cur, __ATOMIC_RELAXED);
            uint32_t again = probe_in(ix, parent, kind, pc, h, &slot);
            TAG_ASSERT(again == 0);  /* not in the old index, so not in its copy */
            (void)again;
        } else if (4 * (ix->used + 1) > 3 * (ix->mask + 1)) {
            return table_full();  /* no memory for a larger one: this one up to 3/4 */
        }
    }
    nodes[count].pc = pc;
    nodes[count].parent = parent;
    nodes[count].kind = kind;
    __atomic_store_n(&_tag_ctl.stack_count, count + 1, __ATOMIC_RELEASE);
    ix->used++;
    __atomic_store_n(&ix->slots[slot], count, __ATOMIC_RELEASE);
    return count;
}

/* Called with table_lock held: the marker for "parent, then frames the
 * full table could not take" (parent is no marker itself). */
static uint32_t lost_held(uint32_t parent)
{
    uint32_t root = __atomic_load_n(&lost_root, __ATOMIC_RELAXED);
    if (!root) {
        root = insert_held(0, TAG_FRAME_LOST, 0, key_hash(0, TAG_FRAME_LOST, 0));
        __atomic_store_n(&lost_root, root, __ATOMIC_RELAXED);
    }
    if (parent == 0)
        return root;
    uint32_t id = insert_held(parent, TAG_FRAME_LOST, 0, key_hash(parent, TAG_FRAME_LOST, 0));
    return id ? id : root;  /* the reserve is used up too */
}

static uint32_t insert(uint32_t parent, uint32_t kind, uint64_t pc, uint64_t h)
{
    if (parent != 0 && nodes[parent].kind == TAG_FRAME_LOST)
        return parent;  /* cut further out: nothing to insert */
    uint32_t id = 0;
    int full = __atomic_load_n(&_tag_ctl.stack_count, __ATOMIC_RELAXED) >= ordinary;
    if (full) {
        /* the parent's marker is found without the lock once made */
        table_full();
        uint32_t slot;
        id = probe(parent, TAG_FRAME_LOST, 0, key_hash(parent, TAG_FRAME_LOST, 0), &slot);
        if (id != 0)
            return id;
    }
    lock();
    if (!full)
        id = insert_held(parent, kind, pc, h);
    if (id == 0)
        id = lost_held(parent);
    unlock();
    return id;
}

uint32_t _tag_intern_slow(struct tag_thread_state *t, uint32_t parent, uint32_t kind,
                          uint64_t pc, unsigned c)
{
    uint64_t h = key_hash(parent, kind, pc);
    uint32_t pk = parent | kind << 30;
    uint32_t slot;
    uint32_t id = probe(parent, kind, pc, h, &slot);
    if (id == 0)
        id = insert(parent, kind, pc, h);
    if (id != 0) {
        t->cache[c].pc = pc;
        t->cache[c].parent_kind = pk;
        t->cache[c].id = id;
    }
    return id;
}

uint32_t _tag_intern_signal(uint32_t parent, uint32_t kind, uint64_t pc)
{
    uint64_t h = key_hash(parent, kind, pc);
    uint32_t slot;
    uint32_t id = probe(parent, kind, pc, h, &slot);
    if (id != 0)
        return id;
    /* The handler may have interrupted this thread inside insert(): try
     * the lock once, never wait for it. */
    if (parent != 0 && nodes[parent].kind == TAG_FRAME_LOST)
        return parent;
    if (__atomic_exchange_n(&table_lock, 1, __ATOMIC_ACQUIRE))
        return 0;
    id = insert_held(parent, kind, pc, h);
    if (id == 0)
        id = lost_held(parent);
    unlock();
    return id;
}

/* The program's own fork(): no insert may be half-done across it, and the
 * child, whose other threads are gone, must find the lock free. */
void _tag_stack_table_atfork_prepare(void) { lock(); }
void _tag_stack_table_atfork_parent(void) { unlock(); }
void _tag_stack_table_atfork_child(void)
{
    unlock();
    /* a thread of the parent may have held the shards' commit lock: its
     * mprotect done or not, shard_committed says what is (a redone one
     * changes nothing) */
    __atomic_store_n(&shard_lock, 0, __ATOMIC_RELAXED);
}
