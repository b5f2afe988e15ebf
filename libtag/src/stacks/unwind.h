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
/* The CFA of the instrumented function whose enter hook returns to ra;
 * c: its stack pointer at the hook call, rbp: its rbp, site: its return
 * address (what the CFA - 8 slot holds).  Bit 0 set: a lower bound only
 * (no rule, and site not found near c).  Fills t->hook_cache with the
 * offset from c of a CFA it found by rule (hooks.c). */
uint64_t _tag_hook_cfa(struct tag_thread_state *t, uintptr_t ra, uintptr_t c, uintptr_t rbp,
                       uintptr_t site);
/* Resolve shadow entry i (shadow_stack.c): its CFA into shadow.sp[i], from
 * what its enter hook saw (hook_sp, hook_ra, hook_bp) - the hook cache, else the
 * CFI rule, which fills the cache.  Reads only the stack the hook ran on,
 * from cur (a stack pointer of running code) up, or the alternate signal
 * stack; elsewhere the lower bound stays.  A frame that is gone gets its
 * CFA by rule, whose slot no longer holds the site.  Returns sp[i]. */
uint64_t _tag_shadow_resolve(struct tag_thread_state *t, uint32_t i, uint64_t cur);
/* Shadow entry i's CFA failed its slot: find it again from the CFI rule
 * and the rbp its enter hook saw last (a function that realigns its stack
 * has the same stack pointer at the hook for CFAs a few bytes apart, and
 * the enter keeps the CFA a capture found for the same stack pointer).  1
 * and sp[i] updated if the slot there holds the site: alive after all.
 * Reads as _tag_shadow_resolve. */
int _tag_shadow_recheck(struct tag_thread_state *t, uint32_t i, uint64_t cur);
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
