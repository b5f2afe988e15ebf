/* options.h - LIBTAG_* from the environment (options.c): what each part
 * reads from _tag_opt, the defaults and the bounds the parser applies. */
#ifndef LIBTAG_OPTIONS_H
#define LIBTAG_OPTIONS_H

#include <stdint.h>
#include "base/base.h"

enum tag_on_anomaly { TAG_ON_SNAPSHOT = 0, TAG_ON_ABORT = 1, TAG_ON_IGNORE = 2 };
enum tag_core_path { TAG_CORE_AUTO = 0, TAG_CORE_KERNEL = 1, TAG_CORE_SELF = 2 };
/* LIBTAG_UNWIND: where stacks come from (stacks/unwind.c). */
enum tag_unwind { TAG_UNWIND_AUTO = 0, TAG_UNWIND_SHADOW = 1, TAG_UNWIND_FP = 2, TAG_UNWIND_CFI = 3 };

/* The bytes of a freed block's payload, from offset 0, patterned and
 * checked in the quarantine (LIBTAG_QUARANTINE_FILL): a write after free
 * anywhere in a block of up to 4 KiB is seen.  docs/design.md, "The
 * quarantine", states the cost. */
#define TAG_QUARANTINE_DEFAULT_FILL 4096u

/* The guard pool (guard.c): the default rate, one allocation in this many;
 * the default caps, in slots, at a sampling rate and at rate 1; and the
 * largest cap LIBTAG_GUARD_SLOTS takes.  docs/design.md states the cost. */
#define TAG_GUARD_DEFAULT_RATE  5000u
#define TAG_GUARD_SAMPLED_SLOTS 256u
/* ... which a sampling rate's pool uses before it reuses slots, and grows
 * past, up to this cap (and the window: guard.c), only when each slot
 * holds a live block; first-of-site blocks hold at most half of
 * TAG_GUARD_SAMPLED_SLOTS at once. */
#define TAG_GUARD_SAMPLED_CAP   2048u
/* ... and the first this many allocations of every allocation stack (a
 * site) are guarded too (LIBTAG_GUARD_SITES). */
#define TAG_GUARD_DEFAULT_SITES 1u
#define TAG_GUARD_MAX_SLOTS     (1u << 18)
#define TAG_GUARD_ALL_SLOTS     TAG_GUARD_MAX_SLOTS
/* Bytes of one slot: blocks up to this minus their tag are guarded. */
#define TAG_GUARD_SLOT_SIZE     (4u * TAG_PAGE_SIZE)

struct tag_options {
    int on_anomaly;              /* enum tag_on_anomaly */
    int core_path;               /* enum tag_core_path */
    int signal;                  /* snapshot signal, 0 = none */
    int quiet;                   /* LIBTAG_QUIET=1: no log lines but the stats */
    int log;                     /* enum tag_log: where log lines go */
    int at_exit;                 /* enum tag_at_exit */
    int stats;                   /* print counters at exit */
    int stack_stats;             /* LIBTAG_STACK_STATS: per-stack counters */
    int omit_payload;            /* LIBTAG_PAYLOAD=omit */
    int unwind;                  /* enum tag_unwind */
    uint32_t fp_depth;           /* depth bound of fp and CFI walks */
    uint32_t stack_nodes;        /* stack table capacity */
    uint64_t quarantine_bytes;   /* per-thread quarantine budget */
    uint32_t quarantine_fill;    /* payload bytes patterned when freed */
    uint32_t sweep_every;        /* hook calls between heap sweeps, 0 = off */
    uint32_t guard_rate;         /* LIBTAG_GUARD_RATE: 1 in N guarded, 0 = off */
    uint32_t guard_slots;        /* LIBTAG_GUARD_SLOTS: the pool's cap, 0 = by rate */
    uint32_t guard_sites;        /* LIBTAG_GUARD_SITES: a stack's first N guarded */
    char dir[512];               /* snapshot directory, "" = cwd */
    char log_path[512];          /* LIBTAG_LOG=PATH: lines go to PATH.<pid> */
};
enum tag_log { TAG_LOG_STDERR, TAG_LOG_PATH, TAG_LOG_OFF };
enum tag_at_exit { TAG_AT_EXIT_NONE, TAG_AT_EXIT_SNAPSHOT };
/* LIBTAG_FP_DEPTH's upper bound and default: the frames a walk keeps
 * (stacks/unwind.c).  A stack cut at a fixed depth starts at a different
 * frame whenever the part inside it changes length, so it shares no node
 * with the last one (numpy's tests, cut at 64 frames under nested imports:
 * 4.5 M stack nodes where whole stacks make 2.5 M). */
#define TAG_WALK_MAX 256

extern struct tag_options _tag_opt;
/* Parse LIBTAG_* from the environment; a bad value is reported once and
 * libtag refuses to start (the process exits 2). No malloc. */
TAG_COLD void _tag_options_init(void);

#endif /* LIBTAG_OPTIONS_H */
