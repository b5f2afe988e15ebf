/* shadow.h - the shadow stack: what the instrumentation hooks (hooks.c)
 * record at every enter and exit of a program built with
 * -finstrument-functions, kept alive against longjmp and exceptions and
 * interned into stack ids (shadow_stack.c), and captured at an allocation
 * (unwind.c's shadow capture).  Its per-thread fields are struct
 * tag_thread_state's (stacks/thread.h); the hot paths' bodies are inline
 * here, so each stays one body in its caller.
 *
 * An entry's "CFA" here is the end of the slot where its function keeps
 * its return address: the word below it holds the call site the function
 * was entered from for as long as the frame is alive (tag_arch_slot_ra,
 * base/arch.h).  On x86_64 it is the CFA itself (the slot is the word the
 * call pushed); on aarch64 the end of the slot where the prologue saved
 * x30 (x29 + 16 in a frame record), below the CFA.  Either way it lies in
 * the function's frame, above every frame it calls and at least 8 above
 * its stack pointer at the enter hook, so entries compare as frames do. */
#ifndef LIBTAG_SHADOW_H
#define LIBTAG_SHADOW_H

#include <stdint.h>
#include "base/base.h"
#include "base/options.h"
#include "stacks/thread.h"

/* The multiplier of the calling-context hash (_tag_shadow_cc). */
#define TAG_CC_MIX 0x9e3779b97f4a7c15ull

/* The shadow stack's CFAs, found by the CFI rules unwind.c keeps (its
 * "shadow stacks" section defines these): */
/* The CFA of the instrumented function whose enter hook returns to ra;
 * c: its stack pointer at the hook call, rbp: its frame pointer, site: its
 * return address (what the slot below the CFA holds).  Bit 0 set: a lower bound only
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
/* Pop the shadow entries whose frames are gone (longjmp, exceptions) as
 * seen from cur: the stack pointer of running code (fn 0), or the CFA of
 * function fn being entered from site.  Returns the new depth. */
uint32_t _tag_shadow_pop(struct tag_thread_state *t, uint64_t cur, uint64_t fn, uint64_t site);
/* Before a capture from stack pointer cur uses the shadow stack: the
 * entries recorded since the last capture (from valid - 1 up) have their
 * CFAs and are alive, or the dead ones are dropped (shadow_stack.c). */
void _tag_shadow_settle_slow(struct tag_thread_state *t, uint64_t cur);
TAG_INLINE void _tag_shadow_settle(struct tag_thread_state *t, uint64_t cur)
{
    uint32_t d = t->shadow.depth;
    if (t->cc_valid < d && d - 1u < TAG_SHADOW_MAX)  /* 1 <= d <= max */
        _tag_shadow_settle_slow(t, cur);
}
/* The calling context one site deeper: cc[d + 1] of cc[d] and site[d].
 * One rotate, xor and multiply. */
TAG_INLINE uint64_t _tag_cc_step(uint64_t cc, uint64_t site)
{
    return (((cc << 23) | (cc >> 41)) ^ site) * TAG_CC_MIX;
}
/* The calling context of the outer d frames (d <= min(depth, max)), the
 * entries alive: hashes the sites from cc_valid up, raises cc_valid to d.
 * One step a site pushed since the last capture. */
TAG_INLINE uint64_t _tag_shadow_cc(struct tag_thread_state *t, uint32_t d)
{
    uint32_t i = t->cc_valid;
    if (TAG_LIKELY(i >= d))
        return t->cc[d];
    /* the prefix ids changed from i up too (see _tag_shadow_record) */
    if (t->shadow.valid > i)
        t->shadow.valid = i;
    uint64_t cc = t->cc[i];
    for (; i < d; i++) {
        cc = _tag_cc_step(cc, t->shadow.site[i]);
        t->cc[i + 1] = cc;
    }
    t->cc_valid = d;
    return cc;
}
/* Record function fn at depth d < TAG_SHADOW_MAX, entered from site, as
 * its enter hook saw it: the hook's CFA c (the function's stack pointer at
 * the call), the hook's return address ra (its rbp is the caller's to store: the
 * enter hook stores it at every call); sp: its CFA
 * where known, else the lower bound (c + 8) | 1 for a capture to resolve
 * (_tag_shadow_resolve).  A changed entry lowers cc_valid: the next
 * capture resolves and hashes it, checks that the entry below it is alive
 * (_tag_shadow_settle), and lowers shadow.valid to it before raising
 * cc_valid (_tag_shadow_cc): the ids are valid up to min(shadow.valid,
 * cc_valid), one compare here.  The enter hook calls this only when the
 * site, c or ra changed: the same three give the same function and CFA,
 * so an unchanged entry keeps what a capture found, and a loop that calls
 * the same chain again captures for free. */
TAG_INLINE void _tag_shadow_record(struct tag_thread_state *t, uint32_t d, uint64_t fn, uint64_t site,
                                   uint64_t c, uint64_t ra, uint64_t sp)
{
    t->shadow.fn[d] = fn;
    t->shadow.site[d] = site;
    t->shadow.sp[d] = sp;
    t->hook_sp[d] = c;
    t->hook_ra[d] = ra;
    if (t->cc_valid > d)
        t->cc_valid = d;
}
/* Entry i is function fn, whose exit hook was reached by a tail jump past
 * its epilogue so that the hook's CFA c is fn's own: entered from site,
 * fn's return address, where the machine has it after the epilogue (the
 * slot below c, or x30: ra, the hook's return address;
 * tag_arch_exit_jumped), inside an entry entered at or above c
 * (hook_sp_outer for i = 0).  The exit hook asks it of the innermost
 * entry, _tag_exit_slow of each below dead ones. */
TAG_INLINE int _tag_shadow_tail(const struct tag_thread_state *t, uint64_t i, uint64_t fn, uint64_t site,
                                uint64_t c, uint64_t ra)
{
    return t->shadow.site[i] == site && t->shadow.fn[i] == fn && tag_arch_exit_jumped(c, ra, site) &&
           (&t->hook_sp_outer)[i] >= c;
}
/* Entry i (> 0), its CFA e, lies inside entry i - 1, whose CFA is outer
 * (bit 0 cleared from both): below it, or at it for another function (the
 * host of an inlined one).  Lower bounds compare as they are: the enter
 * hook's CFA + 8 is below the function's CFA, and above that of every
 * function it calls. */
TAG_INLINE int _tag_shadow_inside(const struct tag_thread_state *t, uint32_t i, uint64_t e, uint64_t outer)
{
    return e < outer || (e == outer && t->shadow.fn[i] != t->shadow.fn[i - 1]);
}
/* Enter hooks between two sweeps: LIBTAG_SWEEP, or never. */
TAG_INLINE int32_t _tag_hook_period(void)
{
    return _tag_opt.sweep_every ? (int32_t)_tag_opt.sweep_every : INT32_MAX;
}
/* The hooks' rare paths, reached from hooks.c by a tail jump (see there):
 * an enter or exit its fast path does not finish, and the hook tick (the
 * thread's first hook, a sweep due). */
void _tag_enter_slow(uint64_t fn, uint64_t site, struct tag_thread_state *t);
void _tag_exit_slow(uint64_t fn, struct tag_thread_state *t, uint64_t c, uint64_t site);
void _tag_hook_tick(struct tag_thread_state *t);
/* The interned shadow stack with the innermost function's ENTRY node;
 * depth > 0. */
uint32_t _tag_shadow_id(struct tag_thread_state *t);
/* The interned id of the shadow stack's outer d frames (CALL nodes of
 * site[0..d-1]), d <= min(depth, TAG_SHADOW_MAX): id[d], interning the
 * depths from min(valid, cc_valid) up first. */
uint32_t _tag_shadow_prefix_slow(struct tag_thread_state *t, uint32_t d);
TAG_INLINE uint32_t _tag_shadow_prefix(struct tag_thread_state *t, uint32_t d)
{
    return TAG_LIKELY(t->shadow.valid >= d && t->cc_valid >= d) ? t->shadow.id[d]
                                                                : _tag_shadow_prefix_slow(t, d);
}

/* Called up: the hook tick runs the sweep of the thread's recent blocks
 * (alloc/sweep.c, a folder above; declared in alloc/sweep.h too). */
TAG_COLD void _tag_sweep(struct tag_thread_state *t, void *ret, void *frame);

#endif /* LIBTAG_SHADOW_H */
