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

#include "libtag_internal.h"

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

/* Blank the payloads of the tagged blocks in [lo, hi). */
static void redact_region(uintptr_t lo, uintptr_t hi)
{
    uint64_t secret = _tag_ctl.secret;
    for (uintptr_t a = (lo + 15) & ~15ul; a + sizeof(struct libtag_tag) + TAG_MIN_PAYLOAD <= hi; a += 16) {
        const struct libtag_tag *t = (const struct libtag_tag *)a;
        if (t->magic != TAG_MAGIC || t->check != tag_check_value(a, secret, t))
            continue;
        uint32_t state = _tag_state(t);
        uintptr_t user = a + sizeof *t;
        uint64_t size = _tag_size(t);
        if ((state != TAG_STATE_LIVE && state != TAG_STATE_FREED) || size > hi - user)
            continue;
        if (size)
            blank(user, user + size);
        a = ((user + size) & ~15ul) - 16;  /* go on after the payload */
    }
}

/* The ranges to walk: anonymous private writable memory (inode 0), where
 * blocks live; a private file mapping can fault (SIGBUS past the file's
 * end) and holds no heap anyway.  Collected first: blanking does not change
 * the mappings, but reading maps while walking them costs nothing to avoid. */
static uintptr_t ranges[8192][2];
static unsigned nranges;

static void note_range(const struct tag_maps_line *l, void *ctx)
{
    (void)ctx;
    if (l->perms[0] == 'r' && l->perms[1] == 'w' && l->perms[3] == 'p' && l->inode == 0 &&
        nranges < sizeof ranges / sizeof ranges[0]) {
        ranges[nranges][0] = (uintptr_t)l->start;
        ranges[nranges][1] = (uintptr_t)l->end;
        nranges++;
    }
}

void _tag_redact_payloads(void)
{
    nranges = 0;
    if (_tag_maps_each(note_range, NULL) < 0)
        return;
    uintptr_t own[2][2] = {
        {(uintptr_t)_tag_ctl.stack_nodes,
         (uintptr_t)_tag_ctl.stack_nodes + (uintptr_t)_tag_ctl.stack_capacity * 16u},
        {(uintptr_t)_tag_ctl.threads,
         (uintptr_t)_tag_ctl.threads + (uintptr_t)_tag_ctl.thread_capacity * sizeof(struct libtag_thread)},
    };
    for (unsigned i = 0; i < nranges; i++) {
        int mine = 0;
        for (int k = 0; k < 2; k++)
            mine |= ranges[i][0] < own[k][1] && own[k][0] < ranges[i][1];
        if (!mine)  /* libtag's tables hold no blocks: do not walk them */
            redact_region(ranges[i][0], ranges[i][1]);
    }
    _tag_ctl.options |= TAG_OPTION_NO_PAYLOAD;
}
