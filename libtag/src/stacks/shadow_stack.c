/* shadow_stack.c - the per-thread shadow call stack.
 *
 * Programs built with -finstrument-functions call __cyg_profile_func_enter
 * and _exit around every function; we keep (this_fn, call_site, sp) per
 * depth in the thread's state (thread.c), where sp is the function's CFA: the stack
 * address it was entered from.  A hash of the call sites below each depth
 * (tag_thread_state.cc[], kept up to cc_valid) keys the capture memo (unwind.c), so
 * a capture hashes only the depths changed since the last one; on a miss,
 * the interned id of each prefix is cached per depth (shadow.id[], up to
 * shadow.valid) and interns only the frames changed since it was computed.
 *
 * longjmp, exceptions and signal handlers that do not return skip exit
 * hooks.  So an enter or a capture first pops every entry whose frame is no
 * longer on the stack: one recorded at or below the current address (the
 * stack grows down), or whose return address slot (below its CFA: see
 * stacks/shadow.h) no longer holds its call site (its frame was reused by
 * code that is not instrumented).
 * That is only decided on the thread's own stack: code running on an
 * alternate signal stack (or one libtag does not know) pops only entries of
 * that alternate stack, below itself.
 */
#include "base/base.h"
#include "base/control.h"
#include "base/options.h"
#include "stacks/shadow.h"
#include "stacks/stack_table.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"

/* Is shadow entry i dead, seen from cur?  cur is the stack pointer of
 * running code (fn 0), or the CFA of function fn being entered from site.
 * cur_alt: cur is on the thread's alternate signal stack.
 *
 * An entry recorded below cur is dead.  One recorded at cur itself is the
 * host of a function inlined into it (-finstrument-functions calls the
 * hooks for inlined calls too, from the host's frame), unless it is the
 * same function entered again from the same call site: the last one never
 * exited (longjmp). */
static int dead(struct tag_thread_state *t, uint32_t i, uint64_t cur, uint64_t fn, uint64_t site,
                int cur_alt, uint64_t hi)
{
    for (int tried = 0;; tried = 1) {
        uint64_t e = t->shadow.sp[i], at = e & ~1ull;
        int e_alt = t->alt_hi && at >= t->alt_lo && at < t->alt_hi;
        int again = !fn || (t->shadow.fn[i] == fn && t->shadow.site[i] == site);
        if (cur_alt)
            return e_alt && (at < cur || (at == cur && again));
        if (e_alt || at < cur || at >= hi || (at == cur && again))
            return 1;
        /* cur <= at < hi on this stack: the slot is mapped */
        if ((e & 1) || tag_arch_slot_ra(at) == t->shadow.site[i])
            return 0;
        /* its CFA may be stale (a realigned frame): once more, from rbp */
        if (tried || !_tag_shadow_recheck(t, i, cur))
            return 1;
    }
}

uint32_t _tag_shadow_pop(struct tag_thread_state *t, uint64_t cur, uint64_t fn, uint64_t site)
{
    uint32_t d = t->shadow.depth;
    uint64_t hi = t->stack_hi;
    int cur_alt = t->alt_hi && cur >= t->alt_lo && cur < t->alt_hi;
    if (!cur_alt && !(hi && cur < hi))
        return d;  /* a stack libtag does not know: pop nothing */
    if (d > TAG_SHADOW_MAX) {
        /* the entries beyond the stored ones are all inner of the last */
        if (!dead(t, TAG_SHADOW_MAX - 1, cur, fn, site, cur_alt, hi))
            return d;
        d = TAG_SHADOW_MAX;
    }
    while (d > 0 && dead(t, d - 1, cur, fn, site, cur_alt, hi))
        d--;
    t->shadow.depth = d;
    return d;
}

/* What _tag_shadow_settle finds dead: drop every dead entry, wherever it
 * is, seen from cur inward out - the innermost against cur, each other
 * against the nearest alive entry inside it - down to the first alive
 * entry below lo (those below it were checked by an earlier capture and
 * are alive when it is). */
static void shadow_repair(struct tag_thread_state *t, uint64_t cur, uint32_t lo)
{
    struct libtag_shadow *s = &t->shadow;
    uint32_t d = s->depth, n = 0, first = d;
    uint64_t hi = t->stack_hi, fn = 0, site = 0;
    uint64_t keep[TAG_SHADOW_MAX / 64] = {0};
    uint32_t rest = 0;  /* entries below this one all stay */
    for (uint32_t i = d; i-- > 0;) {
        int cur_alt = t->alt_hi && cur >= t->alt_lo && cur < t->alt_hi;
        if (!cur_alt && !(hi && cur < hi)) {
            rest = i + 1;  /* a stack libtag does not know: the rest stays */
            break;
        }
        if (dead(t, i, cur, fn, site, cur_alt, hi))
            continue;
        keep[i / 64] |= 1ull << (i % 64);
        if (i < lo) {
            rest = i;
            break;
        }
        cur = s->sp[i] & ~1ull;
        fn = s->fn[i];
        site = s->site[i];
    }
    for (uint32_t j = 0; j < rest; j++)
        keep[j / 64] |= 1ull << (j % 64);
    for (uint32_t j = 0; j < d; j++) {
        if (!(keep[j / 64] >> (j % 64) & 1)) {
            if (first == d)
                first = j;
            continue;
        }
        if (n != j) {
            s->fn[n] = s->fn[j];
            s->site[n] = s->site[j];
            s->sp[n] = s->sp[j];
            t->hook_sp[n] = t->hook_sp[j];
            t->hook_ra[n] = t->hook_ra[j];
            t->hook_bp[n] = t->hook_bp[j];
        }
        n++;
    }
    s->depth = n;
    if (s->valid > first)
        s->valid = first;
    if (t->cc_valid > first)
        t->cc_valid = first;
}

/* The enter hook checks nothing about the entries below the one it
 * pushes (hooks.c).  A longjmp out of instrumented frames, then calls,
 * leaves dead entries under live ones; code that is not instrumented can
 * reuse a frame of the stack.  So a capture first resolves the entries
 * pushed since the last capture (their CFAs, where the enter left a
 * lower bound), and checks them and the one below them (valid - 1 up to
 * the innermost, whose slot the capture checks itself): each inside the
 * one before, its slot holding its site.  Any dead one: all are repaired. */
void _tag_shadow_settle_slow(struct tag_thread_state *t, uint64_t cur)
{
    struct libtag_shadow *s = &t->shadow;
    uint32_t d = s->depth, v = t->cc_valid, lo = v ? v - 1 : 0;
    uint64_t hi = t->stack_hi;
    /* every one first: a repair decides by the CFAs of all */
    for (uint32_t i = v; i < d; i++)
        if (s->sp[i] & 1)
            _tag_shadow_resolve(t, i, cur);
    for (uint32_t i = lo; i < d; i++) {
        uint64_t e = s->sp[i];
        if (i > lo && !_tag_shadow_inside(t, i, e & ~1ull, s->sp[i - 1] & ~1ull)) {
            shadow_repair(t, cur, lo);
            return;
        }
        uint64_t at = e & ~1ull;
        if ((e & 1) || i + 1 == d)
            continue;  /* a lower bound has nothing to check; the innermost is the capture's */
        /* read only what is on this thread's stack above cur, or on its
         * alternate stack; anything else is for the full check */
        int mapped = (at > cur && at <= hi) || (t->alt_hi && at > t->alt_lo && at <= t->alt_hi);
        if (!mapped || (tag_arch_slot_ra(at) != s->site[i] && !_tag_shadow_recheck(t, i, cur))) {
            shadow_repair(t, cur, lo);
            return;
        }
    }
}

/* The hooks' rare paths (hooks.c has the fast ones).  The hooks are built
 * without frame pointers and reach these by a tail jump, with nothing on
 * the stack and the frame pointer (and aarch64's x30) untouched: so in
 * these functions (built with frame pointers, as all of libtag but
 * hooks.c) frame[1] is the hook's return address into the instrumented
 * function, frame[0] that function's frame pointer and their own CFA its
 * stack pointer at the hook call - what the hooks had when they were built
 * with frame pointers themselves. */

/* hook_left ran out: a sweep is due. */
TAG_NOINSTR TAG_NOINLINE void _tag_hook_tick(struct tag_thread_state *t)
{
    t->hook_left = _tag_hook_period();
    if (_tag_opt.sweep_every && t->rec)
        _tag_sweep(t, NULL, __builtin_frame_address(0));
}

/* The enters the fast path does not take: a thread without a state of
 * its own yet (registered here), a full shadow stack. */
TAG_NOINSTR TAG_NOINLINE void _tag_enter_slow(uint64_t fn, uint64_t site, struct tag_thread_state *t)
{
    const uint64_t *frame = __builtin_frame_address(0);
    if (TAG_UNLIKELY(t->rec == NULL)) {
        /* The thread's first enter always comes here (t is _tag_tls_none,
         * whose shadow_limit is 0): register it before its stack bounds
         * are used.  Without a state it keeps no shadow stack. */
        if ((t = _tag_thread_register()) == NULL)
            return;
    }
    /* the CFA: x86_64's frame + 2; an aarch64 frame record need not be
     * at the top of its frame */
    uint64_t c = (uintptr_t)__builtin_dwarf_cfa(), ra = frame[1], bp = frame[0];
    uint64_t cfa = _tag_hook_cfa(t, ra, c, bp, site);
    uint32_t d = t->shadow.depth;
    /* Full: entries a longjmp left under live ones may fill it.  Those
     * pushed since the last capture are checked as a capture would. */
    if (d == TAG_SHADOW_MAX)
        _tag_shadow_settle(t, c);
    d = t->shadow.depth;
    if (d > 0) {
        /* Fast check that the innermost entry is alive: recorded above us
         * (or at our CFA, as the host of an inlined function) on this
         * stack, and its return address still in place.  Anything else
         * takes the full check. */
        uint64_t e = t->shadow.sp[d <= TAG_SHADOW_MAX ? d - 1 : 0];
        if (d > TAG_SHADOW_MAX || e >= t->pop_limit ||
            !(e > cfa || (e == cfa && t->shadow.fn[d - 1] != fn)) ||
            (!(e & 1) && tag_arch_slot_ra(e) != t->shadow.site[d - 1]))
            d = _tag_shadow_pop(t, cfa, fn, site);
    }
    t->shadow.depth = d + 1;
    if (TAG_LIKELY(d < TAG_SHADOW_MAX)) {
        t->hook_bp[d] = bp;
        _tag_shadow_record(t, d, fn, site, c, ra, cfa);
    } else {
        t->shadow.overflows++;
    }
    if (TAG_UNLIKELY(--t->hook_left <= 0)) {
        t->hook_left = _tag_hook_period();
        if (_tag_opt.sweep_every)
            _tag_sweep(t, NULL, (void *)frame);
    }
}

/* The exits the fast path does not take.  c: the exit hook's CFA, the
 * exiting function's stack pointer at the call - or, after a tail jump
 * past its epilogue, its own CFA; site: its return address.  Entries
 * recorded below c are frames it called that never exited (longjmp), or
 * itself after the tail jump: the entry of this function and site, with
 * site where the machine keeps a return address after the epilogue
 * (_tag_shadow_tail) and the entry outside it at or above c,
 * as the fast path checks for the innermost.  The first entry entered at
 * or above c is itself otherwise.  Either way it is popped with every
 * entry inside it. */
TAG_NOINSTR TAG_NOINLINE void _tag_exit_slow(uint64_t fn, struct tag_thread_state *t, uint64_t c, uint64_t site)
{
    uint32_t d = t->shadow.depth;
    if (d == 0)
        return;  /* nothing to pop (and, in _tag_tls_none, nothing to write) */
    /* the exit hook's return address (a tail jump came here) */
    uint64_t ra = (uint64_t)(uintptr_t)__builtin_return_address(0);
    if (TAG_LIKELY(d <= TAG_SHADOW_MAX)) {
        for (; d > 0; d--)
            if (t->hook_sp[d - 1] >= c || _tag_shadow_tail(t, d - 1, fn, site, c, ra))
                break;
        if (d > 0)
            d--;
    } else {
        d--;
    }
    /* valid is left alone: the slots above depth keep their values until
     * an enter with a different function or call site overwrites them. */
    t->shadow.depth = d;
}

uint32_t _tag_shadow_prefix_slow(struct tag_thread_state *t, uint32_t d)
{
    struct libtag_shadow *s = &t->shadow;
    for (uint32_t i = s->valid < t->cc_valid ? s->valid : t->cc_valid; i < d; i++) {
        if (t->used_parent[i] == s->id[i] && t->used_site[i] == s->site[i] && s->id[i + 1])
            continue;  /* this depth came back to what it was */
        t->used_parent[i] = s->id[i];
        t->used_site[i] = s->site[i];
        s->id[i + 1] = _tag_intern(t, s->id[i], TAG_FRAME_CALL, s->site[i]);
    }
    s->valid = d;
    return s->id[d];
}

uint32_t _tag_shadow_id(struct tag_thread_state *t)
{
    struct libtag_shadow *s = &t->shadow;
    uint32_t d = s->depth < TAG_SHADOW_MAX ? s->depth : TAG_SHADOW_MAX;
    uint32_t parent = _tag_shadow_prefix(t, d);
    /* The innermost function's ENTRY node: the same as last time unless the
     * prefix or the function changed (a memo cheaper than the cache). */
    if (t->entry_parent != parent || t->entry_fn != s->fn[d - 1] || !t->entry_id) {
        t->entry_parent = parent;
        t->entry_fn = s->fn[d - 1];
        t->entry_id = _tag_intern(t, parent, TAG_FRAME_ENTRY, s->fn[d - 1]);
    }
    return t->entry_id;
}

TAG_EXPORT uint32_t libtag_current_stack(void)
{
    _tag_ensure_init();
    struct tag_thread_state *t = _tag_self();
    return t ? _tag_capture(t, __builtin_return_address(0), __builtin_frame_address(0)) : 0;
}
