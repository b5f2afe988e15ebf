/* hooks.c - the fast paths of the -finstrument-functions hooks.
 *
 * They run around every function of an instrumented program, so they are
 * the one file of libtag built without frame pointers (CMakeLists.txt): no
 * prologue, no callee-saved register, the caller's stack pointer from
 * __builtin_dwarf_cfa().  Anything but the common case is a tail jump to
 * shadow_stack.c (_tag_enter_slow, _tag_exit_slow, _tag_hook_tick), which
 * then finds the instrumented function's frame pointer (rbp, x29) and the
 * hook's return address in its own frame, as if the hook had frame
 * pointers.  So these functions must never touch the frame pointer (nor,
 * on aarch64, x30) nor leave anything on the stack before those jumps:
 * check the disassembly (objdump -d) after changing them - a push (an stp)
 * in front of a jmp (a b) would be wrong.
 *
 * The enter records what it sees, and checks nothing about other entries:
 * the instrumented function's stack pointer at the hook call (the hook's
 * own CFA), the hook's return address, the call site and the frame
 * pointer; fn and a lower bound of the entry's CFA (stacks/shadow.h: the
 * end of its return address slot) too when the entry changed.  When a
 * depth is entered again the same way (the same site, stack pointer and
 * return address: a loop calling the same chain) nothing is written but
 * the depth and the frame pointer.  Finding the function's CFA
 * from those, and whether older entries are still alive (a longjmp leaves
 * dead ones), is left to the next capture (_tag_shadow_settle and unwind.c's
 * memo_cc), which sees ~3 entries pushed since the last one where the
 * enters between them were ~9 (lua's binary_trees).
 *
 * The exit pops the innermost entry when it was entered at or above the
 * exiting function's stack pointer: the exiting function itself (an entry
 * recorded below it is a frame it called that never exited: the slow path
 * pops those).  At -O2 a void function may reach the hook by a tail jump
 * after its epilogue; then the hook's CFA is the function's own CFA, its
 * return address (the call site it was entered from) is in the slot below
 * that CFA (x86_64) or in x30, the hook's return address (aarch64:
 * tag_arch_exit_jumped), and the entry below is its caller's, entered at
 * or above that CFA.
 *
 * A thread without a state of its own (not registered yet, or past its
 * exit) has _tag_tls.t = &_tag_tls_none, all zeros and never written: its
 * shadow_limit 0 sends the enter, and its depth 0 the exit, to the slow
 * paths before they write anything, and those register the thread.
 */
#include "base/base.h"
#include "stacks/shadow.h"
#include "stacks/thread.h"

_Static_assert(offsetof(struct tag_thread_state, hook_sp) ==
                   offsetof(struct tag_thread_state, hook_sp_outer) + sizeof(uint64_t),
               "the exit hook reads hook_sp[-1] at depth 1");

TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_enter(void *this_fn, void *call_site)
{
    struct tag_thread_state *t = _tag_tls.t;
    uint64_t fn = (uint64_t)(uintptr_t)this_fn, site = (uint64_t)(uintptr_t)call_site;
    uint64_t d = t->shadow.depth;  /* 64 bits: an index with no extension */
    if (TAG_UNLIKELY(d >= t->shadow_limit))
        return _tag_enter_slow(fn, site, t);  /* full, or no state */
    uint64_t c = (uint64_t)(uintptr_t)__builtin_dwarf_cfa();
    uint64_t ra;
    TAG_ARCH_HOOK_RA(ra);
    t->shadow.depth = (uint32_t)d + 1;
    uint64_t bp;
    TAG_ARCH_FRAME_REG(bp);  /* the function's: the hook has no frame */
    /* rbp always (a function that realigns its stack can have the same
     * stack pointer at its hook and another CFA: the capture then finds
     * the CFA again from rbp, _tag_shadow_recheck); compared, it would
     * take every -O2 function whose rbp is a variable off the shortcut */
    t->hook_bp[d] = bp;
    if (TAG_UNLIKELY(t->shadow.site[d] != site || t->hook_sp[d] != c || t->hook_ra[d] != ra)) {
        _tag_shadow_record(t, (uint32_t)d, fn, site, c, ra, (c + 8) | 1);
    }
    /* the sweep's countdown: registering the thread started it, and the
     * tick restarts it at 0 (== 0: one subtract from memory, no load) */
    if (TAG_UNLIKELY(--t->hook_left == 0))
        return _tag_hook_tick(t);
}

TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_exit(void *this_fn, void *call_site)
{
    struct tag_thread_state *t = _tag_tls.t;
    uint64_t c = (uint64_t)(uintptr_t)__builtin_dwarf_cfa();
    /* aarch64 tells a jump after the epilogue by it (x86_64 does not use it) */
    uint64_t ra;
    TAG_ARCH_HOOK_RA(ra);
    uint32_t d = t->shadow.depth;
    /* hook_sp[d - 1] is (&hook_sp_outer)[d]: no index to compute */
    if (TAG_LIKELY(d - 1u < TAG_SHADOW_MAX)) {  /* depth 0 wraps */
        if (TAG_LIKELY((&t->hook_sp_outer)[d] >= c) ||
            /* the tail jump after the epilogue (see above) */
            _tag_shadow_tail(t, d - 1, (uint64_t)(uintptr_t)this_fn, (uint64_t)(uintptr_t)call_site, c, ra)) {
            t->shadow.depth = d - 1;
            return;
        }
    }
    return _tag_exit_slow((uint64_t)(uintptr_t)this_fn, t, c, (uint64_t)(uintptr_t)call_site);
}
