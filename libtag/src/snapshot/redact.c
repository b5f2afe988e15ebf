/* redact.c - LIBTAG_PAYLOAD=omit: snapshot cores without the program's data.
 *
 * A core holds everything the process had in memory: keys, tokens, customer
 * records.  With this option the snapshot child, before it dumps, blanks
 * the payload of every tagged block in its own copy of memory, so the core
 * keeps the tags, free records (in the quarantine rings), stacks and thread
 * state - every answer forensics gives - but not what the blocks held, nor
 * what a dangling pointer wrote into a freed one (the snapshot checked the
 * freed blocks first: see _tag_quarantine_check_all).
 *
 * Only the child's copy changes (the mappings are private; the parent never
 * sees it).  Whole pages inside a payload are dropped with
 * MADV_DONTNEED, which for a private mapping throws away the child's view of
 * them without copying anything, and the core gets holes there; the partial
 * pages at each end are cleared with memset (one copy-on-write page each).
 *
 * Runs in the fork child: single-threaded, async-signal-safe calls only, no
 * malloc, static buffers.
 */
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "base/control.h"
#include "heap/heap.h"
#include "alloc/tag.h"
#include "snapshot/snapshot.h"

static void blank(uintptr_t lo, uintptr_t hi)
{
    const uintptr_t page = TAG_PAGE_SIZE;
    uintptr_t first = (lo + page - 1) & ~(page - 1), last = hi & ~(page - 1);
    if (first >= last) {
        memset((void *)lo, 0, hi - lo);
        return;
    }
    memset((void *)lo, 0, first - lo);
    if (madvise((void *)first, last - first, MADV_DONTNEED) != 0)
        memset((void *)first, 0, last - first);
    memset((void *)last, 0, hi - last);
}

/* Blank the payload of the block whose slot starts at slot, if it holds
 * one (a forward record leads to an aligned block's tag). */
static void redact_slot(uint64_t slot, uint64_t end)
{
    uint64_t at = _tag_slot_tag(slot, end);
    const struct libtag_tag *t = (const struct libtag_tag *)(uintptr_t)at;
    if (!at || !_tag_valid_at(at, t))
        return;
    uint64_t user = at + sizeof *t, size = _tag_size(t);
    if (size && size <= end - user)
        blank((uintptr_t)user, (uintptr_t)(user + size));
}

/* Every block of the heap, by its spans (tag_abi.h, "heap"), and every
 * live guarded one, by its slot record. */
void _tag_redact_payloads(void)
{
    uint64_t used = _tag_heap.used;
    for (uint64_t i = 0; i < used;) {
        const struct tag_slice *s = &_tag_heap.meta[i];
        uint64_t n = s->slices ? s->slices : 1;
        uint64_t start = _tag_heap.base + i * TAG_HEAP_SLICE, end = start + n * TAG_HEAP_SLICE;
        if (s->kind == TAG_SPAN_SMALL)
            for (uint32_t k = 0; k < s->carved; k++)
                redact_slot(start + (uint64_t)k * s->block_size,
                            start + (uint64_t)(k + 1) * s->block_size);
        else if (s->kind == TAG_SPAN_LARGE)
            redact_slot(start + s->block_off, end);
        i += n;
    }
    /* guarded blocks: the pool is readable whole by now (the snapshot
     * child opened it, _tag_guard_expose) */
    const struct libtag_guard_slot *g = (const struct libtag_guard_slot *)(uintptr_t)_tag_ctl.guard_slots;
    for (uint32_t i = 0; g && i < _tag_ctl.guard_used; i++) {
        uint32_t state = g[i].state;
        if ((state == TAG_GUARD_LIVE || state == TAG_GUARD_FREED) && g[i].user) {
            uint64_t size = tag_size_field(&g[i].tag);
            if (size && size < TAG_SIZE_BIG)
                blank((uintptr_t)g[i].user, (uintptr_t)(g[i].user + size));
        }
    }
    _tag_ctl.options |= TAG_OPTION_NO_PAYLOAD;
}
