/* sweep.c - catch a heap overflow or underflow before the block is freed.
 *
 * free() and realloc() check a block's tag and canary, but a block that is
 * never freed (or freed much later) would hide its damage until then.  So
 * each thread remembers its last TAG_SWEEP_RECENT allocations, and every
 * LIBTAG_SWEEP instrumented function entries - and once more when the
 * thread or the process exits - it checks their tags and canaries.
 *
 * The blocks may have been freed and handed back to glibc since - even
 * unmapped (large chunks are munmap'ed on free).  So the sweep never touches
 * them directly: one process_vm_readv() on our own pid copies every tag and
 * canary into a local buffer, and an unmapped block only shortens the copy.
 * Where the kernel refuses that call (a seccomp filter), the sweep turns
 * itself off.
 *
 * Runs in the program's normal context (a trace hook), never in a signal
 * handler, so reporting an anomaly from here is allowed.
 */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "libtag_internal.h"

static int sweep_off;  /* the kernel refused process_vm_readv */

void _tag_sweep_remember(struct tag_tls *t, void *user)
{
    t->recent[t->recent_next++ % TAG_SWEEP_RECENT] = user;
}

static void forget(struct tag_tls *t, const void *user)
{
    for (unsigned k = 0; k < TAG_SWEEP_RECENT; k++)
        if (t->recent[k] == user)
            t->recent[k] = NULL;
}

unsigned _tag_copy_own(struct iovec *local, struct iovec *remote, unsigned n)
{
    unsigned done = 0;
    pid_t pid = getpid();
    while (done < n) {
        ssize_t got = process_vm_readv(pid, local + done, n - done, remote + done, n - done, 0);
        if (got < 0) {
            if (errno == EPERM || errno == ENOSYS)
                sweep_off = 1;
            return done;
        }
        /* whole iovecs copied; the next one faulted (or all are done) */
        while (done < n && (size_t)got >= remote[done].iov_len) {
            got -= (ssize_t)remote[done].iov_len;
            done++;
        }
        if (done < n) {
            /* mark the faulting one as unreadable and go on after it */
            local[done].iov_len = 0;
            done++;
        }
    }
    return done;
}

void _tag_sweep(struct tag_tls *t, void *ret, void *frame)
{
    if (sweep_off)
        return;
    struct libtag_tag tags[TAG_SWEEP_RECENT];
    uint64_t canaries[TAG_SWEEP_RECENT];
    struct iovec local[2 * TAG_SWEEP_RECENT], remote[2 * TAG_SWEEP_RECENT];
    void *which[TAG_SWEEP_RECENT];
    unsigned n = 0;
    int saved = errno;

    /* pass 1: the tags */
    for (unsigned i = 0; i < TAG_SWEEP_RECENT; i++) {
        void *user = t->recent[i];
        if (!user)
            continue;
        which[n] = user;
        local[n] = (struct iovec){&tags[n], sizeof tags[n]};
        remote[n] = (struct iovec){_tag_of(user), sizeof tags[n]};
        n++;
    }
    _tag_copy_own(local, remote, n);
    /* pass 2: the canaries of blocks whose tag is live and sound */
    unsigned m = 0;
    unsigned idx[TAG_SWEEP_RECENT];
    for (unsigned i = 0; i < n; i++) {
        struct libtag_tag *tag = &tags[i];
        uint64_t addr = (uint64_t)(uintptr_t)_tag_of(which[i]);
        int sound = local[i].iov_len != 0 && _tag_valid_at(addr, tag);
        if (!sound || _tag_state(tag) != TAG_STATE_LIVE) {
            /* freed, recycled or gone: forget it - unless its magic
             * survived a write from below (or an overflow of the block
             * before it), which is reported now, while it lives */
            if (!sound && local[i].iov_len != 0 && tag->magic == TAG_MAGIC &&
                _tag_recover(addr, tag) && _tag_state(tag) == TAG_STATE_LIVE)
                _tag_damaged(which[i], NULL, ret, frame);
            forget(t, which[i]);
            continue;
        }
        idx[m] = i;
        local[m] = (struct iovec){&canaries[m], sizeof canaries[m]};
        remote[m] = (struct iovec){(char *)which[i] + _tag_size(tag), sizeof canaries[m]};
        m++;
    }
    _tag_copy_own(local, remote, m);
    for (unsigned j = 0; j < m; j++) {
        void *user = which[idx[j]];
        uint64_t want = tag_canary_value((uint64_t)(uintptr_t)_tag_of(user), _tag_ctl.secret);
        if (local[j].iov_len != 0 && canaries[j] != want) {
            forget(t, user);
            struct libtag_tag *tag = &tags[idx[j]];
            if (_tag_reported(tag))
                continue;
            /* marked first: report it once, not again at free; and keep it
             * from glibc when freed (its next chunk's header may be hit) */
            _tag_set_bits(user, 0, TAG_FLAG_REPORTED);
            unsigned first = 0;
            while (first < TAG_CANARY_SIZE - 1 &&
                   (unsigned char)(canaries[j] >> (8 * first)) == (unsigned char)(want >> (8 * first)))
                first++;
            struct tag_report r = {
                .kind = TAG_ANOMALY_HEAP_OVERFLOW,
                .address = (char *)user + _tag_size(tag) + first,
                .block = user,
                .tag = tag,
            };
            _tag_anomaly(&r, ret, frame);
        }
    }
    errno = saved;
}
