/* quarantine.c - freed blocks wait here before the real allocator gets them.
 *
 * While a block waits, its tag says "freed", its free record says who freed
 * it, and its payload holds a pattern: a reader can answer "freed by whom"
 * for a dangling pointer, a second free() is a certain double free, and a
 * changed pattern at eviction is a write after free.  Each thread has its
 * own ring (mapped by libtag, not malloc'd) with a byte budget
 * (LIBTAG_QUARANTINE per thread), so free() takes no shared lock.
 */
#include <sys/mman.h>

#include "libtag_internal.h"

#define RING_SLOTS TAG_QUARANTINE_SLOTS

struct tag_quarantine {
    uint32_t head, count;     /* oldest entry, entries held */
    uint64_t bytes;           /* requested bytes held */
    void *ring[RING_SLOTS];
};

_Static_assert(sizeof(struct tag_quarantine) == TAG_QUARANTINE_BYTES,
               "readers skip TAG_QUARANTINE_BYTES at each ring");

void _tag_real_release(void *user)
{
    struct libtag_tag *t = _tag_of(user);
    /* glibc overwrites the first 16 bytes of the chunk with its free-list
     * links, which kills the tag of a plain block - but an aligned block's
     * tag sits pad bytes further in and would survive in free memory as a
     * valid-looking freed tag.  Clear the magic first. */
    char *raw = (char *)t - t->pad;
    t->magic = 0;
    __libc_free(raw);
}

static void evict_one(struct tag_tls *t, struct tag_quarantine *q)
{
    void *user = q->ring[q->head];
    q->head = (q->head + 1) % RING_SLOTS;
    q->count--;
    q->bytes -= _tag_size(_tag_of(user));
    if (TAG_UNLIKELY(!_tag_freed_intact(user)))
        _tag_anomaly(TAG_ANOMALY_USE_AFTER_FREE, user, user,
                     __builtin_return_address(0), __builtin_frame_address(0));
    (void)t;
    _tag_real_release(user);
}

static struct tag_quarantine *ring_of(struct tag_tls *t)
{
    if (TAG_UNLIKELY(t->quarantine == NULL)) {
        void *p = _tag_map(sizeof(struct tag_quarantine), 0);
        if (p == NULL)
            return NULL;
        t->quarantine = p;
        t->rec->quarantine = (uint64_t)(uintptr_t)p;  /* readers skip it */
    }
    return t->quarantine;
}

void _tag_quarantine_put(struct tag_tls *t, void *user)
{
    uint64_t size = _tag_size(_tag_of(user));
    struct tag_quarantine *q;
    if (t->exiting || size > _tag_opt.quarantine_bytes || !(q = ring_of(t))) {
        _tag_real_release(user);
        return;
    }
    while (q->count == RING_SLOTS || (q->count && q->bytes + size > _tag_opt.quarantine_bytes))
        evict_one(t, q);
    q->ring[(q->head + q->count) % RING_SLOTS] = user;
    q->count++;
    q->bytes += size;
}

/* Called once, when the thread exits (thread.c sets t->exiting right after,
 * so later frees of this thread bypass the quarantine).  The ring is mapped
 * per thread: unmap it too, or every thread that ever freed a block leaks
 * its 36 KiB ring and a program that runs many short threads grows without
 * bound. */
void _tag_quarantine_drain(struct tag_tls *t)
{
    struct tag_quarantine *q = t->quarantine;
    while (q && q->count)
        evict_one(t, q);
    if (q) {
        t->quarantine = NULL;
        t->rec->quarantine = 0;
        _tag_unmap(q, sizeof *q);
    }
}
