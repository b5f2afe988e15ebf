/* guard.c - guarded sampling: one allocation in LIBTAG_GUARD_RATE gets
 * pages of its own, so the instruction that reads or writes past it, below
 * it or after it was freed faults, and libtag names that instruction.
 *
 * The pool (tag_abi.h, "guard pool") is one reserved range of PROT_NONE
 * pages, slots and guard pages in turn; a slot becomes accessible when a
 * block is placed in it and inaccessible again when the block is freed.
 * The range is reserved at the first guarded allocation, sized for the cap
 * (LIBTAG_GUARD_SLOTS, else TAG_GUARD_SAMPLED_CAP at a sampling rate, at
 * most the window, and TAG_GUARD_ALL_SLOTS at rate 1): reserving costs
 * address space only, and slots are committed one by one as the pool grows
 * to its cap.  Never-used slots go first, then the slot that left the
 * window longest ago, so a freed block stays inaccessible for as long as
 * the pool allows - but with pressure (below) a freed slot that left the
 * window is open and catches nothing, and goes first.  When every slot is
 * live (or retired) the allocation is an ordinary one.
 *
 * Shares.  At a sampling rate with no cap set, never-used slots go first
 * only up to grow_at (TAG_GUARD_SAMPLED_SLOTS); past it a sampled block
 * takes a never-used slot only when every slot used so far holds a live
 * block, and first-of-site blocks (LIBTAG_GUARD_SITES) hold at most half of
 * grow_at at once.  Without both, a program's start-up - thousands of
 * sites' first blocks, most of them never freed - filled the pool, and the
 * 1-in-N sample found no slot for the rest of the run.
 *
 * The window.  Every guarded slot is its own mapping between two guard
 * mappings, and a process has at most vm.max_map_count of them (65530 by
 * default): a pool of long-lived guarded blocks would take the program's
 * own mmap and dlopen down.  So only the last `window` placements keep
 * their guards (window = max_map_count / 32, read at start: at most
 * 4 mappings a slot, and 2 for each of window / 2 unmerged slots: five
 * thirty-seconds of the limit).  When a placement leaves the
 * window its slot is "out": with a pool larger than the window, an out
 * slot's guard pages open wherever its neighbour is out too (so a run of
 * out slots is one mapping), a freed out slot gives its pages back
 * (MADV_DONTNEED) and stays readable, and a live one keeps its block
 * where it is.  But up to window / 2 slots at once leave the window as
 * they are, unmerged (kept[] below): a lone live block keeps its guards
 * and is shut when freed, a freed one stays shut, and a placement opens
 * it with one mprotect - where merging and unmerging a slot cost four or
 * five.  Long-lived blocks thus cost no mappings once out, and
 * sampling goes on in fresh slots; the price is that a block freed after
 * it left the window is no longer caught at the instruction (its double
 * free still is, by the slot's state).  A pool no larger than the window
 * (every sampling rate's default) never opens a guard.
 *
 * Hot path: the allocation hook decrements a per-thread countdown and the
 * free hook compares the pointer with the pool's range (alloc/guard.h);
 * everything here is cold.
 *
 * Slot states move under these rules (struct libtag_guard_slot):
 *   placing:  pool_lock picks an EMPTY slot, or a FREED one by CAS to BUSY
 *             and then a check of retired (a fault handler sets retired,
 *             then reads state: with both sequentially consistent, one of
 *             the two sees the other);  opened, written, then LIVE.
 *   freeing:  CAS LIVE -> BUSY (a second free of the block loses: double
 *             free); checked, patterned; FREED is stored before the slot
 *             is made inaccessible, so a fault on it always sees FREED.
 *   a fault:  never takes pool_lock (it may have interrupted its holder);
 *             claims the report with an exchange of reported, retires the
 *             slot, and opens the faulting page.
 *
 * A fault is classified from the address alone: inside a freed slot it is
 * a use-after-free; in a guard page, an overflow of the block below it (it
 * ends at the slot's end) or an underflow of the block above it, whichever
 * is nearer.  Read or write comes from the page-fault error code the
 * kernel saves in the signal context (REG_ERR bit 1: a write).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <ucontext.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "base/options.h"
#include "base/prim.h"
#include "stacks/stack_table.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"
#include "alloc/anomaly.h"
#include "alloc/guard.h"
#include "alloc/tag.h"

static __thread uint64_t rng __attribute__((tls_model("initial-exec")));

#define PAGE TAG_PAGE_SIZE
#define STRIDE (TAG_GUARD_SLOT_SIZE + TAG_PAGE_SIZE)
#define NO_SLOT UINT32_MAX

static int pool_lock;
static int pool_failed;                 /* the reservation failed: no pool */
static struct libtag_guard_slot *slots; /* [capacity] */
static char *pool;
static uint32_t capacity;
static uint32_t fresh;                  /* slots below this were used */
static uint32_t grow_at;                /* fresh slots taken before reuse */
static uint32_t site_share, site_live;  /* first-of-site guards: cap, live */
static uint8_t *site_slot;              /* [capacity]: 1 = a first-of-site block */
static uint64_t sampled_allocs, site_allocs;  /* placements of each kind */
/* Sampled allocations that found every slot of the cap taken (live, or
 * retired): unguarded.  The first one is said in the log, once. */
static uint64_t no_slot_allocs;
static int no_slot_said;
/* Queues of freed out slots (linked by slot.next: index + 1), each first
 * in, first out: the shut ones (kept[] below), which a placement takes
 * first - one mprotect opens one, where an open one's guards take one or
 * two to shut, and each shut slot taken makes room for another to stay
 * shut - and the open ones (without pressure, every freed out slot). */
struct queue {
    uint32_t head, tail, len;
};
static struct queue shut_q, open_q;
/* A freed out slot keeps its pages (no madvise) while fewer than this many
 * wait in the queue: the next placements reuse it, and giving its pages
 * back would cost a system call and their faults again.  A longer queue
 * gives them back (the pages of at most this many slots stay resident). */
#define KEEP_QUEUED 64u
/* kept[i] of an out slot.  Merged, its guard pages open towards merged
 * out neighbours: 0 (live, or freed with its pages given back) or
 * KEPT_OPEN (freed, readable, pages kept).  Unmerged, as the window left
 * it - its guards shut: KEPT_LONE (live, its block read-write between
 * them) or KEPT_SHUT (freed, PROT_NONE, pages kept).
 *
 * A slot leaves the window unmerged while fewer than `lone_cap` (window
 * / 2) are: no system call then, where merging took one or two (its
 * guards) and three for a freed slot (itself too), and a placement into
 * it later one (opening it) where a merged slot took one or two (shutting
 * its guards).  A lone block freed is shut (one mprotect): caught after
 * its free as in the window.  When the unmerged are at their bound, the
 * oldest lone one is merged to make room (what leaving cost before, paid
 * only by blocks that live that long).  An unmerged slot among merged
 * ones splits their mapping, two mappings more at most: the bound keeps
 * the pool within five mappings a window slot. */
enum { KEPT_OPEN = 1, KEPT_SHUT = 2, KEPT_LONE = 3, KEPT_LONE_SEEN = 4 /* lone_compact */ };
static uint8_t *kept;                   /* [capacity]: as above */
static uint32_t unmerged, lone_cap;     /* slots KEPT_SHUT or KEPT_LONE; bound */
static uint32_t *lone;                  /* [lone_cap]: ring of slots that left
                                           lone, oldest first (stale entries
                                           are skipped) */
static uint32_t lone_head, lone_count;

/* The window (see above); all under pool_lock. */
enum { SLOT_FRESH = 0, SLOT_IN = 1, SLOT_OUT = 2 };
static uint8_t *where;                  /* [capacity]: SLOT_* */
/* [capacity]: a freed slot in the window whose pages were given back
 * (BARE_GIVEN: they read as zeros) and, in a fault, being refilled
 * (BARE_FILLING); see slot_refill.  Set under pool_lock, cleared by a
 * placement under it or by the fault that refills the slot. */
enum { BARE_NO = 0, BARE_GIVEN = 1, BARE_FILLING = 2 };
static uint8_t *bare;
static uint32_t *win;                   /* [window]: ring of placed slots */
static uint32_t window, win_head, win_count;
static int pressure;                    /* capacity > window: out slots open */

/* Normal context only.  Held for a few loads and stores, but a holder
 * preempted (two cores shared by more threads) would keep a spinner
 * spinning through its whole time slice: yield after a short spin. */
static void lock(void)
{
    for (unsigned spins = 0; __atomic_exchange_n(&pool_lock, 1, __ATOMIC_ACQUIRE);)
        while (__atomic_load_n(&pool_lock, __ATOMIC_RELAXED))
            if (++spins % 64 == 0)
                sched_yield();
            else
                tag_arch_pause();
}

static void unlock(void)
{
    __atomic_store_n(&pool_lock, 0, __ATOMIC_RELEASE);
}

void _tag_guard_atfork_prepare(void) { lock(); }
void _tag_guard_atfork_parent(void) { unlock(); }
void _tag_guard_atfork_child(void) { unlock(); }

static char *slot_base(uint32_t i)
{
    return pool + PAGE + (size_t)i * STRIDE;
}

/* ------------------------------------------------------------ sampling -- */

/* The countdown to this thread's next guarded allocation: uniform in
 * [1, 2N - 1], so one allocation in N on average, at no fixed stride a
 * program's allocation pattern could keep missing.  xorshift64*, seeded
 * per thread from the process secret and the thread's TLS address. */
static int32_t next_countdown(void)
{
    uint32_t rate = _tag_opt.guard_rate;
    if (rate == 0)
        return INT32_MAX;
    if (rate == 1)
        return 1;
    uint64_t x = rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng = x;
    return (int32_t)(1 + (x * TAG_MIX1 >> 33) % (2ull * rate - 1));
}

/* ---------------------------------------------------------------- pool -- */

/* At start, single-threaded: the window, from vm.max_map_count (the
 * kernel's default when it cannot be read). */
void _tag_guard_init(void)
{
    if (_tag_opt.guard_rate == 0)
        return;
    uint32_t max_map_count = 65530;
    int fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[24];
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        uint64_t v = 0;
        for (ssize_t k = 0; k < n && buf[k] >= '0' && buf[k] <= '9'; k++)
            v = v * 10 + (uint64_t)(buf[k] - '0');
        if (v >= 256 && v <= UINT32_MAX)
            max_map_count = (uint32_t)v;
    }
    uint32_t w = max_map_count / 32;
    /* a sampling rate's default cap stays within the window: its pool
     * never opens a guard */
    if (!_tag_opt.guard_slots && _tag_opt.guard_rate != 1 && _tag_ctl.guard_capacity > w)
        _tag_ctl.guard_capacity = w > TAG_GUARD_SAMPLED_SLOTS ? w : TAG_GUARD_SAMPLED_SLOTS;
    window = w < _tag_ctl.guard_capacity ? w : _tag_ctl.guard_capacity;
}

uint32_t _tag_guard_window(void)
{
    return window;
}

/* The process's mappings in the pool's range, counted from
 * /proc/self/maps (each line starts "lo-hi "): for the LIBTAG_STATS line.
 * No malloc. */
uint32_t _tag_guard_mappings(void)
{
    uint64_t lo = _tag_ctl.guard_pool, hi = lo + _tag_ctl.guard_pool_bytes;
    if (!_tag_ctl.guard_pool_bytes)
        return 0;
    char buf[4096];
    uint32_t count = 0;
    uint64_t start = 0;
    int in_addr = 1;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t k = 0; k < n; k++) {
            char c = buf[k];
            if (c == '\n') {
                in_addr = 1;
                start = 0;
                continue;
            }
            if (!in_addr)
                continue;
            if (c == '-') {
                in_addr = 0;
                count += start >= lo && start < hi;
                continue;
            }
            start = start * 16 + (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
        }
    close(fd);
    return count;
}

/* Reserve the range and the slot records; called with pool_lock held. */
static int pool_reserve(void)
{
    if (pool)
        return 1;
    if (pool_failed)
        return 0;
    uint32_t cap = _tag_ctl.guard_capacity;  /* set from the options at start */
    uint32_t w = window;                      /* and _tag_guard_init */
    size_t bytes = (size_t)cap * STRIDE + PAGE;
    char *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    while (p == MAP_FAILED && cap > TAG_GUARD_SAMPLED_SLOTS) {
        /* RLIMIT_AS: a smaller pool rather than none */
        cap /= 2;
        bytes = (size_t)cap * STRIDE + PAGE;
        p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    }
    if (w > cap)
        w = window = cap;
    /* the records, then where[], site_slot[], kept[], bare[], win[] and
     * lone[] in the same mapping */
    size_t recs = ((size_t)cap * sizeof(struct libtag_guard_slot) + 63) & ~(size_t)63;
    size_t wheres = ((size_t)cap + 63) & ~(size_t)63;
    uint32_t lc = w / 2 ? w / 2 : 1;
    struct libtag_guard_slot *s =
        p == MAP_FAILED ? NULL
                        : _tag_map(recs + 4 * wheres + ((size_t)w + lc) * sizeof *win, 1);
    if (!s) {
        if (p != MAP_FAILED)
            munmap(p, bytes);
        pool_failed = 1;
        _tag_log("libtag: no guard pool (%lu bytes of address space): guarded sampling is off",
                 (unsigned long)bytes);
        return 0;
    }
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)p, bytes,
          (unsigned long)"libtag-guard");
    /* Two neighbouring mappings merge only when they share the kernel's
     * record of their anonymous pages (the anon_vma): give the whole range
     * one before it is split, by a page touched and dropped, so runs of
     * out slots merge however their pages were first touched. */
    if (mprotect(p, PAGE, PROT_READ | PROT_WRITE) == 0) {
        *(volatile char *)p = 0;
        madvise(p, PAGE, MADV_DONTNEED);
        mprotect(p, PAGE, PROT_NONE);
    }
    pool = p;
    slots = s;
    capacity = cap;
    _tag_ctl.guard_capacity = cap;
    where = (uint8_t *)s + recs;
    site_slot = where + wheres;
    kept = site_slot + wheres;
    bare = kept + wheres;
    win = (uint32_t *)(void *)(bare + wheres);
    lone = win + w;
    lone_cap = lc;
    pressure = cap > w;
    /* a cap of the user's (LIBTAG_GUARD_SLOTS) or rate 1: every slot fresh
     * first; the sampling default: TAG_GUARD_SAMPLED_SLOTS, then reuse,
     * and more only when every slot is live */
    grow_at = _tag_opt.guard_slots || _tag_opt.guard_rate == 1 || cap < TAG_GUARD_SAMPLED_SLOTS
                  ? cap : TAG_GUARD_SAMPLED_SLOTS;
    site_share = grow_at / 2 ? grow_at / 2 : 1;
    _tag_ctl.guard_slots = (uint64_t)(uintptr_t)s;
    _tag_ctl.guard_pool = (uint64_t)(uintptr_t)p;
    __atomic_store_n(&_tag_ctl.guard_pool_bytes, (uint64_t)bytes, __ATOMIC_RELEASE);
    return 1;
}

/* Called with pool_lock held. */
static void enqueue_held(struct queue *q, uint32_t i)
{
    q->len++;
    slots[i].next = 0;
    if (q->tail)
        slots[q->tail - 1].next = i + 1;
    else
        q->head = i + 1;
    q->tail = i + 1;
}

/* The slot at q's head, taken out of it; q is not empty. */
static uint32_t dequeue_held(struct queue *q)
{
    uint32_t c = q->head - 1;
    q->head = slots[c].next;
    q->len--;
    if (!q->head)
        q->tail = 0;
    slots[c].next = 0;
    return c;
}

/* Freed out slot i (queued, pool_lock held): its pages go back to the
 * kernel, unless the queue is short enough that a placement soon reuses
 * them (KEEP_QUEUED). */
static void give_back_held(uint32_t i)
{
    if (open_q.len <= KEEP_QUEUED) {
        kept[i] = KEPT_OPEN;
        return;
    }
    madvise(slot_base(i), TAG_GUARD_SLOT_SIZE, MADV_DONTNEED);
}

/* Slot j is out and merged (see kept[]). */
static int merged_out(uint32_t j)
{
    return where[j] == SLOT_OUT && kept[j] != KEPT_SHUT && kept[j] != KEPT_LONE;
}

/* The guard pages slot i shares with merged out neighbours: opened (prot
 * read-write) as i is merged, shut (PROT_NONE) as a merged i enters the
 * window.  So a guard page is open exactly when both its slots are out
 * and merged. */
static void out_neighbour_guards(uint32_t i, int prot)
{
    if (i > 0 && merged_out(i - 1))
        mprotect(slot_base(i) - PAGE, PAGE, prot);
    if (i + 1 < capacity && merged_out(i + 1))
        mprotect(slot_base(i) + TAG_GUARD_SLOT_SIZE, PAGE, prot);
}

/* Slot i is merged now, or placed, or gone from the queue: one unmerged
 * fewer. */
static void unmerge_done(uint32_t i)
{
    kept[i] = 0;
    unmerged--;
}

/* The ring of lone slots is full: keep only its entries of slots still
 * lone, each slot's newest, in their order.  Called before the slot about
 * to be added is marked lone (an older entry of its own goes too), so at
 * most unmerged < lone_cap entries stay. */
static void lone_compact(void)
{
    for (uint32_t k = lone_count; k-- > 0;) {  /* newest first: mark */
        uint32_t *e = &lone[(lone_head + k) % lone_cap];
        if (kept[*e] == KEPT_LONE)
            kept[*e] = KEPT_LONE_SEEN;
        else
            *e = NO_SLOT;  /* stale, or an older entry of a slot seen */
    }
    uint32_t n = 0;
    for (uint32_t k = 0; k < lone_count; k++) {  /* oldest first: keep */
        uint32_t j = lone[(lone_head + k) % lone_cap];
        if (j == NO_SLOT)
            continue;
        kept[j] = KEPT_LONE;
        lone[(lone_head + n++) % lone_cap] = j;
    }
    lone_count = n;
}

/* Room for one more unmerged slot: there is, or the oldest lone slot is
 * merged to make it (its guards opened).  0: every unmerged one is shut. */
static int unmerged_room(void)
{
    if (unmerged < lone_cap)
        return 1;
    while (lone_count) {
        uint32_t j = lone[lone_head];
        lone_head = (lone_head + 1) % lone_cap;
        lone_count--;
        if (kept[j] != KEPT_LONE)
            continue;  /* freed or merged since: a stale entry */
        unmerge_done(j);
        out_neighbour_guards(j, PROT_READ | PROT_WRITE);
        return 1;
    }
    return 0;
}

/* Slot i's placement leaves the window (pool_lock held).  A freed slot
 * becomes reusable; with pressure, its guards open towards out
 * neighbours and a freed slot's pages go back, readable. */
static void leave(uint32_t i)
{
    where[i] = SLOT_OUT;
    struct libtag_guard_slot *s = &slots[i];
    /* a free in progress stores FREED under pool_lock: it sees SLOT_OUT */
    int freed = __atomic_load_n(&s->state, __ATOMIC_SEQ_CST) == TAG_GUARD_FREED &&
                !__atomic_load_n(&s->retired, __ATOMIC_SEQ_CST);
    if (!pressure) {
        if (freed)
            enqueue_held(&open_q, i);  /* shut, as without pressure every freed slot is */
        return;
    }
    if (unmerged_room()) {
        /* as it is: guards shut; freed, PROT_NONE with its pages kept */
        if (freed) {
            enqueue_held(&shut_q, i);
        } else {
            if (lone_count == lone_cap)
                lone_compact();
            lone[(lone_head + lone_count++) % lone_cap] = i;
        }
        kept[i] = freed ? KEPT_SHUT : KEPT_LONE;
        unmerged++;
        return;
    }
    if (freed) {
        enqueue_held(&open_q, i);
        give_back_held(i);
        mprotect(slot_base(i), TAG_GUARD_SLOT_SIZE, PROT_READ | PROT_WRITE);
    }
    out_neighbour_guards(i, PROT_READ | PROT_WRITE);
}

static void leave_oldest(void)
{
    uint32_t i = win[win_head];
    win_head = (win_head + 1) % window;
    win_count--;
    leave(i);
}

/* Slot i (BUSY, pool_lock held) is being placed: it enters the window
 * with its guards shut and its pages accessible.  0: out of mappings. */
static int enter(uint32_t i)
{
    int was_out = where[i] == SLOT_OUT, shut = kept[i] == KEPT_SHUT;
    if ((!was_out || !pressure || shut) &&
        mprotect(slot_base(i), TAG_GUARD_SLOT_SIZE, PROT_READ | PROT_WRITE) != 0)
        return 0;
    if (shut)
        unmerge_done(i);
    else if (was_out && pressure)
        out_neighbour_guards(i, PROT_NONE);
    where[i] = SLOT_IN;
    if (win_count == window)
        leave_oldest();
    win[(win_head + win_count++) % window] = i;
    return 1;
}

/* A slot to place a block in, marked BUSY and accessible; NO_SLOT when
 * none is free.  *reused: it held a freed block (whose tag must be
 * cleared); *clean: its pages were given back (they read as zero).
 * site: for a first-of-site block, which may hold at most site_share
 * slots at once; a sampled block takes a fresh slot past grow_at when
 * every slot used so far holds a live block, so neither starves the
 * other (docs/design.md, "Guarded blocks"). */
static uint32_t take_slot(int *reused, int *clean, int site)
{
    lock();
    uint32_t i = NO_SLOT;
    int say_full = 0;
    if (pool_reserve() && (!site || site_live < site_share)) {
        uint32_t limit = grow_at;
        while (i == NO_SLOT) {
            /* with pressure a queued slot is open and catches nothing: it
             * goes before a never-used one, which keeps the pool (and a
             * core's size) near the window plus the live out slots */
            int queued = shut_q.head || open_q.head;
            if (fresh < limit && !(pressure && queued)) {
                i = fresh++;
                __atomic_store_n(&_tag_ctl.guard_used, fresh, __ATOMIC_RELAXED);
                __atomic_store_n(&slots[i].state, TAG_GUARD_BUSY, __ATOMIC_SEQ_CST);
                *reused = 0;
                *clean = 1;
                break;
            }
            while (i == NO_SLOT && (shut_q.head || open_q.head)) {
                uint32_t c = dequeue_held(shut_q.head ? &shut_q : &open_q);
                uint32_t want = TAG_GUARD_FREED;
                if (!__atomic_compare_exchange_n(&slots[c].state, &want, TAG_GUARD_BUSY, 0,
                                                 __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) &&
                    (want != TAG_GUARD_EMPTY ||  /* given back by a failed placement */
                     !__atomic_compare_exchange_n(&slots[c].state, &want, TAG_GUARD_BUSY, 0,
                                                  __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))) {
                    if (kept[c] == KEPT_SHUT)
                        unmerge_done(c);
                    continue;
                }
                if (__atomic_load_n(&slots[c].retired, __ATOMIC_SEQ_CST)) {
                    /* a fault opened it meanwhile: it stays out of the queue */
                    __atomic_store_n(&slots[c].state, TAG_GUARD_FREED, __ATOMIC_SEQ_CST);
                    if (kept[c] == KEPT_SHUT)
                        unmerge_done(c);
                    continue;
                }
                i = c;
                *reused = want == TAG_GUARD_FREED;
                /* else a freed out slot gave its pages back, or a freed
                 * one of a sampling rate's pool (bare); a shut one stays
                 * KEPT_SHUT until enter() opens it */
                *clean = (pressure && !kept[c]) || bare[c] == BARE_GIVEN;
                bare[c] = BARE_NO;
                if (kept[c] != KEPT_SHUT)
                    kept[c] = 0;
            }
            if (i != NO_SLOT)
                break;
            if (fresh < limit)
                continue;  /* the queue held no usable slot */
            if (win_count > 0) {
                leave_oldest();  /* nothing free: the oldest placement may be */
                continue;
            }
            /* every slot used so far holds a live block (or was retired):
             * a sampled one grows the pool, up to its cap */
            if (site)
                break;
            if (limit == capacity) {
                no_slot_allocs++;  /* full */
                say_full = !no_slot_said;
                no_slot_said = 1;
                break;
            }
            limit = capacity;
        }
        if (i != NO_SLOT && !enter(i)) {
            /* out of mappings (vm.max_map_count): the slot goes back as it was */
            __atomic_store_n(&slots[i].state, *reused ? TAG_GUARD_FREED : TAG_GUARD_EMPTY,
                             __ATOMIC_SEQ_CST);
            if (where[i] == SLOT_OUT) {
                if (kept[i] != KEPT_SHUT)  /* (a shut one stays shut) */
                    kept[i] = *clean ? 0 : KEPT_OPEN;  /* its pages as they were */
                enqueue_held(kept[i] == KEPT_SHUT ? &shut_q : &open_q, i);
            } else {  /* fresh: taken under this same lock, so the last one */
                fresh--;
                __atomic_store_n(&_tag_ctl.guard_used, fresh, __ATOMIC_RELAXED);
            }
            i = NO_SLOT;
        }
        if (i != NO_SLOT) {
            site_slot[i] = (uint8_t)site;
            site_live += (uint32_t)site;
            if (site)
                site_allocs++;
            else
                sampled_allocs++;
        }
    }
    unlock();
    if (TAG_UNLIKELY(say_full))
        _tag_log("libtag: the guard pool is full: its %u slots hold live blocks, and allocations go "
                 "unguarded until one is freed (LIBTAG_GUARD_SLOTS sets the cap, up to %u; "
                 "LIBTAG_STATS counts them as guard_no_slot)",
                 capacity, (unsigned)TAG_GUARD_MAX_SLOTS);
    return i;
}

/* ---------------------------------------------------------- allocation -- */

/* The slack of a block of size bytes at user in a slot ending at end: from
 * the start of its tag's page up to its tag, and from its end to the
 * slot's, TAG_GUARD_PATTERN (checked at free). */
static void slack_fill(char *user, uint64_t size, char *end)
{
    char *tg = (char *)_tag_of(user);
    char *lo = (char *)((uintptr_t)tg & ~(uintptr_t)(PAGE - 1));
    memset(lo, TAG_GUARD_PATTERN, (size_t)(tg - lo));
    memset(user + size, TAG_GUARD_PATTERN, (size_t)(end - (user + size)));
}

uint32_t _tag_guard_sites;
static uint64_t guard_allocs;           /* blocks placed in the pool (LIBTAG_STATS) */

uint64_t _tag_guard_allocs(void)
{
    return __atomic_load_n(&guard_allocs, __ATOMIC_RELAXED);
}

/* An allocation of stack goes to the pool as a new site: counted in the
 * stack's shared entry (libtag_stack_stats.guarded), the count
 * _tag_guard_new_site reads, whether or not the block fits a slot - a site
 * stops being new after about K tries.  0: the stack has no entry (none
 * left): not a new site. */
static int site_taken(uint32_t stack)
{
    uint32_t e = __atomic_load_n(&_tag_stats_slots[stack], __ATOMIC_RELAXED);
    if (e == 0 && (e = _tag_stats_new(stack)) == 0)
        return 0;
    __atomic_fetch_add(&_tag_stats[e].guarded, 1, __ATOMIC_RELAXED);
    return 1;
}

void _tag_guard_kinds(uint64_t *sampled, uint64_t *sites, uint64_t *no_slot)
{
    lock();
    *sampled = sampled_allocs;
    *sites = site_allocs;
    *no_slot = no_slot_allocs;
    unlock();
}

void *_tag_guard_alloc(struct tag_thread_state *t, size_t size, size_t align, int zero, uint32_t kind,
                       uint32_t stack, int sampled)
{
    int site = !sampled;  /* guarded as its stack's first block */
    if (sampled) {
        if (TAG_UNLIKELY(rng == 0)) {
            /* this thread's first allocation: seed, and start counting */
            rng = (_tag_ctl.secret ^ (uint64_t)(uintptr_t)&rng) * TAG_MIX2 | 1;
            t->guard_countdown = next_countdown();
            if (_tag_opt.guard_rate != 1) {
                if (!(_tag_guard_new_site(stack) && site_taken(stack)))
                    return NULL;
                site = 1;
            }
        }
        t->guard_countdown = next_countdown();
    } else if (!site_taken(stack)) {
        return NULL;
    }
    size_t payload = size < TAG_MIN_PAYLOAD ? TAG_MIN_PAYLOAD : size;
    /* the block with its tag must fit: user is the slot's end minus the
     * payload rounded up to align, the tag the 16 bytes before it */
    if (_tag_opt.guard_rate == 0 || align > PAGE ||
        payload > TAG_GUARD_SLOT_SIZE - sizeof(struct libtag_tag) ||
        ((payload + align - 1) & ~(align - 1)) > TAG_GUARD_SLOT_SIZE - sizeof(struct libtag_tag))
        return NULL;
    int saved = errno;  /* malloc leaves errno alone when it succeeds */
    int reused = 0, clean = 0;
    uint32_t i = take_slot(&reused, &clean, site);
    if (i == NO_SLOT) {
        errno = saved;
        return NULL;
    }
    struct libtag_guard_slot *s = &slots[i];
    char *base = slot_base(i), *end = base + TAG_GUARD_SLOT_SIZE;
    char *user = (char *)((uintptr_t)(end - payload) & ~(uintptr_t)(align - 1));
    if (reused && !clean) {
        /* The pages keep what the last block left (no madvise, no fresh
         * page faults: the slot's cost is its two mprotect calls); its tag
         * goes, so no reader finds a block that is gone. */
        _tag_of((void *)(uintptr_t)s->user)->bits = 0;
        if (zero)
            memset(user, 0, size);
    }
    struct libtag_tag *tg = _tag_of(user);
    slack_fill(user, size, end);

    /* the tag as _tag_write_live writes it, and no canary: the slack and
     * the guard page after it take its place (a reader knows the block is
     * guarded from its address, in the pool) */
    _tag_store(tg, tag_bits(t->tid, size, TAG_STATE_LIVE, kind), stack, _tag_now_ms());
    s->tag = *tg;
    memset(&s->rec, 0, sizeof s->rec);
    s->user = (uint64_t)(uintptr_t)user;
    s->reported = 0;
    __atomic_store_n(&s->state, TAG_GUARD_LIVE, __ATOMIC_RELEASE);
    _tag_count(t, 0, size);
    _tag_stats_alloc(t, tg->alloc_stack, size, user);
    __atomic_fetch_add(&guard_allocs, 1, __ATOMIC_RELAXED);
    errno = saved;
    return user;
}

/* ------------------------------------------------------------- release -- */

/* The slot whose data pages hold addr; NO_SLOT for a guard page. */
static uint32_t slot_of(const void *addr)
{
    uint64_t off = (uint64_t)(uintptr_t)addr - (uint64_t)(uintptr_t)pool;
    if (off % STRIDE < PAGE)
        return NO_SLOT;
    uint64_t i = off / STRIDE;
    return i < capacity ? (uint32_t)i : NO_SLOT;
}

/* The first byte in [p, p + n) that does not hold the slack pattern, or
 * NULL: compared a page at a time with glibc's (vectorised) memcmp, the
 * slack before the tag being up to a page long. */
static const unsigned char slack_page[TAG_PAGE_MAX] = {[0 ... TAG_PAGE_MAX - 1] = TAG_GUARD_PATTERN};

static const unsigned char *slack_damage(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i += PAGE) {
        size_t k = n - i < PAGE ? n - i : PAGE;
        if (TAG_UNLIKELY(memcmp(p + i, slack_page, k) != 0)) {
            while (p[i] == TAG_GUARD_PATTERN)
                i++;
            return p + i;
        }
    }
    return NULL;
}

static TAG_COLD void report(uint32_t kind, const void *address, struct libtag_guard_slot *s,
                            const struct libtag_free_rec *rec, void *ret, void *frame)
{
    struct libtag_tag copy = s->tag;
    struct tag_report r = {
        .kind = kind,
        .address = address,
        .block = (const void *)(uintptr_t)s->user,
        .tag = &copy,
        .rec = rec,
    };
    _tag_anomaly(&r, ret, frame);
}

static void mark_reported(struct libtag_guard_slot *s, void *ptr)
{
    _tag_set_bits(ptr, 0, TAG_FLAG_REPORTED);
    s->tag = *_tag_of(ptr);
}

/* ptr is the live block of slot s: check its tag, its slack and how it is
 * released, reporting what is wrong (each once).  Its tag is restored from
 * the slot's copy when an underflow damaged it. */
static void check_live(struct libtag_guard_slot *s, void *ptr, uint32_t dealloc, void *ret,
                       void *frame)
{
    struct libtag_tag *tg = _tag_of(ptr);
    if (TAG_LIKELY(_tag_valid_at((uint64_t)(uintptr_t)tg, tg))) {
        s->tag = *tg;  /* only libtag writes a tag that validates (a C++
                          retry through the next operator new sets the kind) */
    } else {
        const unsigned char *have = (const unsigned char *)tg;
        const unsigned char *want = (const unsigned char *)&s->tag;
        size_t k = 0;
        while (k < sizeof *tg - 1 && have[k] == want[k])
            k++;
        if (!_tag_reported(&s->tag))  /* its snapshot shows the damage */
            report(TAG_ANOMALY_HEAP_UNDERFLOW, have + k, s, NULL, ret, frame);
        *tg = s->tag;
        mark_reported(s, ptr);
    }
    const unsigned char *user = ptr;
    const unsigned char *end = (const unsigned char *)slot_base(slot_of(ptr)) + TAG_GUARD_SLOT_SIZE;
    const unsigned char *lo =
        (const unsigned char *)((uintptr_t)tg & ~(uintptr_t)(PAGE - 1));
    uint64_t size = _tag_size(tg);
    const unsigned char *over = slack_damage(user + size, (size_t)(end - (user + size)));
    const unsigned char *under = slack_damage(lo, (size_t)((const unsigned char *)tg - lo));
    if (TAG_UNLIKELY(over || under) && !_tag_reported(tg)) {
        mark_reported(s, ptr);
        report(over ? TAG_ANOMALY_HEAP_OVERFLOW : TAG_ANOMALY_HEAP_UNDERFLOW,
               over ? over : under, s, NULL, ret, frame);
    }
    if (TAG_UNLIKELY(_tag_alloc_kind(tg) != dealloc))
        _tag_report_mismatch(ptr, dealloc, ret, frame);
}

/* ptr is no live block's start: a second free, or a pointer that was
 * never a block. */
static TAG_COLD void bad_release(void *ptr, uint32_t i, void *ret, void *frame)
{
    struct libtag_guard_slot *s = i == NO_SLOT ? NULL : &slots[i];
    if (s && s->user == (uint64_t)(uintptr_t)ptr &&
        __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == TAG_GUARD_FREED) {
        struct libtag_free_rec rec = s->rec;
        report(TAG_ANOMALY_DOUBLE_FREE, ptr, s, &rec, ret, frame);
        return;
    }
    struct tag_report r = {.kind = TAG_ANOMALY_INVALID_FREE, .address = ptr};
    _tag_anomaly(&r, ret, frame);
}

void _tag_guard_free(struct tag_thread_state *t, void *ptr, uint32_t dealloc, void *ret, void *frame)
{
    uint32_t i = slot_of(ptr);
    struct libtag_guard_slot *s = i == NO_SLOT ? NULL : &slots[i];
    uint32_t live = TAG_GUARD_LIVE;
    if (!s || s->user != (uint64_t)(uintptr_t)ptr ||
        !__atomic_compare_exchange_n(&s->state, &live, TAG_GUARD_BUSY, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST)) {
        bad_release(ptr, i, ret, frame);
        return;
    }
    check_live(s, ptr, dealloc, ret, frame);
    struct libtag_tag *tg = _tag_of(ptr);
    uint64_t size = _tag_size(tg);
    _tag_stats_free(t, tg->alloc_stack, size, ptr);  /* t NULL: a thread without a state */
    struct libtag_free_rec rec = {
        .free_stack = t ? _tag_capture(t, ret, frame) : 0,
        .free_tid = _tag_tls.tid,
        .free_time = _tag_now_ms(),
    };
    rec.check = free_rec_check_value((uint64_t)(uintptr_t)tg, _tag_ctl.secret, &rec);
    _tag_write_freed(ptr, size);
    s->tag = *tg;
    s->rec = rec;
    _tag_count(t, 1, size);
    lock();  /* leave() decides by the state and where[] under it */
    if (site_slot[i]) {
        site_slot[i] = 0;
        site_live--;
    }
    if (!pressure && where[i] != SLOT_OUT && !__atomic_load_n(&s->retired, __ATOMIC_SEQ_CST)) {
        /* a sampling rate's pool: the pages go back, so it keeps resident
         * only its live blocks' (lua's peak RSS: 19.1 -> 18.7 MB); before
         * FREED, so a fault on the block always finds them marked and
         * refills them first (slot_refill).  A retired slot stays open and
         * faults no more: it keeps what the free left. */
        madvise(slot_base(i), TAG_GUARD_SLOT_SIZE, MADV_DONTNEED);
        __atomic_store_n(&bare[i], BARE_GIVEN, __ATOMIC_SEQ_CST);
    }
    __atomic_store_n(&s->state, TAG_GUARD_FREED, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->retired, __ATOMIC_SEQ_CST)) {
        /* opened by a fault: the program may still be in it */
        if (kept[i] == KEPT_LONE)
            unmerge_done(i);
    } else {
        if (where[i] == SLOT_OUT) {
            if (kept[i] == KEPT_LONE) {
                /* shut as a block freed in the window is: caught after it */
                mprotect(slot_base(i), TAG_GUARD_SLOT_SIZE, PROT_NONE);
                kept[i] = KEPT_SHUT;
                enqueue_held(&shut_q, i);
            } else {
                enqueue_held(&open_q, i);
                if (pressure)
                    give_back_held(i);  /* it stays open */
            }
        } else {
            mprotect(slot_base(i), TAG_GUARD_SLOT_SIZE, PROT_NONE);  /* reusable when it leaves the window */
        }
    }
    unlock();
}

int _tag_guard_check(void *ptr, uint32_t dealloc, void *ret, void *frame)
{
    uint32_t i = slot_of(ptr);
    struct libtag_guard_slot *s = i == NO_SLOT ? NULL : &slots[i];
    if (!s || s->user != (uint64_t)(uintptr_t)ptr ||
        __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != TAG_GUARD_LIVE) {
        bad_release(ptr, i, ret, frame);
        return 0;
    }
    check_live(s, ptr, dealloc, ret, frame);
    return 1;
}

size_t _tag_guard_usable(const void *ptr)
{
    uint32_t i = slot_of(ptr);
    if (i == NO_SLOT || slots[i].user != (uint64_t)(uintptr_t)ptr ||
        __atomic_load_n(&slots[i].state, __ATOMIC_ACQUIRE) != TAG_GUARD_LIVE)
        return 0;
    return (size_t)_tag_size(&slots[i].tag);
}

/* --------------------------------------------------------------- faults -- */

/* Async-signal-safe from here on: no locks, no malloc. */

static int used(uint32_t state)
{
    return state == TAG_GUARD_LIVE || state == TAG_GUARD_FREED;
}

/* A fault in freed slot i, retired and FREED (so no placement takes it):
 * if its pages were given back at the free (bare[i]), they read as zeros;
 * put back what the free left there - the slack's pattern, the tag, the
 * freed block's pattern - before a snapshot or the program sees them, so
 * a read after free finds what it finds in any freed block.  The first
 * fault refills; a fault of another thread at once waits for it. */
static void slot_refill(uint32_t i)
{
    uint8_t want = BARE_GIVEN;
    if (!__atomic_compare_exchange_n(&bare[i], &want, BARE_FILLING, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST)) {
        while (want == BARE_FILLING) {
            sched_yield();
            want = __atomic_load_n(&bare[i], __ATOMIC_SEQ_CST);
        }
        return;
    }
    const struct libtag_guard_slot *s = &slots[i];
    char *base = slot_base(i), *end = base + TAG_GUARD_SLOT_SIZE;
    char *user = (char *)(uintptr_t)s->user;
    struct libtag_tag *tg = _tag_of(user);
    uint64_t size = _tag_size(&s->tag);
    if (mprotect(base, TAG_GUARD_SLOT_SIZE, PROT_READ | PROT_WRITE) == 0) {
        slack_fill(user, size, end);
        *tg = s->tag;
        _tag_pattern_fill(user, _tag_fill_len(size));
        mprotect(base, TAG_GUARD_SLOT_SIZE, PROT_NONE);
    }
    __atomic_store_n(&bare[i], BARE_NO, __ATOMIC_SEQ_CST);
}

/* The faulting thread's stack at the instruction.  An intern finds the
 * table lock taken only while another thread inserts (the faulting code
 * is the program's, which never holds it; a handler of the program that
 * interrupted an insert of its own thread is why the wait is bounded). */
static uint32_t fault_stack(struct tag_thread_state *t, const ucontext_t *uc)
{
    uint32_t id = 0;
    for (int k = 0; k < 100 && !id; k++) {
        id = _tag_capture_uc(t, uc);
        if (id || __atomic_load_n(&_tag_ctl.stack_count, __ATOMIC_RELAXED) >=
                      _tag_ctl.stack_capacity)
            break;
        sched_yield();
    }
    return id;
}

int _tag_guard_fault(int sig, void *siv, void *ucv)
{
    siginfo_t *si = siv;
    ucontext_t *uc = ucv;
    uint64_t bytes = __atomic_load_n(&_tag_ctl.guard_pool_bytes, __ATOMIC_ACQUIRE);
    uint64_t a = (uint64_t)(uintptr_t)si->si_addr;
    uint64_t off = a - _tag_ctl.guard_pool;
    if (sig != SIGSEGV || si->si_code <= 0 || off >= bytes)
        return 0;
    int saved = errno;
    uint32_t kind, i = slot_of(si->si_addr), other = NO_SLOT;
    char *open_lo;
    size_t open_len;
    if (i != NO_SLOT) {
        /* in a slot: only a freed one is inaccessible; a slot being placed
         * is opened in a moment (run the instruction again) */
        uint32_t st = __atomic_load_n(&slots[i].state, __ATOMIC_SEQ_CST);
        if (st == TAG_GUARD_BUSY) {
            errno = saved;
            return 1;
        }
        if (st != TAG_GUARD_FREED) {
            errno = saved;
            return 0;  /* a wild pointer into an unused slot: not a block's fault */
        }
        kind = TAG_ANOMALY_USE_AFTER_FREE;
        open_lo = slot_base(i);
        open_len = TAG_GUARD_SLOT_SIZE;
    } else {
        /* a guard page: the blocks it separates end at its start (below)
         * and start at their user pointer (above); the nearer one it is */
        uint32_t g = (uint32_t)(off / STRIDE);
        uint64_t page = _tag_ctl.guard_pool + (uint64_t)g * STRIDE;
        uint32_t below = g > 0 ? g - 1 : NO_SLOT, above = g < capacity ? g : NO_SLOT;
        int ub = below != NO_SLOT && used(__atomic_load_n(&slots[below].state, __ATOMIC_SEQ_CST));
        int ua = above != NO_SLOT && used(__atomic_load_n(&slots[above].state, __ATOMIC_SEQ_CST));
        if (!ub && !ua) {
            errno = saved;
            return 0;
        }
        int is_below = ub && (!ua || a - page < slots[above].user - a);
        i = is_below ? below : above;
        other = is_below ? above : below;
        kind = is_below ? TAG_ANOMALY_HEAP_OVERFLOW : TAG_ANOMALY_HEAP_UNDERFLOW;
        open_lo = (char *)(uintptr_t)page;
        open_len = PAGE;
    }
    struct libtag_guard_slot *s = &slots[i];
    int abort_mode = _tag_opt.on_anomaly == TAG_ON_ABORT;
    /* retire first (a placement checks it after taking the slot), then
     * claim the report: one per slot */
    __atomic_store_n(&s->retired, 1, __ATOMIC_SEQ_CST);
    if (other != NO_SLOT)
        __atomic_store_n(&slots[other].retired, 1, __ATOMIC_SEQ_CST);
    if (kind == TAG_ANOMALY_USE_AFTER_FREE &&
        __atomic_load_n(&s->state, __ATOMIC_SEQ_CST) != TAG_GUARD_FREED) {
        errno = saved;
        return 1;  /* placed again meanwhile: the instruction now runs */
    }
    if (kind == TAG_ANOMALY_USE_AFTER_FREE)
        slot_refill(i);  /* retired and FREED: no placement takes it now */
    if (__atomic_exchange_n(&s->reported, 1, __ATOMIC_ACQ_REL)) {
        /* reported already: open silently - unless that report is taking
         * the process down at this instruction */
        if (!abort_mode)
            mprotect(open_lo, open_len, PROT_READ | PROT_WRITE);
        errno = saved;
        return 1;
    }
    __atomic_fetch_add(&_tag_ctl.guard_faults, 1, __ATOMIC_RELAXED);
    struct tag_thread_state *t = _tag_self();
    struct libtag_tag copy = s->tag;
    struct libtag_free_rec rec = s->rec;
    uint32_t st = __atomic_load_n(&s->state, __ATOMIC_SEQ_CST);
    struct tag_report r = {
        .kind = kind,
        .address = si->si_addr,
        .block = (const void *)(uintptr_t)s->user,
        .tag = &copy,
        .rec = st == TAG_GUARD_FREED ? &rec : NULL,
        .access = tag_uc_is_write(uc) ? TAG_ACCESS_WRITE : TAG_ACCESS_READ,
        .pc = (const void *)(uintptr_t)tag_uc_pc(uc),
    };
    /* the snapshot shows the memory as the program found it; opened after */
    _tag_anomaly_at(&r, fault_stack(t, uc));
    if (abort_mode) {
        /* die at the instruction: it runs again, faults again, and the
         * default action of SIGSEGV ends the process (with no second core) */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        _tag_anomaly_no_core();
        __atomic_store_n(&_tag_probe_armed, 0, __ATOMIC_RELAXED);
        __sigaction(SIGSEGV, &dfl, NULL);
    } else {
        mprotect(open_lo, open_len, PROT_READ | PROT_WRITE);
    }
    errno = saved;
    return 1;
}

/* ------------------------------------------------------------ snapshot -- */

/* Only the slots ever used (and the guard page after the last): the rest
 * of the reservation stays unreadable and out of the kernel's core
 * (MADV_DONTDUMP), which otherwise counts the whole reservation - 5.4 GB
 * for rate 1's 262144 slots - in the core's size. */
void _tag_guard_expose(void)
{
    uint64_t bytes = __atomic_load_n(&_tag_ctl.guard_pool_bytes, __ATOMIC_ACQUIRE);
    if (!bytes)
        return;
    uint64_t used = __atomic_load_n(&_tag_ctl.guard_used, __ATOMIC_RELAXED);
    uint64_t open = PAGE + used * STRIDE;
    if (open > bytes)
        open = bytes;
    char *p = (char *)(uintptr_t)_tag_ctl.guard_pool;
    mprotect(p, open, PROT_READ | PROT_WRITE);
    if (open < bytes)
        madvise(p + open, bytes - open, MADV_DONTDUMP);
}
