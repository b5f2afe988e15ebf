/* control.h - the control block every part writes to (struct
 * libtag_control, tag_abi.h), libtag's start and its clock.  The control
 * block and _tag_init are defined at the top (life/control.c: the start
 * calls every part's init); every entry point below asks for the start
 * through _tag_ensure_init. */
#ifndef LIBTAG_CONTROL_H
#define LIBTAG_CONTROL_H

#include <stdint.h>
#include <time.h>
#include "base/base.h"

extern struct libtag_control _tag_ctl;
TAG_COLD void _tag_init(void);   /* idempotent, thread-safe */
extern int _tag_ready;           /* 1 once _tag_init finished */
static inline void _tag_ensure_init(void)
{
    if (TAG_UNLIKELY(!__atomic_load_n(&_tag_ready, __ATOMIC_ACQUIRE)))
        _tag_init();
}
/* ms since start_mono_ns: on every allocation and free, so inline (the
 * clock is the vDSO's, no system call, called directly when control.c
 * found it).  Exact to the coarse clock's tick: a cached value refreshed
 * every N operations would save the call but stamp the first operations
 * after a thread sleeps with the time before it, by as long as it slept. */
extern int (*_tag_vdso_gettime)(clockid_t, struct timespec *);
TAG_INLINE uint32_t _tag_now_ms(void)
{
    struct timespec ts;
    int (*f)(clockid_t, struct timespec *) = _tag_vdso_gettime;
    if (TAG_LIKELY(f != NULL))
        f(CLOCK_MONOTONIC_COARSE, &ts);
    else
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return (uint32_t)((ns - _tag_ctl.start_mono_ns) / 1000000u);
}

#endif /* LIBTAG_CONTROL_H */
