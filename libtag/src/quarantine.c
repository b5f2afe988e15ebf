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

#define RING_SLOTS 4096u

struct tag_quarantine {
    uint32_t head, count;     /* oldest entry, entries held */
    uint64_t bytes;           /* requested bytes held */
    void *ring[RING_SLOTS];
};

void _tag_real_release(void *user)
{
    struct libtag_tag *t = _tag_of(user);
    __libc_free((char *)t - t->pad);
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
        void *p = mmap(NULL, sizeof(struct tag_quarantine), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        t->quarantine = p;
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

void _tag_quarantine_drain(struct tag_tls *t)
{
    struct tag_quarantine *q = t->quarantine;
    while (q && q->count)
        evict_one(t, q);
}
