/* damage.c - smashed headers: a block whose tag no longer validates.
 *
 * A free() of a pointer whose tag fails its check is not simply an invalid
 * free.  Before saying so, libtag asks what damaged the tag:
 *
 * 1. The nearest tagged block below it, if its canary is smashed, overflowed
 *    into it: that is one heap-overflow of the block below, with its stacks
 *    (reported once: not again when it was reported at its own free or by a
 *    sweep), and no second anomaly for the neighbour.
 * 2. A tag whose magic survives but whose check fails was written from
 *    below: an underflow of the block itself.  A write of up to 4 bytes
 *    before the block touches only pad, which is 0 or an alignment minus 32,
 *    so libtag tries each value and re-checks: when one validates, the tag
 *    is restored and the heap-underflow names the block, its stacks and the
 *    first damaged byte; when none does, the heap-underflow says the tag is
 *    unknown (its copy does not validate) rather than guess.
 * 3. Otherwise the pointer is not a block of ours.
 *
 * The damaged chunk itself is never handed back to glibc (the caller leaks
 * it, see _tag_leak_damaged): glibc's chunk header sits right below the tag
 * and would fail glibc's own checks.
 *
 * Rare path, in the program's normal context (never a signal handler).  The
 * pointer may be anything, so memory around it is read with
 * _tag_copy_own (process_vm_readv): an unmapped or PROT_NONE page ends the
 * search instead of faulting.
 */
#include <string.h>
#include <sys/uio.h>

#include "libtag_internal.h"

/* How far below a damaged tag to look for the block that overflowed into
 * it: blocks larger than this (glibc mmaps them by default anyway) are not
 * found, and the damage stays unexplained. */
#define LOOKBACK (1u << 20)
/* The smallest distance from one tag to the next: tag, minimum payload,
 * canary, rounded to 16. */
#define MIN_STRIDE 64u

void _tag_leak_damaged(uint64_t bytes)
{
    __atomic_fetch_add(&_tag_ctl.damaged_leaked, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&_tag_ctl.damaged_bytes, bytes, __ATOMIC_RELAXED);
}

static int peek(void *dst, uint64_t src, size_t n)
{
    struct iovec local = {dst, n}, remote = {(void *)(uintptr_t)src, n};
    return _tag_copy_own(&local, &remote, 1) == 1 && local.iov_len == n;
}

int _tag_recover(uint64_t tag_addr, struct libtag_tag *t)
{
    struct libtag_tag c = *t;
    if (c.magic != TAG_MAGIC)
        return 0;
    /* pad = 2^k - 32 for alignments 2^k = 32 .. 2^31; k = 5 gives 0, the
     * pad of every block allocated with the default alignment */
    for (unsigned k = 5; k < 32; k++) {
        c.pad = (1u << k) - 32u;
        if (_tag_valid_at(tag_addr, &c)) {
            *t = c;
            return 1;
        }
    }
    return 0;
}

/* The nearest valid tag below tag_addr (within LOOKBACK): its address and a
 * copy in *out, or 0. */
static uint64_t tag_below(uint64_t tag_addr, struct libtag_tag *out)
{
    enum { T = sizeof(struct libtag_tag) };
    unsigned char buf[TAG_PAGE_SIZE + T];
    if (tag_addr < TAG_PAGE_SIZE + MIN_STRIDE)
        return 0;
    uint64_t floor = tag_addr > LOOKBACK + TAG_PAGE_SIZE ? tag_addr - LOOKBACK : TAG_PAGE_SIZE;
    uint64_t a = (tag_addr - MIN_STRIDE) & ~15ull;  /* highest candidate */
    while (a >= floor) {
        /* this window: candidates lo..a, one page, read with the 32 bytes
         * of the top candidate's tag */
        uint64_t lo = a & ~(uint64_t)(TAG_PAGE_SIZE - 1);
        if (lo < floor)
            lo = floor & ~15ull;
        if (!peek(buf, lo, (size_t)(a - lo) + T))
            return 0;
        for (uint64_t c = a;; c -= 16) {
            struct libtag_tag t;
            memcpy(&t, buf + (c - lo), T);
            if (t.magic == TAG_MAGIC && _tag_valid_at(c, &t)) {
                *out = t;
                return c;
            }
            if (c == lo)
                break;
        }
        a = lo - 16;
    }
    return 0;
}

/* 1: the block below overflowed into the tag at tag_addr.  Reports it
 * unless it was reported before; returns 1 when it explains the damage. */
static int overflow_below(uint64_t tag_addr, void *ret, void *frame)
{
    struct libtag_tag below;
    uint64_t bt = tag_below(tag_addr, &below);
    if (!bt)
        return 0;
    uint64_t user = bt + sizeof below, size = _tag_size(&below);
    uint64_t extent = (size < TAG_MIN_PAYLOAD ? TAG_MIN_PAYLOAD : size) + TAG_CANARY_SIZE;
    if (user + extent > tag_addr)
        return 0;  /* tag_addr is inside that block: an interior pointer */
    unsigned char have[TAG_CANARY_SIZE];
    if (!peek(have, user + size, sizeof have))
        return 0;
    uint64_t want = tag_canary_value(bt, _tag_ctl.secret);
    unsigned first = 0;
    while (first < TAG_CANARY_SIZE && have[first] == (unsigned char)(want >> (8 * first)))
        first++;
    if (first == TAG_CANARY_SIZE)
        return 0;  /* its canary is whole: it did not run over its end */
    if (_tag_reported(&below))
        return 1;  /* reported at its own free, by a sweep, or by a neighbour */
    void *bu = (void *)(uintptr_t)user;
    _tag_set_bits(bu, 0, TAG_FLAG_REPORTED);  /* never reported twice, never handed back */
    struct libtag_free_rec rec;
    struct tag_report r = {
        .kind = TAG_ANOMALY_HEAP_OVERFLOW,
        .address = (char *)bu + size + first,
        .block = bu,
        .tag = &below,
        .rec = _tag_state(&below) == TAG_STATE_FREED && _tag_quarantine_find(bu, &rec) ? &rec
                                                                                  : NULL,
    };
    _tag_anomaly(&r, ret, frame);
    return 1;
}

enum tag_damage _tag_damaged(void *user, const struct libtag_free_rec *rec, void *ret, void *frame)
{
    uint64_t u = (uint64_t)(uintptr_t)user, tag_addr = u - sizeof(struct libtag_tag);
    if ((u & 15) != 0 || u < TAG_PAGE_SIZE + MIN_STRIDE)
        return TAG_DAMAGE_NONE;
    if (overflow_below(tag_addr, ret, frame))
        return TAG_DAMAGE_KNOWN;

    /* 2: written from below, or not ours */
    struct libtag_tag found, t;
    if (!peek(&found, tag_addr, sizeof found) || found.magic != TAG_MAGIC)
        return TAG_DAMAGE_NONE;
    t = found;
    int restored = _tag_recover(tag_addr, &t);
    struct libtag_free_rec frec;
    if (restored && !rec && _tag_state(&t) == TAG_STATE_FREED && _tag_quarantine_find(user, &frec))
        rec = &frec;
    const unsigned char *a = (const unsigned char *)&found, *b = (const unsigned char *)&t;
    unsigned first = 0;
    while (restored && first < sizeof t - 1 && a[first] == b[first])
        first++;
    struct tag_report r = {
        .kind = TAG_ANOMALY_HEAP_UNDERFLOW,
        .address = restored ? (const char *)(uintptr_t)tag_addr + first : (const char *)user,
        .block = user,
        .tag = restored ? &t : &found,  /* the damaged one: it does not validate */
        .rec = rec,
    };
    _tag_anomaly(&r, ret, frame);  /* its snapshot shows the damage */
    if (!restored)
        return TAG_DAMAGE_KNOWN;
    /* put it back, marked: the block can be freed (and is then kept from
     * glibc), and no later check reports it again */
    TAG_ASSERT(_tag_valid_at(tag_addr, &t));
    memcpy((void *)(uintptr_t)tag_addr, &t, sizeof t);
    _tag_set_bits(user, 0, TAG_FLAG_REPORTED);
    return TAG_DAMAGE_REPAIRED;
}
