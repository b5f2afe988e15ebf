/* unwind.h - capturing the stack of an allocation (unwind.c): from the
 * shadow stack, a frame-pointer walk or a CFI walk, as LIBTAG_UNWIND says,
 * and from a signal handler's context. */
#ifndef LIBTAG_UNWIND_H
#define LIBTAG_UNWIND_H

#include <stdint.h>
#include "base/base.h"
#include "stacks/thread.h"

/* The stack of the current allocation.  ret: the return address into the
 * caller of libtag's entry point, frame: that entry point's frame (built
 * with frame pointers: frame[0] = the caller's rbp, frame[1] = ret).  ret
 * NULL (from a trace hook): frame is the hook's.  LIBTAG_UNWIND chooses
 * the shadow stack, a frame-pointer walk or a CFI walk.  Normal context. */
uint32_t _tag_capture(struct tag_thread_state *t, void *ret, void *frame);
/* The frames of the interrupted code of a signal handler's ucontext
 * (the first is its exact pc, TAG_FRAME_SIGNAL), innermost first: uses the
 * module list and rules already known, no locks, no malloc, no
 * dl_iterate_phdr: async-signal-safe.  Returns the frame count. */
struct ucontext_t;
uint32_t _tag_unwind_uc(struct tag_thread_state *t, const struct ucontext_t *uc,
                        uint64_t *pcs, uint32_t *kinds, uint32_t max);
/* The same, interned (_tag_intern_signal): 0 when the table is busy. */
uint32_t _tag_capture_uc(struct tag_thread_state *t, const struct ucontext_t *uc);
/* Drop every cached rule (dlclose). */
void _tag_unwind_flush(void);
/* Forget the thread's kept walks: the bounds of its stacks changed
 * (sigaltstack, the fork child).  Normal context of the thread. */
void _tag_unwind_forget(struct tag_thread_state *t);
/* Bring t->captures and capture_frames up to date (the fast check counts
 * its hits per walk).  The thread's own normal context. */
void _tag_unwind_settle(struct tag_thread_state *t);
extern uint64_t _tag_capture_total, _tag_capture_frames_total;

#endif /* LIBTAG_UNWIND_H */
