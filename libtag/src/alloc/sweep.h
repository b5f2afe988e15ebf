/* sweep.h - the sweep (sweep.c): a thread's recent allocations, their
 * tags and canaries checked every LIBTAG_SWEEP hook calls. */
#ifndef LIBTAG_SWEEP_H
#define LIBTAG_SWEEP_H

#include "base/base.h"
#include "stacks/thread.h"

#define TAG_SWEEP_RECENT 64  /* allocations a thread remembers */
void _tag_sweep_remember(struct tag_thread_state *t, void *user);
/* Check the recent blocks' tags and canaries; reports heap-overflow and
 * heap-underflow anomalies. */
TAG_COLD void _tag_sweep(struct tag_thread_state *t, void *ret, void *frame);

#endif /* LIBTAG_SWEEP_H */
