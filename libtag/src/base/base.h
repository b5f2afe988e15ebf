/* base.h - what every part of libtag stands on: the attribute macros, the
 * constants of the machine, the internal assertion, and (base/log.h) the
 * log.  Nothing here is exported: the library is built with
 * -fvisibility=hidden and the shared names are _tag_*; exported names (the
 * malloc family, the instrumentation hooks and libtag_*) are marked
 * TAG_EXPORT where they are defined.  The layouts a core reader sees are
 * tag_abi.h's (libtag/include); the rest of src/ keeps its private ones
 * each in its own folder's headers.
 *
 * src/'s folders are layers (docs/architecture.md draws them): base, heap,
 * stacks, alloc, snapshot, life.  A folder includes the headers of its own
 * folder and of the folders below it, never above
 * (tests/unit/test_layers.py holds it). */
#ifndef LIBTAG_BASE_H
#define LIBTAG_BASE_H

#include <stddef.h>
#include <stdint.h>
#include "tag_abi.h"

#define TAG_EXPORT  __attribute__((visibility("default")))
#define TAG_NOINSTR __attribute__((no_instrument_function))
#define TAG_LIKELY(x)   __builtin_expect(!!(x), 1)
#define TAG_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* Rare paths (anomalies, registration, table inserts, sweeps) stay out of
 * the hot functions' code: the fast path is one inline body, every rare case
 * a call (mimalloc's free.c does the same). */
#define TAG_COLD     __attribute__((cold, noinline))
#define TAG_NOINLINE __attribute__((noinline))
#define TAG_INLINE   static inline __attribute__((always_inline))

/* The machine (base/arch.h): the page size (TAG_PAGE_SIZE: guard pages,
 * mincore probes, the self-written core), registers, frames. */
#include "base/arch.h"
/* Signal numbers are below this (the kernel's _NSIG is 64: 1..64). */
#define TAG_NSIG 65

/* Internal invariants, checked in the debug build (cmake -DLIBTAG_DEBUG=ON,
 * which CI runs once); compiled out otherwise.  A failure writes one line
 * with write(2) and aborts: no stdio, no malloc. */
#ifdef LIBTAG_DEBUG  /* _tag_fatal: base/log.h */
#define TAG_ASSERT(c) \
    (TAG_LIKELY(c) ? (void)0 : _tag_fatal("libtag: assertion failed: %s (%s:%d)", #c, __FILE__, __LINE__))
#else
#define TAG_ASSERT(c) ((void)0)
#endif

/* the log (TAG_ASSERT writes its line with _tag_fatal) */
#include "base/log.h"

#endif /* LIBTAG_BASE_H */
