/* anomaly.h - what the allocator's checks found (anomaly.c): recorded in
 * the control block, logged, and acted on as LIBTAG_ON_ANOMALY says. */
#ifndef LIBTAG_ANOMALY_H
#define LIBTAG_ANOMALY_H

#include <stdint.h>
#include "base/base.h"

/* What an anomaly is about (see struct libtag_anomaly for each kind). */
struct tag_report {
    uint32_t kind;                      /* enum libtag_anomaly_kind */
    uint32_t dealloc;                   /* mismatch: the expected alloc kind */
    const void *address;
    const void *block;                  /* NULL = none */
    const struct libtag_tag *tag;       /* copied; NULL = block's own tag */
    const struct libtag_free_rec *rec;  /* copied; NULL = none */
    uint32_t access;                    /* a fault: TAG_ACCESS_*; else 0 */
    const void *pc;                     /* a fault: the faulting instruction */
};

/* Record an anomaly and act on LIBTAG_ON_ANOMALY.  Returns when the faulty
 * operation should be skipped; does not return with abort. */
TAG_COLD void _tag_anomaly(const struct tag_report *r, void *ret, void *frame);
/* Record an anomaly detected at stack, log it, and take the snapshot that
 * LIBTAG_ON_ANOMALY=snapshot or abort asks for; returns in every mode (the
 * caller acts on abort).  Async-signal-safe: a fault handler calls it. */
TAG_COLD void _tag_anomaly_at(const struct tag_report *r, uint32_t stack);
/* Fill the control block's anomaly record from r (the one writer of it:
 * the caller owns the record - the anomaly lock, or the stopped world of a
 * snapshot). */
TAG_COLD void _tag_anomaly_record(const struct tag_report *r, uint32_t tid, uint32_t stack,
                                  uint32_t time);
/* The process is about to die of LIBTAG_ON_ANOMALY=abort after its
 * snapshot: no second core (the soft core limit of this process goes to
 * 0).  Async-signal-safe. */
void _tag_anomaly_no_core(void);
/* "double-free", ... as in the snapshot directory names and the JSON. */
const char *_tag_anomaly_name(uint32_t kind);
/* Report the release of the live block ptr by a function expecting dealloc,
 * when _tag_cxx_checked calls it a mismatch. */
TAG_COLD void _tag_report_mismatch(void *ptr, uint32_t dealloc, void *ret, void *frame);

/* Called up: an anomaly takes a snapshot (snapshot/snapshot.c, a folder
 * above); the reason is a TAG_REASON_*. */
TAG_COLD int _tag_snapshot(uint32_t reason);

#endif /* LIBTAG_ANOMALY_H */
