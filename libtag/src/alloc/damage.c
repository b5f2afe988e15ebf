/* damage.c - smashed headers: a block whose tag no longer validates.
 *
 * A free() of a pointer whose tag fails its check is not simply an invalid
 * free.  Before saying so, libtag asks what damaged the tag:
 *
 * 0. Its tag must sit where its slot says a tag is (arithmetic on the
 *    address: the slot's start, or where its forward record points);
 *    anything else is not a block of ours.
 * 1. The block in the slot below, if its canary is smashed, overflowed
 *    into it: that is one heap-overflow of the block below, with its stacks
 *    (reported once: not again when it was reported at its own free or by a
 *    sweep), and no second anomaly for the neighbour.
 * 2. A tag whose bits are not 0 (a free slot's) was written from below: an
 *    underflow of the block itself.  A write of up to 4 bytes before the
 *    block touches only the top half of the bits word, which libtag
 *    rebuilds (_tag_recover) and re-checks: when one candidate validates,
 *    the tag is restored and the heap-underflow names the block, its
 *    stacks and the first damaged byte; when none does, the heap-underflow
 *    says the tag is unknown (its copy does not validate) rather than
 *    guess.
 * 3. Otherwise the pointer is not a block of ours.
 *
 * The damaged block itself is never handed back to the heap (the caller
 * leaks it, see _tag_leak_damaged): the write that damaged it may have
 * gone further.
 *
 * Rare path, in the program's normal context (never a signal handler).  The
 * pointer may be anything, but only memory of the heap's used region is
 * read, which is always mapped.
 */
#include <string.h>

#include "base/base.h"
#include "base/control.h"
#include "heap/heap.h"
#include "stacks/thread.h"
#include "alloc/anomaly.h"
#include "alloc/damage.h"
#include "alloc/quarantine.h"
#include "alloc/tag.h"

void _tag_leak_damaged(uint64_t bytes)
{
    __atomic_fetch_add(&_tag_ctl.damaged_leaked, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&_tag_ctl.damaged_bytes, bytes, __ATOMIC_RELAXED);
}

/* Where the block's canary is, found by its value: the size of a block
 * whose tag lost its size field.  0: not found (the size is then 0, or
 * not known). */
static int size_by_canary(uint64_t tag_addr, uint64_t *size)
{
    uint64_t slot = _tag_slot_of(tag_addr);
    if (slot == 0)
        return 0;
    uint64_t user = tag_addr + sizeof(struct libtag_tag);
    uint64_t end = slot + _tag_heap_usable((const void *)(uintptr_t)slot);
    uint64_t want = tag_canary_value(tag_addr, _tag_ctl.secret);
    for (uint64_t a = user; a + TAG_CANARY_SIZE <= end && a - user <= TAG_SIZE_BIG; a++) {
        uint64_t have;
        memcpy(&have, (const void *)(uintptr_t)a, sizeof have);
        if (have == want) {
            *size = a - user;
            return 1;
        }
    }
    return 0;
}

/* A write of up to 4 bytes before a block hits its tag's last 4 bytes:
 * the top half of the bits word - 6 bits of the thread id, the size field,
 * the state, the kind, the reported flag.  The size comes back from where
 * the canary is; the thread id's top bits from the threads libtag knows;
 * the rest is tried value by value, each candidate re-checked against the
 * check value (the tag's first 12 bytes, which such a write cannot reach). */
int _tag_recover(uint64_t tag_addr, struct libtag_tag *t)
{
    if (!_tag_heap_has((const void *)(uintptr_t)tag_addr))
        return 0;
    uint64_t size;
    if (!size_by_canary(tag_addr, &size))
        return 0;
    uint64_t sz = size < TAG_SIZE_BIG ? size : TAG_SIZE_BIG;
    if (sz == TAG_SIZE_BIG && _tag_big_size(tag_addr) != size)
        return 0;
    const struct libtag_thread *rec = (const struct libtag_thread *)(uintptr_t)_tag_ctl.threads;
    uint32_t nrec = __atomic_load_n(&_tag_ctl.thread_count, __ATOMIC_ACQUIRE);
    if (nrec > _tag_ctl.thread_capacity)
        nrec = _tag_ctl.thread_capacity;
    uint64_t low = t->bits & 0xffffffffull;  /* check, tid bits 0..15 */
    uint64_t tried = 0;  /* bit n: tid high part n was tried */
    for (uint32_t r = 0; r <= nrec; r++) {
        uint32_t tid = r < nrec ? rec[r].tid : _tag_tls.tid;
        uint32_t hi = (tid >> 16) & 63u;
        if (tried & (1ull << hi))
            continue;
        tried |= 1ull << hi;
        for (uint32_t state = TAG_STATE_LIVE; state <= TAG_STATE_FREED; state++)
            for (uint32_t kind = 0; kind <= TAG_ALLOC_NEW_ARRAY_ALIGNED; kind++)
                for (uint64_t r2 = 0; r2 < 2; r2++) {
                    uint64_t rep = r2 ? TAG_FLAG_REPORTED : 0;
                    struct libtag_tag c = *t;
                    c.bits = low | (uint64_t)hi << 32 | sz << TAG_SIZE_SHIFT |
                             (uint64_t)state << TAG_STATE_SHIFT | (uint64_t)kind << TAG_ALLOC_SHIFT |
                             rep;
                    if (_tag_valid_at(tag_addr, &c)) {
                        *t = c;
                        return 1;
                    }
                }
    }
    return 0;
}

/* The tag of the block whose slot starts at slot, resolving a forward
 * record: its address and a copy in *out, or 0 when the slot holds no
 * valid one. */
static uint64_t tag_in_slot(uint64_t slot, struct libtag_tag *out)
{
    uint64_t at = _tag_slot_tag(slot, slot + _tag_heap_usable((const void *)(uintptr_t)slot) -
                                          sizeof *out);
    if (!at)
        return 0;
    memcpy(out, (const void *)(uintptr_t)at, sizeof *out);
    return _tag_valid_at(at, out) ? at : 0;
}

/* The slot right below slot's: the one before it in its span, or the last
 * one carved of the span below; 0 if none. */
static uint64_t slot_below(uint64_t slot)
{
    const struct tag_slice *s = _tag_heap_span((const void *)(uintptr_t)slot);
    uint64_t start = (uint64_t)(uintptr_t)_tag_heap_span_start(s);
    if (s->kind == TAG_SPAN_SMALL && slot >= start + s->block_size)
        return slot - s->block_size;
    if (start == _tag_heap.base)
        return 0;
    const struct tag_slice *p = _tag_heap_span((const void *)(uintptr_t)(start - 1));
    uint64_t pstart = (uint64_t)(uintptr_t)_tag_heap_span_start(p);
    if (p->kind == TAG_SPAN_SMALL && p->carved)
        return pstart + (uint64_t)(p->carved - 1) * p->block_size;
    if (p->kind == TAG_SPAN_LARGE)
        return pstart + p->block_off;
    return 0;
}

/* 1: the block below overflowed into the tag at tag_addr.  Reports it
 * unless it was reported before; returns 1 when it explains the damage. */
static int overflow_below(uint64_t tag_addr, void *ret, void *frame)
{
    uint64_t slot = _tag_slot_of(tag_addr);
    uint64_t below_slot = slot ? slot_below(slot) : 0;
    struct libtag_tag below;
    uint64_t bt = below_slot ? tag_in_slot(below_slot, &below) : 0;
    if (!bt)
        return 0;
    uint64_t user = bt + sizeof below, size = _tag_size_at(bt, &below);
    uint64_t extent = (size < TAG_MIN_PAYLOAD ? TAG_MIN_PAYLOAD : size) + TAG_CANARY_SIZE;
    if (user + extent > tag_addr)
        return 0;  /* tag_addr is inside that block: an interior pointer */
    unsigned char have[TAG_CANARY_SIZE];
    memcpy(have, (const void *)(uintptr_t)(user + size), sizeof have);
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
    /* a block's tag is where its slot says (arithmetic): anything else is
     * not a block of ours */
    if ((u & 15) != 0 || !_tag_heap_has((const void *)(uintptr_t)tag_addr))
        return TAG_DAMAGE_NONE;
    if (!_tag_in_place(tag_addr))
        return TAG_DAMAGE_NONE;
    if (overflow_below(tag_addr, ret, frame))
        return TAG_DAMAGE_KNOWN;

    /* 2: written from below, or a free slot (not a block) */
    struct libtag_tag found, t;
    memcpy(&found, (const void *)(uintptr_t)tag_addr, sizeof found);
    if (found.bits == 0 || _tag_valid_at(tag_addr, &found))
        return TAG_DAMAGE_NONE;  /* a free slot; or a tag another thread
                                    was writing when the caller read it */
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
