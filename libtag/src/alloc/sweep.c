/* sweep.c - catch a heap overflow or underflow before the block is freed.
 *
 * free() and realloc() check a block's tag and canary, but a block that is
 * never freed (or freed much later) would hide its damage until then.  So
 * each thread remembers its last TAG_SWEEP_RECENT allocations, and every
 * LIBTAG_SWEEP instrumented function entries - and once more when the
 * thread or the process exits - it checks their tags and canaries.
 *
 * The blocks may have been freed and handed out again since.  They all
 * lie in libtag's heap (heap.c), whose used part stays mapped read-write
 * for the life of the process: so their tags and canaries are read with
 * plain loads, no system call.  A remembered block outside the heap (none
 * today; the code stays for whatever remembers one) may be unmapped: it is
 * read with the probe (prim.c: a load that may fault, recovered by
 * libtag's SIGSEGV/SIGBUS handler) where that is safe (_tag_probe_safe),
 * otherwise one process_vm_readv() on our own pid copies instead
 * (_tag_copy_own: an unmapped block shortens that copy; where the kernel
 * refuses the call - a seccomp filter - those blocks are skipped).  A
 * probe and its signal-mask system call for every block made the sweep a
 * few percent of an instrumented run: docs/design.md, "The sweep: tags
 * read in place".
 *
 * Runs in the program's normal context (a trace hook), never in a signal
 * handler, so reporting an anomaly from here is allowed.
 */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>

#include "base/base.h"
#include "base/control.h"
#include "base/prim.h"
#include "heap/heap.h"
#include "stacks/thread.h"
#include "alloc/anomaly.h"
#include "alloc/damage.h"
#include "alloc/sweep.h"
#include "alloc/tag.h"

/* Is [p, p + n) in the part of libtag's heap that is in use?  That memory
 * stays mapped read-write for the life of the process (heap.c never
 * decommits; a free span is only madvised, which reads back as zeros), so
 * it is read with plain loads: no probe, no system call. */
TAG_INLINE int in_heap(const void *p, size_t n)
{
    return _tag_heap_has(p) && _tag_heap_has((const char *)p + n - 1);
}

/* Copy n iovecs of our own memory, each at least 8 bytes: from the heap
 * directly, the rest with the probe (where _tag_probe_safe() allows it: asked
 * once a sweep, in *probe, -1 until then) or _tag_copy_own.  One that
 * could not be read gets local iov_len 0. */
static void read_own(struct tag_thread_state *t, struct iovec *local, struct iovec *remote, unsigned n,
                     int *probe)
{
    for (unsigned i = 0; i < n; i++) {
        const char *src = remote[i].iov_base;
        char *dst = local[i].iov_base;
        size_t len = remote[i].iov_len;
        TAG_ASSERT(len >= 8);
        if (TAG_LIKELY(in_heap(src, len))) {
            /* the two sizes a sweep reads, as fixed-size copies (inline) */
            if (len == sizeof(struct libtag_tag))
                memcpy(dst, src, sizeof(struct libtag_tag));
            else if (len == 8)
                memcpy(dst, src, 8);
            else
                memcpy(dst, src, len);
            continue;
        }
        /* Outside the heap: nothing libtag's allocation path remembers
         * today, kept safe for whatever does (it may be unmapped).  One at
         * a time, no arrays: a sweep runs on small thread stacks too. */
        if (*probe < 0)
            *probe = _tag_probe_safe();
        if (!*probe) {
            if (_tag_copy_own_refused || _tag_copy_own(&local[i], &remote[i], 1) != 1)
                local[i].iov_len = 0;
            continue;
        }
        uint32_t was = t->probing;
        t->probing = 1;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        for (size_t off = 0; off < len; off += 8) {
            size_t w = off + 8 <= len ? off : len - 8;  /* the last word may overlap */
            if (_tag_probe_word(src + w, (uint64_t *)(void *)(dst + w))) {
                local[i].iov_len = 0;
                break;
            }
        }
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        t->probing = was;
    }
}

void _tag_sweep_remember(struct tag_thread_state *t, void *user)
{
    t->recent[t->recent_next++ % TAG_SWEEP_RECENT] = user;
}

_Static_assert(TAG_SWEEP_RECENT == 64, "_tag_sweep hashes addresses to 7 bits");

/* The whole check: every remembered block read through read_own (inside
 * libtag's heap or not), once each, damage recovered and reported. */
static TAG_NOINLINE void sweep_full(struct tag_thread_state *t, void *ret, void *frame)
{
    struct libtag_tag tags[TAG_SWEEP_RECENT];
    uint64_t canaries[TAG_SWEEP_RECENT];
    struct iovec local[2 * TAG_SWEEP_RECENT], remote[2 * TAG_SWEEP_RECENT];
    void *which[TAG_SWEEP_RECENT];
    unsigned n = 0;
    int saved = errno;
    int probe = -1;  /* asked when a block outside the heap needs it */

    /* pass 1: the tags */
    uint8_t seen[2 * TAG_SWEEP_RECENT];  /* which[] index + 1 by address hash */
    uint8_t slot[TAG_SWEEP_RECENT];      /* which[k] is t->recent[slot[k]] */
    memset(seen, 0, sizeof seen);
    for (unsigned i = 0; i < TAG_SWEEP_RECENT; i++) {
        void *user = t->recent[i];
        if (!user)
            continue;
        /* once each: a block freed and its memory handed out again (a
         * large block's span, split for small blocks) is remembered twice
         * at one address, and would be reported twice; the second slot is
         * dropped (a hash of the address, not a scan: 64 x 64 compares were
         * most of a sweep) */
        unsigned h = (unsigned)((((uintptr_t)user >> 4) * TAG_MIX1) >> 57);
        while (seen[h] && which[seen[h] - 1] != user)
            h = (h + 1) & (2 * TAG_SWEEP_RECENT - 1);
        if (seen[h]) {
            t->recent[i] = NULL;
            continue;
        }
        seen[h] = (uint8_t)(n + 1);
        slot[n] = (uint8_t)i;
        which[n] = user;
        local[n] = (struct iovec){&tags[n], sizeof tags[n]};
        remote[n] = (struct iovec){_tag_of(user), sizeof tags[n]};
        n++;
    }
    read_own(t, local, remote, n, &probe);
    /* pass 2: the canaries of blocks whose tag is live and sound */
    unsigned m = 0;
    unsigned idx[TAG_SWEEP_RECENT];
    for (unsigned i = 0; i < n; i++) {
        struct libtag_tag *tag = &tags[i];
        uint64_t addr = (uint64_t)(uintptr_t)_tag_of(which[i]);
        int sound = local[i].iov_len != 0 && _tag_valid_at(addr, tag);
        if (!sound || _tag_state(tag) != TAG_STATE_LIVE) {
            /* freed, recycled or gone: forget it - unless it is a tag
             * that a write from below (or an overflow of the block before
             * it) damaged, which is reported now, while it lives */
            if (!sound && local[i].iov_len != 0 && tag->bits != 0 &&
                _tag_recover(addr, tag) && _tag_state(tag) == TAG_STATE_LIVE)
                _tag_damaged(which[i], NULL, ret, frame);
            t->recent[slot[i]] = NULL;  /* forget it */
            continue;
        }
        if (tag_size_field(tag) == TAG_SIZE_BIG) {
            /* its size is in its large span's entry, which another thread
             * may be releasing as we look: its own free checks it */
            continue;
        }
        idx[m] = i;
        local[m] = (struct iovec){&canaries[m], sizeof canaries[m]};
        remote[m] = (struct iovec){(char *)which[i] + _tag_size_at(addr, tag), sizeof canaries[m]};
        m++;
    }
    read_own(t, local, remote, m, &probe);
    for (unsigned j = 0; j < m; j++) {
        void *user = which[idx[j]];
        uint64_t want = tag_canary_value((uint64_t)(uintptr_t)_tag_of(user), _tag_ctl.secret);
        if (local[j].iov_len != 0 && canaries[j] != want) {
            t->recent[slot[idx[j]]] = NULL;  /* forget it */
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
                .address = (char *)user + _tag_size_at((uint64_t)(uintptr_t)_tag_of(user), tag) + first,
                .block = user,
                .tag = tag,
            };
            _tag_anomaly(&r, ret, frame);
        }
    }
    errno = saved;
}

/* The usual sweep: every remembered block in libtag's heap, read in place,
 * its tag sound - freed since (forgotten) or live with its canary intact.
 * Anything else (a block outside the heap, a tag that does not validate, a
 * canary written over) is sweep_full's, which reads them all again and
 * reports.  Reading in place, not through copies, is what keeps the usual
 * sweep cheap. */
void _tag_sweep(struct tag_thread_state *t, void *ret, void *frame)
{
    for (unsigned i = 0; i < TAG_SWEEP_RECENT; i++) {
        void *user = t->recent[i];
        if (!user)
            continue;
        struct libtag_tag *tp = _tag_of(user), tag;
        uint64_t addr = (uint64_t)(uintptr_t)tp, word;
        if (!in_heap(tp, sizeof tag))
            goto full;
        memcpy(&tag, tp, sizeof tag);  /* one read: the owner may free it now */
        if (!_tag_valid_at(addr, &tag))
            goto full;
        if (_tag_state(&tag) != TAG_STATE_LIVE) {
            t->recent[i] = NULL;  /* freed or recycled: forget it */
            continue;
        }
        if (tag_size_field(&tag) == TAG_SIZE_BIG)
            continue;  /* as sweep_full: its own free checks it */
        const char *canary = (const char *)user + _tag_size_at(addr, &tag);
        if (!in_heap(canary, sizeof word))
            goto full;
        memcpy(&word, canary, sizeof word);
        if (word != tag_canary_value(addr, _tag_ctl.secret))
            goto full;
    }
    return;
full:
    sweep_full(t, ret, frame);
}
