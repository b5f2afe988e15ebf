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
 * direct-mapped cache (tag_tls.cache), so the common capture touches no
 * shared cache line at all.
 */
#include <sys/mman.h>

#include "libtag_internal.h"

static struct libtag_stack_node *nodes;   /* [capacity] */
static uint32_t *slots;                   /* [slot_mask + 1], 0 = empty */
static uint32_t capacity;
static uint32_t slot_mask;
static int table_lock;
struct libtag_stack_stats *_tag_stats;    /* [capacity] */
int _tag_stats_shared;                     /* libtag_internal.h: a second thread registered */

static void *reserve(size_t bytes)
{
    void *p = _tag_map(bytes, 1);
    if (p == NULL)
        _tag_fatal("libtag: cannot reserve %lu bytes for the stack table",
                   (unsigned long)bytes);
    return p;
}

void _tag_stack_table_init(uint32_t cap)
{
    capacity = cap;
    uint32_t nslots = 1;
    while (nslots < cap * 2u)
        nslots <<= 1;
    slot_mask = nslots - 1;
    nodes = reserve((size_t)cap * sizeof *nodes);
    slots = reserve((size_t)nslots * sizeof *slots);
    /* address space only: a page is resident once a stack on it allocates */
    if (_tag_opt.stack_stats) {
        _tag_stats = reserve((size_t)cap * sizeof *_tag_stats);
        _tag_ctl.stack_stats = (uint64_t)(uintptr_t)_tag_stats;
        __atomic_store_n(&_tag_stats[0].allocs, 0, __ATOMIC_RELAXED);  /* dumped: see the root */
    }
    /* node 0 is the root: the empty stack.  Written, though it is all
     * zeros: a kernel core leaves out a private mapping never written to,
     * and a reader must find the root even in a process that never
     * allocated. */
    __atomic_store_n(&nodes[0].parent, 0, __ATOMIC_RELAXED);
    _tag_ctl.stack_nodes = (uint64_t)(uintptr_t)nodes;
    _tag_ctl.stack_capacity = cap;
    _tag_ctl.stack_count = 1;
}

static inline uint64_t key_hash(uint32_t parent, uint32_t kind, uint64_t pc)
{
    uint64_t h = (pc ^ ((uint64_t)kind << 62)) * TAG_MIX1;
    h ^= (uint64_t)parent * TAG_MIX2;
    return h ^ (h >> 29);
}

/* Lock-free probe.  Returns the id, or 0 with *slot_out = the empty slot. */
static uint32_t probe(uint32_t parent, uint32_t kind, uint64_t pc, uint64_t h,
                      uint32_t *slot_out)
{
    for (uint32_t i = (uint32_t)h & slot_mask;; i = (i + 1) & slot_mask) {
        uint32_t id = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE);
        if (id == 0) {
            *slot_out = i;
            return 0;
        }
        const struct libtag_stack_node *n = &nodes[id];
        if (n->pc == pc && n->parent == parent && n->kind == kind)
            return id;
    }
}

static void lock(void)
{
    while (__atomic_exchange_n(&table_lock, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&table_lock, __ATOMIC_RELAXED))
            __builtin_ia32_pause();
}

static void unlock(void)
{
    __atomic_store_n(&table_lock, 0, __ATOMIC_RELEASE);
}

/* Called with table_lock held: re-probe, another thread may have won. */
static uint32_t insert_held(uint32_t parent, uint32_t kind, uint64_t pc, uint64_t h)
{
    uint32_t slot;
    uint32_t id = probe(parent, kind, pc, h, &slot);
    if (id != 0)
        return id;
    uint32_t count = _tag_ctl.stack_count;
    if (count >= capacity) {
        __atomic_fetch_add(&_tag_ctl.stack_full, 1, __ATOMIC_RELAXED);
        return 0;
    }
    nodes[count].pc = pc;
    nodes[count].parent = parent;
    nodes[count].kind = kind;
    __atomic_store_n(&_tag_ctl.stack_count, count + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&slots[slot], count, __ATOMIC_RELEASE);
    return count;
}

static uint32_t insert(uint32_t parent, uint32_t kind, uint64_t pc, uint64_t h)
{
    lock();
    uint32_t id = insert_held(parent, kind, pc, h);
    unlock();
    return id;
}

uint32_t _tag_intern_slow(struct tag_tls *t, uint32_t parent, uint32_t kind,
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
    if (__atomic_exchange_n(&table_lock, 1, __ATOMIC_ACQUIRE))
        return 0;
    id = insert_held(parent, kind, pc, h);
    unlock();
    return id;
}

/* The program's own fork(): no insert may be half-done across it, and the
 * child, whose other threads are gone, must find the lock free. */
void _tag_stack_table_atfork_prepare(void) { lock(); }
void _tag_stack_table_atfork_parent(void) { unlock(); }
void _tag_stack_table_atfork_child(void) { unlock(); }
