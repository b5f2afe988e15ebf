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

int _tag_page_mapped(const void *addr)
{
    unsigned char vec;
    int saved = errno;
    int ok = mincore((void *)((uintptr_t)addr & ~(uintptr_t)(TAG_PAGE_SIZE - 1)), 1, &vec) == 0;
    errno = saved;
    return ok;
}

void _tag_set_bits(void *user, uint64_t clear, uint64_t set)
{
    struct libtag_tag *t = _tag_of(user);
    t->size_state = (t->size_state & ~clear) | set;
    t->check = tag_check_value((uint64_t)(uintptr_t)t, _tag_ctl.secret, t);
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

/* What the fill must still hold: one page of it, compared with glibc's
 * memcmp (vectorised; async-signal-safe, so the snapshot child may too). */
static const unsigned char free_pattern[TAG_PAGE_SIZE] = {[0 ... TAG_PAGE_SIZE - 1] = TAG_FREE_PATTERN};

size_t _tag_freed_damage(const void *user)
{
    const unsigned char *p = user;
    size_t n = _tag_fill_len(_tag_of(user));
    for (size_t i = 0; i < n; i += sizeof free_pattern) {
        size_t k = n - i < sizeof free_pattern ? n - i : sizeof free_pattern;
        if (TAG_UNLIKELY(memcmp(p + i, free_pattern, k) != 0)) {
            while (p[i] == TAG_FREE_PATTERN)
                i++;
            return i;
        }
    }
    return TAG_INTACT;
}
