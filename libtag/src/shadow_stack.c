/* shadow_stack.c - the per-thread shadow call stack and stack capture.
 *
 * Programs built with -finstrument-functions call __cyg_profile_func_enter
 * and _exit around every function; we keep (this_fn, call_site) per depth
 * in initial-exec TLS.  The interned id of each prefix is cached per depth
 * (shadow.id[]) and stays valid until that depth is re-entered, so capturing
 * the stack at an allocation interns only the frames pushed since the last
 * capture - usually none or one or two - instead of walking the whole stack.
 *
 * Code that is not instrumented (a thread that never entered an
 * instrumented function) gets its stack from a frame-pointer walk bounded
 * by LIBTAG_FP_DEPTH and by the thread's stack bounds, so a frame pointer
 * that is really a general register ends the walk instead of faulting.
 */
#include "libtag_internal.h"

/* The hooks run on every function entry of the program: keep them tiny.
 * They must not be instrumented themselves (they would recurse), and they
 * must not allocate. */
TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_enter(void *this_fn, void *call_site)
{
    struct tag_tls *t = &_tag_tls;
    if (TAG_UNLIKELY(t->rec == NULL))
        _tag_thread_register();    /* so a reader finds this thread's stack */
    uint32_t d = t->shadow.depth++;
    if (TAG_LIKELY(d < TAG_SHADOW_MAX)) {
        /* Re-entering a depth the same way keeps the ids cached above it:
         * a loop that calls the same chain again captures for free. */
        if (t->shadow.fn[d] != (uint64_t)(uintptr_t)this_fn ||
            t->shadow.site[d] != (uint64_t)(uintptr_t)call_site) {
            t->shadow.fn[d] = (uint64_t)(uintptr_t)this_fn;
            t->shadow.site[d] = (uint64_t)(uintptr_t)call_site;
            if (t->shadow.valid > d)
                t->shadow.valid = d;
        }
    } else {
        t->shadow.overflows++;
    }
    if (TAG_UNLIKELY(++t->hook_calls == _tag_opt.sweep_every)) {
        t->hook_calls = 0;
        _tag_sweep(t, NULL, __builtin_frame_address(0));
    }
}

TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_exit(void *this_fn, void *call_site)
{
    (void)this_fn;
    (void)call_site;
    struct tag_tls *t = &_tag_tls;
    /* A longjmp or an exception that skipped exits can leave depth too
     * large; never let it wrap below zero. */
    if (TAG_LIKELY(t->shadow.depth > 0))
        t->shadow.depth--;
    /* valid is left alone: the slots above depth keep their values until
     * an enter with a different function or call site overwrites them. */
}

static uint32_t capture_shadow(struct tag_tls *t, void *ret)
{
    struct libtag_shadow *s = &t->shadow;
    uint32_t d = s->depth < TAG_SHADOW_MAX ? s->depth : TAG_SHADOW_MAX;
    if (s->valid < d) {
        for (uint32_t i = s->valid; i < d; i++) {
            if (t->used_parent[i] == s->id[i] && t->used_site[i] == s->site[i] && s->id[i + 1])
                continue;  /* this depth came back to what it was */
            t->used_parent[i] = s->id[i];
            t->used_site[i] = s->site[i];
            s->id[i + 1] = _tag_intern(t, s->id[i], TAG_FRAME_CALL, s->site[i]);
        }
        s->valid = d;
    }
    /* The innermost function's ENTRY node: the same as last time unless the
     * prefix or the function changed (a memo cheaper than the cache). */
    if (t->entry_parent != s->id[d] || t->entry_fn != s->fn[d - 1] || !t->entry_id) {
        t->entry_parent = s->id[d];
        t->entry_fn = s->fn[d - 1];
        t->entry_id = _tag_intern(t, s->id[d], TAG_FRAME_ENTRY, s->fn[d - 1]);
    }
    if (!ret)  /* from inside a trace hook: the shadow stack is the stack */
        return t->entry_id;
    return _tag_intern(t, t->entry_id, TAG_FRAME_CALL, (uint64_t)(uintptr_t)ret);
}

/* Walk saved frame pointers from frame (a frame of libtag's own entry
 * point, built with -fno-omit-frame-pointer).  Each step must move up the
 * stack, by less than 1 MiB, stay 8-aligned and below the thread's stack
 * top; anything else is not a frame chain and ends the walk. */
static uint32_t capture_frames(struct tag_tls *t, void *ret, void *frame)
{
    uint64_t pcs[128];
    uint32_t n = 0, max = _tag_opt.fp_depth;
    uintptr_t hi = (uintptr_t)t->rec->stack_hi;
    uintptr_t fp = (uintptr_t)frame;

    pcs[n++] = (uint64_t)(uintptr_t)ret;
    /* frame[0] = caller's frame pointer, frame[1] = return address (ret) */
    while (n < max && fp) {
        uintptr_t next = ((uintptr_t *)fp)[0];
        if (next <= fp || next - fp > (1u << 20) || (next & 7) ||
            (hi && next + 16 > hi))
            break;
        uintptr_t pc = ((uintptr_t *)next)[1];
        if (pc < 4096)
            break;
        pcs[n++] = pc;
        fp = next;
    }
    uint32_t id = 0;
    while (n > 0)
        id = _tag_intern(t, id, TAG_FRAME_CALL, pcs[--n]);
    return id;
}

uint32_t _tag_capture(struct tag_tls *t, void *ret, void *frame)
{
    if (TAG_LIKELY(t->shadow.depth > 0))
        return capture_shadow(t, ret);
    return capture_frames(t, ret, frame);
}

TAG_EXPORT uint32_t libtag_current_stack(void)
{
    _tag_ensure_init();
    return _tag_capture(_tag_self(), __builtin_return_address(0),
                        __builtin_frame_address(0));
}
