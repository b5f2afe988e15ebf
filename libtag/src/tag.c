/* tag.c - placing, checking and retiring the tag in front of each block.
 * See tag_abi.h for the layout; every write here keeps the check value in
 * step with the fields so a reader of raw memory can trust a tag that
 * validates and reject one that an overflow has touched. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "libtag_internal.h"

void _tag_write_live(void *user, size_t size, uint32_t pad, uint32_t stack,
                     uint32_t tid, uint32_t now, uint32_t kind)
{
    struct libtag_tag *t = _tag_of(user);
    uint64_t addr = (uint64_t)(uintptr_t)t;
    TAG_ASSERT(((uintptr_t)user & 15) == 0 && kind <= TAG_ALLOC_NEW_ARRAY_ALIGNED);
    t->size_state = (uint64_t)size | (uint64_t)TAG_STATE_LIVE << TAG_STATE_SHIFT |
                    (uint64_t)kind << TAG_ALLOC_SHIFT;
    t->alloc_stack = stack;
    t->alloc_tid = tid;
    t->alloc_time = now;
    t->pad = pad;
    t->check = tag_check_value(addr, _tag_ctl.secret, t);
    uint64_t canary = tag_canary_value(addr, _tag_ctl.secret);
    memcpy((char *)user + size, &canary, sizeof canary);
    t->magic = TAG_MAGIC;
}

/* Before touching a tag, make sure its page is mapped (mincore fails with
 * ENOMEM on unmapped memory) when it may not be:
 * - the tag starts on the page before user (user in a page's first 32
 *   bytes): user may not be ours at all;
 * - user is in a page's first 64 bytes: that is where glibc puts an
 *   mmap'ed chunk (a large block), which free() munmaps - a second free()
 *   of it must be reported, not fault.
 * A system call for 1 in 64 pointers; none for the rest. */
static int tag_readable(const struct libtag_tag *t, const void *user)
{
    uintptr_t u = (uintptr_t)user;
    if ((u & 4095) >= 64)
        return 1;
    unsigned char vec;
    int saved = errno;
    int ok = mincore((void *)(((uintptr_t)t) & ~(uintptr_t)4095), 1, &vec) == 0;
    errno = saved;
    return ok;
}

void _tag_set_bits(void *user, uint64_t clear, uint64_t set)
{
    struct libtag_tag *t = _tag_of(user);
    t->size_state = (t->size_state & ~clear) | set;
    t->check = tag_check_value((uint64_t)(uintptr_t)t, _tag_ctl.secret, t);
}

int _tag_valid_at(uint64_t tag_addr, const struct libtag_tag *t)
{
    uint32_t state = _tag_state(t);
    return t->magic == TAG_MAGIC && (state == TAG_STATE_LIVE || state == TAG_STATE_FREED) &&
           t->check == tag_check_value(tag_addr, _tag_ctl.secret, t);
}

enum tag_lookup _tag_lookup(const void *user)
{
    const struct libtag_tag *t = _tag_of(user);
    if (((uintptr_t)user & 15) != 0 || (uintptr_t)user < 4096 + sizeof *t)
        return TAG_NOT_OURS;
    if (!tag_readable(t, user))
        return TAG_NOT_OURS;
    if (t->magic != TAG_MAGIC ||
        t->check != tag_check_value((uint64_t)(uintptr_t)t, _tag_ctl.secret, t))
        return TAG_NOT_OURS;
    switch (_tag_state(t)) {
    case TAG_STATE_LIVE:
        return TAG_IS_LIVE;
    case TAG_STATE_FREED:
        return TAG_IS_FREED;
    default:
        return TAG_NOT_OURS;
    }
}

int _tag_canary_ok(const void *user)
{
    const struct libtag_tag *t = _tag_of(user);
    uint64_t want = tag_canary_value((uint64_t)(uintptr_t)t, _tag_ctl.secret);
    uint64_t have;
    memcpy(&have, (const char *)user + _tag_size(t), sizeof have);
    return have == want;
}

/* The first damaged canary byte (0..7) of a block whose canary is bad. */
unsigned _tag_canary_damage(const void *user)
{
    const struct libtag_tag *t = _tag_of(user);
    uint64_t want = tag_canary_value((uint64_t)(uintptr_t)t, _tag_ctl.secret);
    const unsigned char *have = (const unsigned char *)user + _tag_size(t);
    unsigned i = 0;
    while (i < TAG_CANARY_SIZE - 1 && have[i] == (unsigned char)(want >> (8 * i)))
        i++;
    return i;
}

size_t _tag_fill_len(const struct libtag_tag *t)
{
    uint64_t size = _tag_size(t);
    return size < _tag_opt.quarantine_fill ? (size_t)size : _tag_opt.quarantine_fill;
}

/* free() marks the tag before the block can be reused by anyone, so a
 * reader never sees a freed block that still claims to be live.  The whole
 * payload up to the fill cap gets the pattern: the free record is kept in
 * the quarantine ring, so the first bytes of an object - a refcount, a
 * vtable pointer, a next pointer, what a dangling pointer writes first - are
 * watched like the rest. */
void _tag_write_freed(void *user)
{
    struct libtag_tag *t = _tag_of(user);
    memset(user, TAG_FREE_PATTERN, _tag_fill_len(t));
    t->size_state = (t->size_state & ~((uint64_t)0xff << TAG_STATE_SHIFT)) |
                    (uint64_t)TAG_STATE_FREED << TAG_STATE_SHIFT;
    t->check = tag_check_value((uint64_t)(uintptr_t)t, _tag_ctl.secret, t);
}

size_t _tag_freed_damage(const void *user)
{
    const unsigned char *p = user;
    size_t n = _tag_fill_len(_tag_of(user)), i = 0;
    const uint64_t pat = 0x0101010101010101ull * TAG_FREE_PATTERN;
    /* 32 bytes a step, one branch per step: this runs at every eviction */
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        if (((w[0] ^ pat) | (w[1] ^ pat) | (w[2] ^ pat) | (w[3] ^ pat)) != 0)
            break;
    }
    for (; i < n; i++)
        if (p[i] != TAG_FREE_PATTERN)
            return i;
    return TAG_INTACT;
}
