/* maps.c - libtag's one reader of /proc/self/maps (the core writer and
 * the payload redaction walk it), and the read-only open of /proc files
 * both use.  A primitive: it calls no other libtag file, so the core
 * writer's test builds it with corewrite.c alone (tests/integration/
 * test_corewrite.py).
 *
 * Async-signal-safe: no locks, no malloc, no stdio.  One static read
 * window, so one walk at a time (its callers run in the snapshot's fork
 * child, which is single-threaded).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "base/prim.h"

/* /proc/self/maps is read through this window; a longer line is dropped. */
#define TAG_MAPS_WINDOW (64u << 10)
static char window[TAG_MAPS_WINDOW];

int _tag_proc_open(const char *path)
{
    int fd;

    do
        fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    return fd;
}

static const char *parse_hex(const char *p, const char *end, uint64_t *v)
{
    uint64_t x = 0;

    for (; p < end; p++) {
        unsigned d;
        if (*p >= '0' && *p <= '9')
            d = (unsigned)(*p - '0');
        else if (*p >= 'a' && *p <= 'f')
            d = (unsigned)(*p - 'a' + 10);
        else
            break;
        x = x << 4 | d;
    }
    *v = x;
    return p;
}

static const char *skip_field(const char *p, const char *end)
{
    while (p < end && *p != ' ')
        p++;
    while (p < end && *p == ' ')
        p++;
    return p;
}

/* One line of /proc/self/maps (no newline):
 *   start-end perms offset dev inode [spaces path]
 * Returns 0, or -1 for a line that does not parse. */
static int parse_map_line(const char *p, size_t len, struct tag_maps_line *l)
{
    const char *end = p + len;

    p = parse_hex(p, end, &l->start);
    if (p >= end || *p != '-')
        return -1;
    p = parse_hex(p + 1, end, &l->end);
    if (p + 5 > end || *p != ' ' || l->end <= l->start)
        return -1;
    p++;
    memcpy(l->perms, p, sizeof l->perms);
    p = skip_field(p, end);
    p = parse_hex(p, end, &l->offset);
    p = skip_field(p, end);     /* past offset's trailing space */
    p = skip_field(p, end);     /* dev */
    for (l->inode = 0; p < end && *p >= '0' && *p <= '9'; p++)
        l->inode = l->inode * 10 + (uint64_t)(*p - '0');
    p = skip_field(p, end);     /* the padding after the inode */
    l->path = p;
    l->plen = (size_t)(end - p);
    return 0;
}

int _tag_maps_each(void (*fn)(const struct tag_maps_line *, void *), void *ctx)
{
    size_t have = 0;
    int skipping = 0;
    int fd = _tag_proc_open("/proc/self/maps");
    struct tag_maps_line line;

    if (fd < 0)
        return errno ? -errno : -EIO;
    for (;;) {
        ssize_t r = read(fd, window + have, sizeof window - have);
        char *p, *end, *nl;

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            /* A read error ends the list early: the lines so far stand. */
            if (have && !skipping && parse_map_line(window, have, &line) == 0)
                fn(&line, ctx);
            break;
        }
        have += (size_t)r;
        p = window;
        end = window + have;
        while ((nl = memchr(p, '\n', (size_t)(end - p))) != NULL) {
            if (!skipping && parse_map_line(p, (size_t)(nl - p), &line) == 0)
                fn(&line, ctx);
            skipping = 0;
            p = nl + 1;
        }
        have = (size_t)(end - p);
        memmove(window, p, have);
        if (have == sizeof window) {      /* one line fills the window */
            skipping = 1;
            have = 0;
        }
    }
    close(fd);
    return 0;
}
