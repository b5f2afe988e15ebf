/* libtag.h - the public API of libtag, the tagging allocator of forensics.
 *
 * Nothing here is needed to use libtag: LD_PRELOAD=libtag.so (or linking
 * libtag.a) tags every heap block.  These calls let a program ask for a
 * snapshot itself or read libtag's counters.
 */
#ifndef LIBTAG_H
#define LIBTAG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct libtag_stats {
    uint64_t allocs;          /* allocations since start */
    uint64_t frees;           /* frees since start (blocks into quarantine) */
    uint64_t live_blocks;     /* allocs - frees */
    uint64_t live_bytes;      /* requested bytes of live blocks */
    uint32_t stack_count;     /* interned stack nodes, root included */
    uint32_t thread_count;    /* threads that ever used libtag */
    uint64_t stack_full;      /* captures that found the stack table full */
    uint64_t shadow_overflows;/* shadow-stack pushes beyond the depth bound */
    uint32_t anomalies;       /* anomalies detected */
    uint32_t snapshots;       /* snapshots taken */
};

/* Fill *out with libtag's counters (a racy but consistent-enough sum). */
void libtag_stats(struct libtag_stats *out);

/* The stack table id of the calling thread's current stack (0 = none). */
uint32_t libtag_current_stack(void);

/* Address of the control block (struct libtag_control in tag_abi.h). */
const void *libtag_control(void);

/* Take a snapshot now (fork + core of the child); returns 0 or -errno.
 * Async-signal-safe. */
int libtag_snapshot(void);

#ifdef __cplusplus
}
#endif

#endif /* LIBTAG_H */
