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
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "libtag_internal.h"

#define PAGE 4096ul

static void blank(uintptr_t lo, uintptr_t hi)
{
    uintptr_t first = (lo + PAGE - 1) & ~(PAGE - 1), last = hi & ~(PAGE - 1);
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

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

void _tag_redact_payloads(void)
{
    static char buf[65536];
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    /* Read it all first: blanking does not change the mappings, but reading
     * maps while walking them costs nothing to avoid. */
    static uintptr_t ranges[8192][2];
    unsigned n = 0;
    size_t have = 0;
    for (;;) {
        ssize_t got = read(fd, buf + have, sizeof buf - 1 - have);
        if (got <= 0 && have == 0)
            break;
        if (got > 0)
            have += (size_t)got;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = memchr(line, '\n', have - (size_t)(line - buf))) != NULL) {
            /* "start-end perms offset dev inode path" */
            uintptr_t lo = 0, hi = 0;
            char *p = line;
            int v;
            while ((v = hexval(*p)) >= 0)
                lo = lo << 4 | (uintptr_t)v, p++;
            if (*p == '-')
                p++;
            while ((v = hexval(*p)) >= 0)
                hi = hi << 4 | (uintptr_t)v, p++;
            /* perms, then offset, device, inode: blocks live in anonymous
             * private memory (inode 0); a private file mapping can fault
             * (SIGBUS past the file's end) and holds no heap anyway */
            int rw_private = *p == ' ' && p[1] == 'r' && p[2] == 'w' && p[4] == 'p';
            int field = 0;
            unsigned long inode = 0;
            for (p++; *p && *p != '\n' && field < 4; p++) {
                if (*p == ' ') {
                    while (p[1] == ' ')
                        p++;
                    field++;
                } else if (field == 3 && *p >= '0' && *p <= '9') {
                    inode = inode * 10 + (unsigned long)(*p - '0');
                }
            }
            if (rw_private && inode == 0 && n < 8192) {
                ranges[n][0] = lo;
                ranges[n][1] = hi;
                n++;
            }
            line = nl + 1;
        }
        size_t rest = have - (size_t)(line - buf);
        memmove(buf, line, rest);
        have = rest;
        if (got <= 0)
            break;
    }
    close(fd);
    uintptr_t own[2][2] = {
        {(uintptr_t)_tag_ctl.stack_nodes,
         (uintptr_t)_tag_ctl.stack_nodes + (uintptr_t)_tag_ctl.stack_capacity * 16u},
        {(uintptr_t)_tag_ctl.threads,
         (uintptr_t)_tag_ctl.threads + (uintptr_t)_tag_ctl.thread_capacity * sizeof(struct libtag_thread)},
    };
    for (unsigned i = 0; i < n; i++) {
        int mine = 0;
        for (int k = 0; k < 2; k++)
            mine |= ranges[i][0] < own[k][1] && own[k][0] < ranges[i][1];
        if (!mine)  /* libtag's tables hold no blocks: do not walk them */
            redact_region(ranges[i][0], ranges[i][1]);
    }
    _tag_ctl.options |= TAG_OPTION_NO_PAYLOAD;
}
