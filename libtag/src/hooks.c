/* hooks.c - the fast paths of the -finstrument-functions hooks.
 *
 * They run around every function of an instrumented program, so they are
 * the one file of libtag built without frame pointers (CMakeLists.txt): no
 * prologue, no callee-saved register, the caller's stack pointer from
 * __builtin_dwarf_cfa().  Anything but the common case is a tail jump to
 * shadow_stack.c (_tag_enter_slow, _tag_exit_slow, _tag_hook_tick), which
 * then finds the instrumented function's rbp and return address in its own
 * frame, as if the hook had frame pointers.  So these functions must never
 * touch rbp nor leave anything on the stack before those jumps: check the
 * disassembly (objdump -d) after changing them - a push in front of a jmp
 * would be wrong.
 *
 * What the enter fast path checks is what shadow_stack.c's full enter
 * checks, in the common case only:
 *   - the CFA of the instrumented function is the stack pointer at the hook
 *     call plus the offset cached for this hook call (hook_cache, 4 ways a
 *     set, filled by _tag_hook_cfa from CFI; a miss costs a rule lookup, so
 *     the cache holds the hot functions of a large program), and its
 *     return address slot (CFA - 8) holds
 *     call_site: the load that proves the offset right for this call (a
 *     function that realigns its stack, or code loaded at the address of
 *     unloaded code, fails it and takes the slow path);
 *   - the innermost entry is above the new CFA (or at it, as the host of
 *     an inlined function, when it is another function).  Whether it is
 *     still alive (its return address slot holding its call site) is left
 *     to the next capture (_tag_shadow_settle): a load and a compare on
 *     every call, for the rare longjmp out of instrumented frames followed
 *     by a call deeper than them.
 *
 * A thread without a state of its own (not registered yet, or past its
 * exit) has _tag_tls.t = &_tag_tls_none, all zeros and never written: the
 * enter finds no hook_cache entry (ra is never 0) and the exit depth 0, so
 * both leave for the slow paths before they write anything, and those
 * register the thread.
 */
#include "libtag_internal.h"

_Static_assert(TAG_HOOK_WAYS == 4, "__cyg_profile_func_enter looks in 4 ways");

TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_enter(void *this_fn, void *call_site)
{
    struct tag_thread_state *t = _tag_tls.t;
    uint64_t fn = (uint64_t)(uintptr_t)this_fn, site = (uint64_t)(uintptr_t)call_site;
    uint64_t c = (uint64_t)(uintptr_t)__builtin_dwarf_cfa();
    uint64_t ra = (uint64_t)(uintptr_t)__builtin_return_address(0);
    const struct tag_hook_set *h = &t->hook_cache[TAG_HOOK_SET(ra)];
    uint64_t off;
    if (TAG_LIKELY(h->ra[0] == ra))
        off = h->off[0];
    else if (h->ra[1] == ra)
        off = h->off[1];
    else if (h->ra[2] == ra)
        off = h->off[2];
    else if (h->ra[3] == ra)
        off = h->off[3];
    else
        return _tag_enter_slow(fn, site, t);
    uint64_t cfa = c + off;
    if (TAG_UNLIKELY(((const uint64_t *)cfa)[-1] != site))
        return _tag_enter_slow(fn, site, t);
    uint64_t d = t->shadow.depth;  /* 64 bits: an index with no extension */
    if (TAG_UNLIKELY(d >= TAG_SHADOW_MAX))
        return _tag_enter_slow(fn, site, t);  /* full */
    /* The innermost entry, sp[d - 1]; at depth 0 the word before sp[0]
     * (site[TAG_SHADOW_MAX - 1]): whether it sends us to the slow path or
     * not, an entry at depth 0 is recorded the same way. */
    uint64_t e = _tag_shadow_below(t, d, sp);
    if (TAG_UNLIKELY(e <= cfa) && (e != cfa || _tag_shadow_below(t, d, fn) == fn))
        return _tag_enter_slow(fn, site, t);
    t->shadow.depth = (uint32_t)d + 1;
    _tag_shadow_record(t, (uint32_t)d, fn, site, cfa);
    /* >= 1 here: a state's first enter (hook_left 0) takes the slow path,
     * its hook_cache being empty, and that path leaves it >= 1 */
    if (TAG_UNLIKELY(--t->hook_left == 0))
        return _tag_hook_tick(t);
}

TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_exit(void *this_fn, void *call_site)
{
    (void)call_site;
    struct tag_thread_state *t = _tag_tls.t;
    uint64_t sp = (uint64_t)(uintptr_t)__builtin_dwarf_cfa();
    uint64_t d = t->shadow.depth;  /* 64 bits: an index with no extension */
    /* The innermost entry above the exiting function's stack pointer: it
     * is the exiting function (the slow path pops what lies below).  At
     * the entry's CFA itself when the hook is reached after the epilogue
     * (a tail call at -O2), if it is the same function.  sp is 8-aligned,
     * so sp + 1 is sp | 1, and e > sp | 1 is (e & ~1) > sp whatever e's
     * bit 0: one lea, no and. */
    uint64_t n = d - 1;
    if (TAG_LIKELY(n < TAG_SHADOW_MAX)) {
        uint64_t e = t->shadow.sp[n], sp1 = sp + 1;
        if (TAG_LIKELY(e > sp1) ||
            ((e | 1) == sp1 && t->shadow.fn[n] == (uint64_t)(uintptr_t)this_fn)) {
            t->shadow.depth = (uint32_t)n;
            return;
        }
    }
    return _tag_exit_slow((uint64_t)(uintptr_t)this_fn, t, sp);
}
