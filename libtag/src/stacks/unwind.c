/* unwind.c - stack capture: the shadow stack, frame pointers or CFI.
 *
 * LIBTAG_UNWIND picks where a stack comes from:
 *   shadow  the -finstrument-functions shadow stack plus the return address
 *           into the caller of malloc (one frame in other code);
 *   fp      a frame-pointer walk;
 *   cfi     a walk driven by each module's own .eh_frame (cfi.c);
 *   auto    (default) the shadow stack where the thread has instrumented
 *           frames - with CFI for the uninstrumented frames inside the
 *           innermost one (a library call that allocates) - and CFI
 *           elsewhere.
 *
 * Rules.  What it takes to step from a frame to its caller's is a property
 * of the code address: a rule (CFA = rsp/rbp + offset, return address at
 * CFA - 8, rbp saved at CFA - 8k or unchanged), found once from the CFI and
 * cached in `rules`, a lock-free direct-mapped table keyed by the return
 * address.  Filling a slot checks the address too: it must lie in an
 * executable segment of a loaded module, just after a call instruction (or
 * be the signal trampoline), else the rule is TAG_RULE_BAD and the walk
 * ends before it - no junk frames.  A warm step is a hash, two loads and the
 * rule's arithmetic.  An entry is two words written without a lock; the
 * rule word carries 16 bits derived from its key, so a reader that sees
 * one slot half rewritten sees a mismatch and takes the slow path.
 *
 * Bounds.  Every read of the stack lies within [the frame's sp, top of the
 * stack it is on): the thread's stack_hi, or the top of its alternate
 * signal stack when it runs on it.  Each step must move the CFA up.  A
 * signal frame (the return address is glibc's __restore_rt: mov $15,%rax;
 * syscall) continues in the interrupted code with the registers of its
 * sigcontext, as gdb does; that frame's pc is exact (TAG_FRAME_SIGNAL).
 *
 * Reuse.  A thread's last walk is kept (tag_thread_state.walk): per frame its
 * registers and what the step out of it read.  A new walk that reaches a
 * frame with the same pc, sp (and rbp, where the rest of the walk uses it)
 * as a frame of the last one, takes that frame's interned id for itself and
 * everything outer - after checking that every word the old walk read from
 * there on (return address slots, saved rbp slots, the word that ended it)
 * still holds the same value.  Same registers and same memory give the same
 * walk, so the reused id is exactly what a full walk would produce.  The
 * check is one or two loads per outer frame; nothing outer is looked up or
 * interned again.
 *
 * Fast check.  The usual capture is the last walk of its site all over
 * again: each kept walk has a header for its innermost frame (struct
 * tag_fast), which _tag_capture compares before anything else - pc, sp,
 * rbp where it matters, the code generation, then every word the walk
 * read.  Behind them, a small cache of complete walks (t->fast, 2 sets of
 * 8 ways by pc and sp) does the same for programs with more sites.  The
 * bounds need no test: a change of them (sigaltstack, the fork child)
 * forgets the walks.
 */
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <ucontext.h>

#include "base/base.h"
#include "base/options.h"
#include "base/prim.h"
#include "stacks/cfi.h"
#include "stacks/modules.h"
#include "stacks/shadow.h"
#include "stacks/stack_table.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"

/* The rule cache starts at 2^RULE_BITS_FIRST slots (16 KiB, in libtag's
 * .bss) and grows once, to 2^RULE_BITS_MAX (256 KiB), when filling it has
 * evicted an eighth of its size in other keys: a small program's return
 * addresses then stay in 16 KiB, not spread by the hash over all of a
 * 256 KiB table; a larger program grows it early.  The figures:
 * docs/design.md, "Our own CFI unwinder, not libunwind". */
#define RULE_BITS_FIRST 10
#define RULE_BITS_MAX 14
/* Keys of exact pcs (an interrupted instruction, not a return address). */
#define EXACT_KEY (1ull << 63)
#define CHECK_MASK (0xffffull << TAG_RULE_CHECK_SHIFT)
/* walk state flags beside TAG_WF_*: what a step used and read */
#define WS_EXACT TAG_WF_SIGNAL
#define TAG_WF_READ_BP 0x100u
#define WS_USES_BP 0x200u
#define WS_LOSES_BP 0x400u

struct rule_slot {
    uint64_t key, rule;
};
/* One table: its size and its slots together, so a reader that loads the
 * pointer always indexes within the table it loaded. */
struct rule_table {
    uint64_t bits;
    struct rule_slot s[];
};
static struct {
    struct rule_table t;
    struct rule_slot s[1u << RULE_BITS_FIRST];
} rules_first = {{RULE_BITS_FIRST}, {{0, 0}}};
static struct rule_table *rules = &rules_first.t;  /* release/acquire */
static uint32_t rules_evicted;  /* other keys the first table's fills overwrote (racy: a hint) */
uint64_t _tag_capture_total, _tag_capture_frames_total;

TAG_INLINE unsigned slot_of(const struct rule_table *rt, uint64_t key)
{
    return (unsigned)((key * TAG_MIX1) >> (64 - rt->bits));
}

TAG_INLINE uint64_t check_of(uint64_t key)
{
    return (key * TAG_MIX2) & CHECK_MASK;
}

TAG_INLINE uint64_t rule_get(uint64_t key)
{
    const struct rule_table *rt = __atomic_load_n(&rules, __ATOMIC_ACQUIRE);
    const struct rule_slot *e = &rt->s[slot_of(rt, key)];
    if (__atomic_load_n(&e->key, __ATOMIC_RELAXED) != key)
        return 0;
    uint64_t r = __atomic_load_n(&e->rule, __ATOMIC_RELAXED);
    return (r & CHECK_MASK) == check_of(key) ? r : 0;
}

/* Fill key's slot with rule; replace the first table by the large one
 * when its fills have evicted an eighth of its slots.  Lock-free and
 * async-signal-safe (a handler's capture fills too): the large table
 * starts empty - a cache - and is published with a compare-and-swap; a
 * thread that loses unmaps its own.  The first table stays (16 KiB of
 * .bss): a reader that loaded it before still reads whole entries. */
static void rule_put(uint64_t key, uint64_t rule)
{
    struct rule_table *rt = __atomic_load_n(&rules, __ATOMIC_ACQUIRE);
    struct rule_slot *e = &rt->s[slot_of(rt, key)];
    uint64_t was = __atomic_load_n(&e->key, __ATOMIC_RELAXED);
    __atomic_store_n(&e->rule, rule, __ATOMIC_RELAXED);
    __atomic_store_n(&e->key, key, __ATOMIC_RELEASE);
    if (!was || was == key || rt != &rules_first.t ||
        __atomic_add_fetch(&rules_evicted, 1, __ATOMIC_RELAXED) != (1u << RULE_BITS_FIRST) / 8)
        return;
    size_t bytes = sizeof *rt + ((size_t)1 << RULE_BITS_MAX) * sizeof rt->s[0];
    struct rule_table *big = _tag_map(bytes, 0);
    if (!big)
        return;  /* stays as it is */
    big->bits = RULE_BITS_MAX;
    struct rule_table *expect = rt;
    if (!__atomic_compare_exchange_n(&rules, &expect, big, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        _tag_unmap(big, bytes);
}

void _tag_unwind_flush(void)
{
    struct rule_table *rt = __atomic_load_n(&rules, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < 1u << rt->bits; i++)
        __atomic_store_n(&rt->s[i].key, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&_tag_code_gen, 1, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------ checks -- */

/* What a return address follows and the signal trampoline are the
 * machine's (base/arch.h: tag_arch_after_call, tag_arch_is_sigreturn). */
static int after_call(uintptr_t ra, const struct tag_module *m)
{
    return tag_arch_after_call(ra, m->lo);
}

static int is_sigreturn(uintptr_t pc, const struct tag_module *m)
{
    return tag_arch_is_sigreturn(pc, m->hi);
}

/* The rule for key, found from the module's CFI and cached.  may_rescan:
 * normal context (a capture), where an unknown pc may rescan the module
 * list.  TAG_RULE_NONE: unknown (not cached: a later dlopen may map it). */
static TAG_COLD uint64_t rule_miss(uint64_t key, int may_rescan)
{
    uintptr_t pc = (uintptr_t)(key & ~EXACT_KEY);
    int exact = (key & EXACT_KEY) != 0;
    if (tag_arch_pc_bad(pc))
        return TAG_RULE_BAD;
    struct tag_module m;
    if (!_tag_modules_enter())
        return TAG_RULE_NONE;
    int found = _tag_module_find(pc, &m, 0);
    if (!found && may_rescan) {
        _tag_modules_leave();  /* dl_iterate_phdr outside the bracket */
        _tag_module_find(pc, &m, 1);
        if (!_tag_modules_enter())
            return TAG_RULE_NONE;
        found = _tag_module_find(pc, &m, 0);
    }
    if (!found) {
        _tag_modules_leave();
        return TAG_RULE_NONE;
    }
    uint64_t rule;
    if (!exact && is_sigreturn(pc, &m))
        rule = TAG_RULE_SIGNAL;
    else if (!exact && !after_call(pc, &m))
        rule = TAG_RULE_BAD;
    else
        rule = _tag_cfi_rule(&m, exact ? pc : pc - 1);
#ifdef __aarch64__
    /* Past the first frame the walk follows frame records (step): the
     * sp a CFI rule starts from is known only at an exact pc. */
    if (!exact && (rule & TAG_RULE_TYPE) == TAG_RULE_CFA)
        rule = TAG_RULE_FP;
#endif
    _tag_modules_leave();
    rule |= check_of(key);
    rule_put(key, rule);
    return rule;
}

TAG_INLINE uint64_t rule_for(uint64_t key, int may_rescan)
{
    uint64_t r = rule_get(key);
    return TAG_LIKELY(r) ? r : rule_miss(key, may_rescan);
}

/* ------------------------------------------------------------- steps -- */

struct ustate {
    uint64_t pc, sp, bp;
    uint32_t flags;      /* TAG_WF_BP_KNOWN | WS_* */
    uint32_t bp_off;     /* set by a step that read rbp (TAG_WF_READ_BP) */
#ifdef __aarch64__
    uint64_t lr;         /* x30, at an exact pc (a signal context); else 0 */
#define USTATE_LR , 0
#else
#define USTATE_LR
#endif
};

struct bounds {
    uint64_t hi;                /* reads stay below */
    uint64_t stack_hi;          /* the thread's stack top */
    uint64_t alt_lo, alt_hi;    /* its alternate signal stack */
};

/* Which stack is sp on?  Sets the read bound; 0 = none libtag knows. */
static int bound_for(struct bounds *b, uint64_t sp)
{
    if (b->alt_hi && sp >= b->alt_lo && sp < b->alt_hi) {
        b->hi = b->alt_hi;
        return 1;
    }
    if (sp < b->stack_hi) {
        b->hi = b->stack_hi;
        return 1;
    }
    return 0;
}

/* Through a signal frame: s->sp is the handler's CFA, where the kernel put
 * the ucontext (struct rt_sigframe after its return address). */
static int signal_step(struct ustate *s, struct bounds *b)
{
#ifdef __aarch64__
    /* the frame pointer the handler was entered with: the kernel's frame
     * record above the sigcontext (base/arch_aarch64.h) */
    if (!(s->flags & TAG_WF_BP_KNOWN) || s->bp < s->sp || s->bp + 16 > b->hi)
        return 0;
    const uint64_t g = tag_arch_sigframe_regs(s->bp, s->sp);
    if (!g)
        return 0;
#else
    const uint64_t g = tag_arch_sigframe_regs(s->sp);
#endif
    if (g + TAG_ARCH_SIGFRAME_REGS_BYTES > b->hi || g < s->sp)
        return 0;
    uint64_t rip = TAG_ARCH_SIGFRAME_PC(g), rsp = TAG_ARCH_SIGFRAME_SP(g), rbp = TAG_ARCH_SIGFRAME_FP(g);
    if (!bound_for(b, rsp))
        return 0;
#ifdef __aarch64__
    s->lr = tag_arch_strip_pc(TAG_ARCH_SIGFRAME_LR(g));
#endif
    s->pc = rip;
    s->sp = rsp;
    s->bp = rbp;
    s->flags = TAG_WF_BP_KNOWN | WS_EXACT;
    return 1;
}

/* The frame pointer's rule of a CFA step (the caller's rbp / x29 saved
 * below the CFA, or lost); 0 when its slot is below the stack pointer. */
TAG_INLINE int step_bp(struct ustate *s, uint64_t rule, uint64_t cfa, uint64_t sp)
{
    if (rule & TAG_RULE_RBP_SAVED) {
        uint64_t at = cfa - 8 * ((rule >> TAG_RULE_SLOT_SHIFT) & 0xffff);
        if (at < sp)
            return 0;
        s->bp = *(const uint64_t *)at;
        s->bp_off = (uint32_t)(at - sp);
        s->flags |= TAG_WF_BP_KNOWN | TAG_WF_READ_BP;
    } else if (rule & TAG_RULE_RBP_LOST) {
        s->flags = (s->flags & ~TAG_WF_BP_KNOWN) | WS_LOSES_BP;
    }
    return 1;
}

/* Step from frame s to its caller's by rule.  Returns 0 when the walk ends
 * here.  Marks in s->flags what the step used and read (for reuse). */
TAG_INLINE int step(struct ustate *s, uint64_t rule, struct bounds *b, int fp_mode)
{
    uint64_t type = rule & TAG_RULE_TYPE, sp = s->sp, cfa, ra;
    s->flags &= ~(TAG_WF_READ_BP | WS_USES_BP | WS_LOSES_BP);
#ifdef __aarch64__
    /* An exact pc's CFI (rule_miss gives no other CFA rule here): the
     * return address in x30 (a leaf, a prologue) or saved below the CFA. */
    if (type == TAG_RULE_CFA && !fp_mode) {
        uint64_t base = sp;
        if (rule & TAG_RULE_CFA_RBP) {
            s->flags |= WS_USES_BP;
            if (!(s->flags & TAG_WF_BP_KNOWN))
                return 0;
            base = s->bp;
        }
        cfa = base + ((rule >> TAG_RULE_OFF_SHIFT) & TAG_RULE_OFF_MASK);
        if (cfa < sp || cfa > b->hi || (cfa & 7))
            return 0;
        if (rule & TAG_RULE_RA_LR) {
            ra = s->lr;
        } else {
            uint64_t at = cfa - 8 * ((rule >> TAG_RULE_RA_SHIFT) & TAG_RULE_RA_MASK);
            if (at < sp || at + 8 > b->hi)
                return 0;
            ra = *(const uint64_t *)at;
        }
        if (!step_bp(s, rule, cfa, sp))
            return 0;
        s->pc = tag_arch_strip_pc(ra);
        s->sp = cfa;
        s->lr = 0;
        s->flags &= ~WS_EXACT;
        return 1;
    }
#endif
    if (type == TAG_RULE_CFA && !fp_mode) {
        uint64_t base = sp;
        if (rule & TAG_RULE_CFA_RBP) {
            s->flags |= WS_USES_BP;
            if (!(s->flags & TAG_WF_BP_KNOWN))
                return 0;
            base = s->bp;
        }
        cfa = base + ((rule >> TAG_RULE_OFF_SHIFT) & 0xffffff);
        if (cfa < sp + 8 || cfa > b->hi || (cfa & 7))
            return 0;
        ra = ((const uint64_t *)cfa)[-1];
        if (!step_bp(s, rule, cfa, sp))
            return 0;
    } else if (type == TAG_RULE_CFA || type == TAG_RULE_FP) {
        /* frame pointers, if they look like a frame of this stack */
        uint64_t bp = s->bp;
        s->flags |= WS_USES_BP;
        if (!(s->flags & TAG_WF_BP_KNOWN) || bp < sp || (bp & 7) || bp - sp > (1u << 20) ||
            bp + 16 > b->hi)
            return 0;
        cfa = bp + 16;
        ra = tag_arch_strip_pc(((const uint64_t *)bp)[1]);
        s->bp = ((const uint64_t *)bp)[0];
        s->bp_off = (uint32_t)(bp - sp);
        s->flags |= TAG_WF_READ_BP;
    } else if (type == TAG_RULE_SIGNAL) {
        return signal_step(s, b);
    } else {
        return 0;
    }
    s->pc = ra;
    s->sp = cfa;
    s->flags &= ~WS_EXACT;
    return 1;
}

TAG_INLINE uint64_t key_of(const struct ustate *s)
{
    return s->pc | (s->flags & WS_EXACT ? EXACT_KEY : 0);
}

/* Walk from s into pcs/kinds, without reuse (signal context, nested
 * captures, the shadow hybrid).  stop_sp: end (returning count | bit 31)
 * when a step reaches this sp; 0 = none. */
static uint32_t walk_plain(struct ustate s, struct bounds *b, uint64_t *pcs, uint32_t *kinds,
                           uint32_t max, int may_rescan, uint64_t stop_sp)
{
    int fp_mode = _tag_opt.unwind == TAG_UNWIND_FP;
    uint32_t n = 0;
    while (n < max) {
        uint64_t rule = rule_for(key_of(&s), may_rescan);
        uint64_t type = rule & TAG_RULE_TYPE;
        if ((type == TAG_RULE_NONE || type == TAG_RULE_BAD) && n > 0)
            break;
        if (type != TAG_RULE_SIGNAL) {
            pcs[n] = s.pc;
            kinds[n] = s.flags & WS_EXACT ? TAG_FRAME_SIGNAL : TAG_FRAME_CALL;
            n++;
        }
        if (!step(&s, rule, b, fp_mode))
            break;
        if (stop_sp && s.sp >= stop_sp)
            return s.sp == stop_sp ? n | 0x80000000u : 0;
    }
    return stop_sp ? 0 : n;
}

/* ------------------------------------------------------ reusing walks -- */

/* Does the recorded walk, from its frame x outward, still hold on the
 * stack?  Every word it read from there on must read the same.  j: frames
 * the new walk has inside it.  The words are checked from the outermost
 * inward and the result kept in *ok / *bad (words proven, first changed
 * one): candidates come outward, each needing a prefix of the last one's
 * words, so a capture reads each word at most once. */
TAG_INLINE int still_holds(const struct tag_walk *w, uint32_t x, uint32_t j, uint32_t max,
                           uint32_t *ok, uint32_t *bad)
{
    uint32_t total = j + x + 1;
    if (w->stop == TAG_WALK_STOP_DEPTH ? total != max : total > max)
        return 0;
    uint32_t need = w->f[x].reads;
    if (need > *bad)
        return 0;
    for (uint32_t r = *ok; r < need; r++) {
        if (*(const uint64_t *)w->rd[r].addr != w->rd[r].value) {
            *bad = r;
            return 0;
        }
    }
    if (need > *ok)
        *ok = need;
    return 1;
}

TAG_INLINE int same_frame(const struct tag_walk_frame *f, const struct ustate *s)
{
    if (f->pc != s->pc || ((f->flags ^ s->flags) & TAG_WF_SIGNAL))
        return 0;
    return !(f->flags & TAG_WF_DEP_BP) ||
           (!((f->flags ^ s->flags) & TAG_WF_BP_KNOWN) && f->bp == s->bp);
}

static TAG_NOINLINE uint32_t walk_nested(struct ustate s, struct bounds *b, struct tag_thread_state *t)
{
    uint64_t pcs[32];
    uint32_t kinds[32];
    uint32_t n = walk_plain(s, b, pcs, kinds, 32, 1, 0), id = 0;
    while (n > 0) {
        n--;
        id = _tag_intern(t, id, kinds[n], pcs[n]);
    }
    return id;
}

/* Count a fast header's hits in the thread's captures, before it changes. */
TAG_INLINE void fast_settle(struct tag_thread_state *t, struct tag_fast *h)
{
    t->captures += h->hits;
    t->capture_frames += h->hits * h->frames;
    h->hits = 0;
}

#define FAST_WAYS 8
#define FAST_SET_BITS 3  /* TAG_FAST_SLOTS = FAST_WAYS << FAST_SET_BITS */
#define FAST_KIN 4       /* ways of one set for walks of one frame and caller */
_Static_assert(TAG_FAST_SLOTS == FAST_WAYS << FAST_SET_BITS, "fast cache shape");
_Static_assert(sizeof(((struct tag_thread_state *)0)->fast_last) == 16, "fast_last");
/* The hint of (pc, sp): the way of its set that answered its last capture.
 * By key, not by set: the two call sites of one allocation helper (its
 * realloc and its free) share a set as often as not, and one hint for
 * both would point at the other's walk every time they alternate. */
TAG_INLINE unsigned fast_hint(uint64_t pc, uint64_t sp)
{
    return (unsigned)((pc ^ (pc >> 5) ^ (sp >> 4)) & 15);
}

/* The first entry of (pc, sp)'s set.  A set holds walks from the same
 * innermost frame too: a helper that allocates for several callers. */
TAG_INLINE unsigned fast_slot(uint64_t pc, uint64_t sp)
{
    return (unsigned)(((pc ^ (sp << 12)) * TAG_MIX1) >> (64 - FAST_SET_BITS)) * FAST_WAYS;
}

/* Arm the fast checks of walk w (n > 0) for its innermost frame: w's own
 * header and, when its words fit, the cache entry of that frame. */
static void fast_set(struct tag_thread_state *t, struct tag_walk *w)
{
    const struct tag_walk_frame *f = &w->f[w->n - 1];
    struct tag_fast h = {0, f->sp, f->bp, f->flags & TAG_WF_DEP_BP ? ~0ull : 0,
                         f->id, f->reads, w->gen, w->n, 0, 0};
    struct tag_fast *wh = &w->fast;
    *wh = h;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    wh->pc = f->pc;
    if (f->reads > TAG_FAST_READS)
        return;
    /* An empty way, else the way filled longest ago - unless FAST_KIN
     * ways already hold walks from this frame to the same caller (the same
     * innermost word read): then the oldest of those, so a frame whose
     * outer stack keeps changing (recursion) cannot take the whole set.
     * A few such walks may alternate: lua's allocator, called from one
     * helper for tables, arrays and the collector, has 3-4 (one way for
     * them missed on 1.6 M of its 12.8 M captures, 4 on 260). */
    struct tag_fast_entry *set = &t->fast[fast_slot(f->pc, f->sp)], *e = set, *kin = NULL;
    const struct tag_walk_read *last = h.reads ? &w->rd[h.reads - 1] : NULL;
    unsigned kins = 0;
    for (unsigned i = 0; i < FAST_WAYS; i++) {
        struct tag_fast_entry *x = &set[i];
        if (x->h.pc == f->pc && x->h.sp == f->sp && x->h.reads && last &&
            x->rd[x->h.reads - 1].addr == last->addr && x->rd[x->h.reads - 1].value == last->value) {
            kins++;
            if (!kin || (int32_t)(x->h.stamp - kin->h.stamp) < 0)
                kin = x;
        }
        if (e->h.pc && (!x->h.pc || (int32_t)(x->h.stamp - e->h.stamp) < 0))
            e = x;
    }
    if (kins >= FAST_KIN)
        e = kin;
    if (e->h.pc == f->pc && e->h.sp == f->sp && e->h.gen == h.gen && e->h.id == h.id &&
        e->h.reads == h.reads && !memcmp(e->rd, w->rd, h.reads * sizeof e->rd[0]))
        return;  /* already there */
    e->h.pc = 0;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    fast_settle(t, &e->h);
    h.stamp = ++t->fast_clock;
    e->h = h;
    memcpy(e->rd, w->rd, f->reads * sizeof e->rd[0]);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    e->h.pc = f->pc;
}

/* The fast check: is this capture, from the innermost frame (pc, frame),
 * the very walk h describes - the same registers, the same rules (gen) and
 * the same bounds (_tag_unwind_forget), and every word it read still the
 * same?  Then a full walk would give the same frames: its id is the
 * answer, without a rule lookup or an intern.  One load per word. */
TAG_INLINE int fast_check(struct tag_thread_state *t, struct tag_fast *h, const struct tag_walk_read *p,
                          const uint64_t *frame, uint32_t *id)
{
    if (((h->bp ^ frame[0]) & h->bp_mask) ||
        h->gen != __atomic_load_n(&_tag_code_gen, __ATOMIC_ACQUIRE))
        return 0;
    /* a signal handler's capture meanwhile must not rewrite h (a count:
     * this may itself run in a handler inside a walk) */
    t->in_walk++;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    uint32_t n = h->reads;
    const struct tag_walk_read *e = p + n;
    uint64_t diff = 0;
    if (n > 8) {
        /* A long walk: four words a round, innermost first
         * (rd[] runs outermost to innermost), leaving at the first round
         * that differs.  Walks from one frame to one caller (the cache's
         * kin, fast_set) part near the inner end, so a way that is not
         * this walk fails in a round or two, not after all its words. */
        for (uint32_t k = n >> 2; k > 0; k--) {
            e -= 4;
            diff = (*(const uint64_t *)e[0].addr ^ e[0].value) |
                   (*(const uint64_t *)e[1].addr ^ e[1].value) |
                   (*(const uint64_t *)e[2].addr ^ e[2].value) |
                   (*(const uint64_t *)e[3].addr ^ e[3].value);
            if (diff)
                break;
        }
        if (!diff)
            for (uint32_t k = n & 3; k > 0; k--) {
                e--;
                diff |= *(const uint64_t *)e->addr ^ e->value;
            }
    } else {
        /* a short walk: every word, one branch - a load, a xor and an
         * or per word, two words a round */
        if (n & 1) {
            diff = *(const uint64_t *)p->addr ^ p->value;
            p++;
        }
        for (; p < e; p += 2)
            diff |= (*(const uint64_t *)p[0].addr ^ p[0].value) |
                    (*(const uint64_t *)p[1].addr ^ p[1].value);
    }
    int hit = diff == 0;
    *id = h->id;  /* read by the caller on a hit only */
    if (TAG_LIKELY(hit))
        h->hits++;  /* counted in captures by fast_settle */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    t->in_walk--;
    return hit;
}

/* One of the two kept walks: the usual answer, the last walk of this
 * site. */
TAG_INLINE int fast_hit(struct tag_thread_state *t, uint64_t pc, const uint64_t *frame, uint32_t *id)
{
    uint64_t sp = (uint64_t)(uintptr_t)(frame + 2);  /* as entry_state */
    struct tag_walk *w = &t->walk[0];
    if (w->fast.pc != pc || w->fast.sp != sp) {
        w = &t->walk[1];
        if (w->fast.pc != pc || w->fast.sp != sp)
            return 0;
    }
    return fast_check(t, &w->fast, w->rd, frame, id);
}

void _tag_unwind_forget(struct tag_thread_state *t)
{
    _tag_unwind_settle(t);
    for (unsigned i = 0; i < TAG_WALKS; i++) {
        t->walk[i].fast.pc = 0;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        t->walk[i].n = 0;
    }
    for (unsigned i = 0; i < TAG_FAST_SLOTS; i++)
        t->fast[i].h.pc = 0;
}

void _tag_unwind_settle(struct tag_thread_state *t)
{
    for (unsigned i = 0; i < TAG_WALKS; i++)
        fast_settle(t, &t->walk[i].fast);
    for (unsigned i = 0; i < TAG_FAST_SLOTS; i++)
        fast_settle(t, &t->fast[i].h);
}

/* Which of the thread's two kept walks a walk from pc reuses: the one
 * whose innermost frame is pc, else the one used longer ago.  Two walks
 * are kept: allocations and frees usually come from two different places,
 * and each finds its own. */
TAG_INLINE struct tag_walk *walk_pick(struct tag_thread_state *t, uint64_t pc)
{
    struct tag_walk *w = &t->walk[0];
    if (w->n == 0 || w->f[w->n - 1].pc != pc) {
        w = &t->walk[1];
        if (w->n == 0 || w->f[w->n - 1].pc != pc)
            w = &t->walk[t->walk_lru];
    }
    t->walk_lru = w == &t->walk[0];  /* the other one goes next */
    return w;
}

/* How the step out of a walk ended (walk_out). */
struct walk_end {
    uint32_t n;        /* new frames, in t->walk_new, innermost first */
    uint32_t stop;     /* TAG_WALK_STOP_*: why it ended by itself */
    int32_t junction;  /* the frame of w it reached, proven unchanged; -1 */
    int keep;          /* w may keep this walk for reuse */
    int stop_read;     /* the word below s's sp ended it (no return address) */
};

/* Step out from *s, recording each new frame in t->walk_new, until a frame
 * of the kept walk w whose words still hold (the junction: the rest is
 * w's), the end of the stack, or max frames.  *s is left at the state the
 * last step reached. */
TAG_INLINE struct walk_end walk_out(struct tag_thread_state *t, struct tag_walk *w, struct ustate *s,
                                    struct bounds *b, uint32_t gen)
{
    uint32_t max = _tag_opt.fp_depth < TAG_WALK_MAX ? _tag_opt.fp_depth : TAG_WALK_MAX;
    int fp_mode = _tag_opt.unwind == TAG_UNWIND_FP;
    struct tag_walk_new *nf = t->walk_new;
    /* The words it read lie below the top of the stack it was on: reuse
     * only on the same one (an alternate stack may have been set anew). */
    int32_t cur = w->n && w->gen == gen && w->hi == b->hi ? (int32_t)w->n - 1 : -1;
    uint32_t ok_reads = 0, bad_read = UINT32_MAX;
    struct walk_end end = {.stop = TAG_WALK_STOP_FIXED, .junction = -1, .keep = 1};

    for (;;) {
        if (cur >= 0) {
            while (cur >= 0 && w->f[cur].sp < s->sp)
                cur--;
            if (cur >= 0 && w->f[cur].sp == s->sp && same_frame(&w->f[cur], s) &&
                still_holds(w, (uint32_t)cur, end.n, max, &ok_reads, &bad_read)) {
                end.junction = cur;
                break;
            }
        }
        uint64_t rule = rule_for(key_of(s), 1);
        uint64_t type = rule & TAG_RULE_TYPE;
        if ((type == TAG_RULE_NONE || type == TAG_RULE_BAD) && end.n > 0) {
            /* the word below s->sp was no return address: that word is
             * what ended the walk */
            end.stop_read = 1;
            if (type == TAG_RULE_NONE)
                end.keep = 0;  /* may be known after a dlopen: keep nothing */
            break;
        }
        if (type == TAG_RULE_SIGNAL) {
            /* the trampoline is no frame of its own; a walk through a
             * signal frame read the sigcontext: not kept for reuse */
            end.keep = 0;
            if (!step(s, rule, b, fp_mode))
                break;
            continue;
        }
        struct tag_walk_new *e = &nf[end.n++];
        e->pc = s->pc;
        e->sp = s->sp;
        e->bp = s->bp;
        e->flags = s->flags & (TAG_WF_BP_KNOWN | WS_EXACT);
        if (end.n == max) {
            end.stop = TAG_WALK_STOP_DEPTH;
            break;
        }
        int ok = step(s, rule, b, fp_mode);
        e->flags |= s->flags & (TAG_WF_READ_BP | WS_USES_BP | WS_LOSES_BP);
        e->bp_off = s->bp_off;
        if (!ok)
            break;
    }
    return end;
}

/* Intern the walk's new frames outermost first under parent (the
 * junction's id, or the root), and write them into w after its first base
 * frames, with the words each step read: the step out of new frame k read
 * what gave the next-outer one (frame k + 1, or the junction's state s).
 * reads, dep: w's reads up to the junction, and whether the junction's
 * frame depends on its rbp.  Returns the innermost frame's id; a full
 * table clears end->keep. */
TAG_INLINE uint32_t walk_record(struct tag_thread_state *t, struct tag_walk *w, struct walk_end *end,
                                const struct ustate *s, uint32_t parent, uint32_t base,
                                uint32_t reads, uint32_t dep)
{
    const struct tag_walk_new *nf = t->walk_new;
    uint32_t n = end->n;
    for (uint32_t k = n; k-- > 0;) {
        const struct tag_walk_new *e = &nf[k];
        struct tag_walk_frame *f = &w->f[base + (n - 1 - k)];
        if (k + 1 < n || end->junction >= 0) {
            uint64_t nsp = k + 1 < n ? nf[k + 1].sp : s->sp;
            uint64_t npc = k + 1 < n ? nf[k + 1].pc : s->pc;
            uint64_t nbp = k + 1 < n ? nf[k + 1].bp : s->bp;
            w->rd[reads].addr = nsp - 8;
            w->rd[reads++].value = npc;
            /* the rbp it read matters only if the walk outward uses it
             * (dep: the next-outer frame depends on its rbp) */
            if ((e->flags & TAG_WF_READ_BP) && dep) {
                w->rd[reads].addr = e->sp + e->bp_off;
                w->rd[reads++].value = nbp;
            }
            dep = (e->flags & WS_USES_BP) ||
                  (!(e->flags & (TAG_WF_READ_BP | WS_LOSES_BP)) && dep);
        } else {
            /* the outermost frame of a walk that ended by itself */
            if (end->stop_read) {
                w->rd[reads].addr = s->sp - 8;
                w->rd[reads++].value = s->pc;
            }
            dep = (e->flags & WS_USES_BP) != 0;
        }
        parent = _tag_intern(t, parent, e->flags & WS_EXACT ? TAG_FRAME_SIGNAL : TAG_FRAME_CALL,
                             e->pc);
        if (!parent)
            end->keep = 0;  /* the table is full: do not reuse a truncated id */
        f->pc = e->pc;
        f->sp = e->sp;
        f->bp = e->bp;
        f->id = parent;
        f->flags = (uint16_t)((e->flags & (TAG_WF_BP_KNOWN | TAG_WF_SIGNAL)) |
                              (dep ? TAG_WF_DEP_BP : 0));
        f->reads = (uint16_t)reads;
    }
    return parent;
}

/* A walk from s that stops at the first frame it shares with one of the
 * thread's last walks (walk_pick, walk_out), then takes that frame's id
 * and rewrites the record from there inward (walk_record). */
static uint32_t walk_capture(struct tag_thread_state *t, struct ustate s, struct bounds *b)
{
    if (TAG_UNLIKELY(t->in_walk))
        return walk_nested(s, b, t);
    t->in_walk = 1;
    struct tag_walk *w = walk_pick(t, s.pc);
    /* no fast check of w while it is rewritten (a signal handler's
     * capture may look at it) */
    w->fast.pc = 0;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    fast_settle(t, &w->fast);
    uint32_t gen = __atomic_load_n(&_tag_code_gen, __ATOMIC_ACQUIRE);
    struct walk_end end = walk_out(t, w, &s, b, gen);
    uint32_t n = end.n;

    uint32_t parent = 0, base = 0, reads = 0, dep = 0;
    if (end.junction >= 0) {
        const struct tag_walk_frame *jf = &w->f[end.junction];
        parent = jf->id;
        if (n == 0 && (uint32_t)end.junction == w->n - 1) {
            /* the very same stack as last time */
            fast_set(t, w);
            t->in_walk = 0;
            t->captures++;
            t->capture_frames += w->n;
            return parent;
        }
        base = (uint32_t)end.junction + 1;
        reads = jf->reads;
        dep = (jf->flags & TAG_WF_DEP_BP) != 0;
        /* w->stop stays: the outer part ends as it did */
    } else {
        w->stop = end.stop;
    }
    if (base + n > TAG_WALK_KEEP) {
        /* too deep to keep: intern only */
        const struct tag_walk_new *nf = t->walk_new;
        for (uint32_t k = n; k-- > 0;)
            parent = _tag_intern(t, parent, nf[k].flags & WS_EXACT ? TAG_FRAME_SIGNAL : TAG_FRAME_CALL,
                                 nf[k].pc);
        w->n = 0;
        t->in_walk = 0;
        t->captures++;
        t->capture_frames += base + n;
        return parent;
    }
    parent = walk_record(t, w, &end, &s, parent, base, reads, dep);
    uint32_t total = base + n;
    w->n = end.keep ? total : 0;
    w->gen = gen;
    w->hi = b->hi;
    if (end.keep)
        fast_set(t, w);
    t->in_walk = 0;
    t->captures++;
    t->capture_frames += total;
    return parent;
}

/* ----------------------------------------------------------- capture -- */

/* The state of the caller of libtag's entry point: its frame has frame
 * pointers, so frame[0] is the caller's rbp and its CFA the caller's sp. */
TAG_INLINE struct ustate entry_state(void *ret, void *frame)
{
    const uint64_t *fp = frame;
    struct ustate s = {(uint64_t)(uintptr_t)ret, (uint64_t)(uintptr_t)(fp + 2), fp[0],
                       TAG_WF_BP_KNOWN, 0 USTATE_LR};
    return s;
}

TAG_INLINE void bounds_of(struct tag_thread_state *t, struct bounds *b)
{
    b->stack_hi = t->stack_hi;
    b->alt_lo = t->alt_lo;
    b->alt_hi = t->alt_hi;
    b->hi = 0;
}

/* The memo entry of a shadow capture from pc under calling context cc. */
TAG_INLINE struct tag_cap_memo *cap_memo_of(struct tag_thread_state *t, uint64_t cc, uint64_t pc)
{
    return &t->cap_memo[((cc ^ pc) * TAG_MIX1) >> (64 - TAG_CAP_MEMO_BITS)];
}

/* Remember the stack id of a shadow capture from pc at stack pointer sp
 * (see tag_thread_state.cap_memo); its entries alive (the capture checked them). */
TAG_INLINE void cap_memo_put(struct tag_thread_state *t, uint64_t pc, uint64_t sp, uint32_t id)
{
    uint32_t d = t->shadow.depth;
    if (d - 1u >= TAG_SHADOW_MAX || !id)
        return;
    uint64_t off = t->shadow.sp[d - 1] - sp;
    if (off >> 32)
        return;
    uint64_t cc = _tag_shadow_cc(t, d);
    struct tag_cap_memo *m = cap_memo_of(t, cc, pc);
    m->cc = cc;
    m->pc = pc;
    m->fn = t->shadow.fn[d - 1];
    m->off = (uint32_t)off;
    m->gen = __atomic_load_n(&_tag_code_gen, __ATOMIC_RELAXED);
    m->id = id;
}

/* auto with instrumented frames: CFI from the allocation up to the
 * innermost instrumented function (frames the shadow stack does not see,
 * e.g. strdup called from it), then the shadow stack. */
static uint32_t capture_hybrid(struct tag_thread_state *t, struct ustate s, struct bounds *b)
{
    uint32_t top = t->shadow.depth <= TAG_SHADOW_MAX ? t->shadow.depth - 1 : TAG_SHADOW_MAX - 1;
    uint64_t target = t->shadow.sp[top];
    t->captures++;
    t->capture_frames += 1 + t->shadow.depth;
    /* The usual case first: malloc's caller is the instrumented function
     * itself (its CFA is the innermost entry's).  One rule, no walk. */
#ifdef __aarch64__
    /* (no rule: past the first frame the walk's step is the frame
     * record's, which ends at the entry's CFA when it is the function's) */
    if (TAG_LIKELY(s.bp + 16 == target)) {
#else
    uint64_t rule = rule_for(s.pc, 1);
    if (TAG_LIKELY((rule & (TAG_RULE_TYPE | TAG_RULE_CFA_RBP)) == TAG_RULE_CFA) &&
        s.sp + ((rule >> TAG_RULE_OFF_SHIFT) & 0xffffff) == target) {
#endif
        uint32_t id = _tag_intern(t, _tag_shadow_id(t), TAG_FRAME_CALL, s.pc);
        cap_memo_put(t, s.pc, s.sp, id);
        return id;
    }
    uint64_t pcs[32];
    uint32_t kinds[32];
    uint32_t n = 0;
    if (!(target & 1) && t->shadow.depth <= TAG_SHADOW_MAX && bound_for(b, s.sp))
        n = walk_plain(s, b, pcs, kinds, 32, 1, target) & 0x7fffffffu;
    if (n == 0) {
        /* no walk to the instrumented frame: the caller of malloc alone */
        pcs[0] = s.pc;
        kinds[0] = TAG_FRAME_CALL;
        n = 1;
    }
    t->capture_frames += n - 1;
    uint32_t id = _tag_shadow_id(t);
    while (n > 0) {
        n--;
        id = _tag_intern(t, id, kinds[n], pcs[n]);
    }
    return id;
}

/* The innermost shadow entry is alive, seen from stack pointer cur: the
 * common case, without a call to the full check. */
TAG_INLINE int top_alive(const struct tag_thread_state *t, uint64_t cur)
{
    uint32_t d = t->shadow.depth;
    if (d > TAG_SHADOW_MAX)
        return 0;
    uint64_t e = t->shadow.sp[d - 1];
    return e > cur && e < t->pop_limit &&
           ((e & 1) || tag_arch_slot_ra(e) == t->shadow.site[d - 1]);
}

#ifdef LIBTAG_DEBUG
/* The debug build checks, at every shadow capture, that every entry below
 * the innermost on this thread's stack above sp still holds its call
 * site: no dead entry survived _tag_shadow_settle. */
static void shadow_verify(const struct tag_thread_state *t, uint64_t sp)
{
    uint32_t d = t->shadow.depth;
    if (d > TAG_SHADOW_MAX)
        return;
    for (uint32_t i = 0; i + 1 < d; i++) {
        uint64_t e = t->shadow.sp[i];
        if (!(e & 1) && e > sp && e <= t->stack_hi)
            TAG_ASSERT(tag_arch_slot_ra(e) == t->shadow.site[i]);
    }
}
#endif

/* Everything but the fast check: the shadow stack, a walk. */
/* noclone: _tag_capture jumps here with its own arguments, as they are */
static TAG_NOINLINE __attribute__((noclone)) uint32_t capture_slow(struct tag_thread_state *t, void *ret,
                                                                 void *frame)
{
    if (!ret)  /* a trace hook's frame: its return address is the pc */
        ret = ((void **)frame)[1];
    struct ustate s = entry_state(ret, frame);
    int mode = _tag_opt.unwind;
    if (mode == TAG_UNWIND_AUTO || mode == TAG_UNWIND_SHADOW) {
        /* shadow entries here come from capture_memo, which settled them
         * (_tag_capture sends every capture with 1..max entries there) */
        if (t->shadow.depth > 0 && (top_alive(t, s.sp) || _tag_shadow_pop(t, s.sp, 0, 0) > 0)) {
            struct bounds b;
            bounds_of(t, &b);
            if (mode == TAG_UNWIND_AUTO)
                return capture_hybrid(t, s, &b);
            t->captures++;
            t->capture_frames += 1 + t->shadow.depth;
            uint32_t id = _tag_intern(t, _tag_shadow_id(t), TAG_FRAME_CALL, s.pc);
            cap_memo_put(t, s.pc, s.sp, id);
            return id;
        }
        if (mode == TAG_UNWIND_SHADOW) {
            t->captures++;
            t->capture_frames++;
            return _tag_intern(t, 0, TAG_FRAME_CALL, s.pc);
        }
    }
    struct bounds b;
    bounds_of(t, &b);
    if (!bound_for(&b, s.sp)) {
        t->captures++;
        t->capture_frames++;
        return _tag_intern(t, 0, TAG_FRAME_CALL, s.pc);
    }
    return walk_capture(t, s, &b);
}

#ifdef LIBTAG_DEBUG
/* The debug build checks every fast answer against a plain walk. */
static TAG_NOINLINE void fast_verify(struct tag_thread_state *t, void *ret, void *frame, uint32_t id)
{
    struct ustate s = entry_state(ret, frame);
    struct bounds b;
    bounds_of(t, &b);
    TAG_ASSERT(bound_for(&b, s.sp));
    uint64_t pcs[TAG_WALK_MAX];
    uint32_t kinds[TAG_WALK_MAX];
    uint32_t max = _tag_opt.fp_depth < TAG_WALK_MAX ? _tag_opt.fp_depth : TAG_WALK_MAX;
    uint32_t n = walk_plain(s, &b, pcs, kinds, max, 1, 0), want = 0;
    while (n > 0) {
        n--;
        want = _tag_intern(t, want, kinds[n], pcs[n]);
    }
    TAG_ASSERT(want == id);
}
#endif

/* The fast check in the cache: each way of the set of (ret, sp) holding
 * a walk from there.  Then the rest. */
static TAG_NOINLINE __attribute__((noclone)) uint32_t capture_cached(struct tag_thread_state *t, void *ret,
                                                                    void *frame)
{
    uint64_t pc = (uint64_t)(uintptr_t)ret, sp = (uint64_t)(uintptr_t)((uint64_t *)frame + 2);
    unsigned first = fast_slot(pc, sp), hint = fast_hint(pc, sp), last = t->fast_last[hint];
    struct tag_fast_entry *c = &t->fast[first];
    uint32_t id;
    /* the way that answered last first: a helper that allocates for
     * several callers often serves one of them many times in a row */
    if (c[last].h.pc == pc && c[last].h.sp == sp && fast_check(t, &c[last].h, c[last].rd, frame, &id))
        goto hit;
    for (unsigned i = 0; i < FAST_WAYS; i++, c++) {
        if (i != last && c->h.pc == pc && c->h.sp == sp && fast_check(t, &c->h, c->rd, frame, &id)) {
            t->fast_last[hint] = (uint8_t)i;
            goto hit;
        }
    }
    return capture_slow(t, ret, frame);
hit:
#ifdef LIBTAG_DEBUG
    fast_verify(t, ret, frame, id);
#endif
    return id;
}

#ifdef LIBTAG_DEBUG
/* The debug build checks every memo hit against the capture it stands
 * for (its counters left as they were). */
static TAG_NOINLINE void memo_verify(struct tag_thread_state *t, void *ret, void *frame, uint32_t id)
{
    uint64_t captures = t->captures, frames = t->capture_frames;
    struct bounds b;
    bounds_of(t, &b);
    struct ustate s = entry_state(ret, frame);
    uint32_t want = _tag_opt.unwind == TAG_UNWIND_AUTO
                        ? capture_hybrid(t, s, &b)
                        : _tag_intern(t, _tag_shadow_id(t), TAG_FRAME_CALL, s.pc);
    t->captures = captures;
    t->capture_frames = frames;
    TAG_ASSERT(want == id);
}
#endif

/* The hook cache's CFA offset (from the hook's CFA) for the enter hook
 * returning to ra; 0 if it holds none. */
TAG_INLINE uint64_t hook_probe(const struct tag_thread_state *t, uint64_t ra)
{
    const struct tag_hook_set *h = &t->hook_cache[TAG_HOOK_SET(ra)];
    for (unsigned w = 0; w < TAG_HOOK_WAYS; w++)
        if (h->ra[w] == ra)
            return h->off[w];
    return 0;
}

/* Shadow entry i alive, seen from cur, where span = stack_hi - cur > 0:
 * only a lower bound of its CFA (nothing to check), or its CFA on this
 * thread's stack above cur with its return address slot holding its call
 * site.  Entries on an alternate signal stack are for the full settle. */
TAG_INLINE int memo_alive(const struct tag_thread_state *t, uint32_t i, uint64_t cur, uint64_t span)
{
    uint64_t e = t->shadow.sp[i];
    return (e & 1) || (e - cur - 1 < span && tag_arch_slot_ra(e) == t->shadow.site[i]);
}

/* _tag_shadow_settle and _tag_shadow_cc in one pass over the depths
 * pushed since the last capture, in the usual case: each entry's CFA
 * found from the hook cache where its enter left a lower bound
 * (_tag_shadow_resolve's first step), below the entry outside it (or at
 * it, for another function: the host of an inlined one), and alive on
 * this thread's own stack.  0 for anything else (nothing changed but the
 * CFAs found: the caller takes the two steps, which resolve the rest and
 * repair). */
TAG_INLINE int memo_cc(struct tag_thread_state *t, uint64_t cur, uint32_t d, uint64_t *out)
{
    uint32_t v = t->cc_valid;
    if (TAG_LIKELY(v >= d)) {
        *out = t->cc[d];
        return 1;
    }
    uint64_t hi = t->stack_hi;
    if (hi <= cur)
        return 0;
    uint64_t span = hi - cur, cc = t->cc[v];
    /* the entry below the first changed one (the innermost, d - 1, is
     * the caller's to check: top_alive) */
    if (v > 0 && !memo_alive(t, v - 1, cur, span))
        return 0;
    uint64_t outer = v > 0 ? t->shadow.sp[v - 1] & ~1ull : ~0ull;  /* 8-aligned: never equal */
    for (uint32_t i = v; i < d; i++) {
        uint64_t e = t->shadow.sp[i];
        if (e & 1) {
            uint64_t ra = t->hook_ra[i];
            const struct tag_hook_set *h = &t->hook_cache[TAG_HOOK_SET(ra)];
            uint64_t off = TAG_LIKELY(h->ra[0] == ra) ? h->off[0] : hook_probe(t, ra);
            e = t->hook_sp[i] + off;
            if (!off || e - cur - 1 >= span || tag_arch_slot_ra(e) != t->shadow.site[i])
                return 0;
            t->shadow.sp[i] = e;
        } else if (i + 1 < d && !memo_alive(t, i, cur, span)) {
            return 0;
        }
        if (!_tag_shadow_inside(t, i, e, outer))  /* i = 0: outer is ~0 */
            return 0;
        outer = e;
        cc = _tag_cc_step(cc, t->shadow.site[i]);
        t->cc[i + 1] = cc;  /* beyond cc_valid until the end: unused if we leave */
    }
    if (t->shadow.valid > v)
        t->shadow.valid = v;  /* as _tag_shadow_cc */
    t->cc_valid = d;
    *out = cc;
    return 1;
}

/* The memo's answer for a capture from pc at sp under calling context cc,
 * the innermost entry (depth d) alive; 0 if it has none. */
TAG_INLINE uint32_t memo_get(struct tag_thread_state *t, uint64_t cc, uint64_t pc, uint64_t sp, uint32_t d)
{
    const struct tag_cap_memo *m = cap_memo_of(t, cc, pc);
    if (m->cc == cc && m->pc == pc && m->fn == t->shadow.fn[d - 1] &&
        m->off == t->shadow.sp[d - 1] - sp &&
        m->gen == __atomic_load_n(&_tag_code_gen, __ATOMIC_RELAXED) && m->id) {
        t->captures++;
        t->capture_frames += 1 + d;
        return m->id;
    }
    return 0;
}

/* A shadow capture the memo knows: the innermost entry alive, the same
 * pc, function, prefix and CFA offset as a capture before. */
static TAG_NOINLINE __attribute__((noclone)) uint32_t capture_memo(struct tag_thread_state *t, void *ret, void *frame)
{
    if (!ret)  /* a trace hook's frame: its return address is the pc */
        ret = ((void **)frame)[1];
    uint64_t sp = (uint64_t)(uintptr_t)frame + 16, pc = (uint64_t)(uintptr_t)ret, cc;
    uint32_t d = t->shadow.depth, id = 0;
    if (TAG_LIKELY(d > 0 && top_alive(t, sp) && memo_cc(t, sp, d, &cc))) {
        id = memo_get(t, cc, pc, sp, d);
    } else {
        /* a dead entry, or one on another stack: settle, which repairs */
        _tag_shadow_settle(t, sp);
        d = t->shadow.depth;
        if (d > 0 && top_alive(t, sp))
            id = memo_get(t, _tag_shadow_cc(t, d), pc, sp, d);
    }
#ifdef LIBTAG_DEBUG
    shadow_verify(t, sp);
    if (id)
        memo_verify(t, ret, frame, id);
#endif
    return id ? id : capture_slow(t, ret, frame);
}

/* The fast checks first, in a function of its own that needs no stack
 * frame (every other way out is a jump).  Where the shadow stack answers
 * (auto or shadow, with instrumented frames on this thread): the memo of
 * shadow captures.  Otherwise the two kept walks, then the cache. */
__attribute__((noclone))  /* under LTO: t in a register, not _tag_tls.t loaded again */
uint32_t _tag_capture(struct tag_thread_state *t, void *ret, void *frame)
{
    uint32_t id;
    if (t->shadow.depth != 0 && _tag_opt.unwind < TAG_UNWIND_FP)
        return t->shadow.depth <= TAG_SHADOW_MAX ? capture_memo(t, ret, frame)
                                                 : capture_slow(t, ret, frame);
    if (TAG_UNLIKELY(ret == NULL))
        return capture_slow(t, ret, frame);
    if (TAG_LIKELY(fast_hit(t, (uint64_t)(uintptr_t)ret, frame, &id))) {
#ifdef LIBTAG_DEBUG
        fast_verify(t, ret, frame, id);
#endif
        return id;
    }
    return capture_cached(t, ret, frame);
}

/* ---------------------------------------------------- signal context -- */

uint32_t _tag_unwind_uc(struct tag_thread_state *t, const struct ucontext_t *ucv,
                        uint64_t *pcs, uint32_t *kinds, uint32_t max)
{
    const ucontext_t *uc = (const ucontext_t *)ucv;
    struct ustate s = {tag_uc_pc(uc), tag_uc_sp(uc), tag_uc_fp(uc), TAG_WF_BP_KNOWN | WS_EXACT, 0 USTATE_LR};
#ifdef __aarch64__
    s.lr = tag_arch_strip_pc(tag_uc_lr(uc));
#endif
    struct bounds b;
    if (!t)
        t = &_tag_tls_none;  /* no state: bounds unknown, read only */
    bounds_of(t, &b);
    /* the kernel saved the alternate stack in effect with the context */
    if (uc->uc_stack.ss_size && !(uc->uc_stack.ss_flags & SS_DISABLE)) {
        b.alt_lo = (uint64_t)(uintptr_t)uc->uc_stack.ss_sp;
        b.alt_hi = b.alt_lo + uc->uc_stack.ss_size;
    }
    if (max == 0)
        return 0;
    if (!bound_for(&b, s.sp)) {
        pcs[0] = s.pc;
        kinds[0] = TAG_FRAME_SIGNAL;
        return 1;
    }
    return walk_plain(s, &b, pcs, kinds, max, 0, 0);
}

uint32_t _tag_capture_uc(struct tag_thread_state *t, const struct ucontext_t *uc)
{
    uint64_t pcs[TAG_UC_WALK_MAX];
    uint32_t kinds[TAG_UC_WALK_MAX];
    uint32_t max = _tag_opt.fp_depth < TAG_UC_WALK_MAX ? _tag_opt.fp_depth : TAG_UC_WALK_MAX;
    uint32_t n = _tag_unwind_uc(t, uc, pcs, kinds, max), id = 0;
    while (n > 0) {
        n--;
        id = _tag_intern_signal(id, kinds[n], pcs[n]);
        if (!id)
            return 0;
    }
    return id;
}

/* ------------------------------------------------------ shadow stacks -- */

/* No rule: the first slot above c that holds site (its CFA, the end of
 * that slot), else a lower bound. */
static uint64_t hook_cfa_scan(uintptr_t c, uintptr_t site, uintptr_t hi)
{
    for (uintptr_t p = c; p < c + 64 * 8 && p + 8 <= hi; p += 8)
        if (tag_arch_slot_ra(p + 8) == site)
            return p + 8;
    return (c + 8) | 1;
}

/* The CFA (stacks/shadow.h: the end of its return address slot) that the
 * CFI rule at ra gives an instrumented function whose enter hook had its
 * CFA at c (rbp: the function's frame pointer), if it lies in (c, hi] and
 * is 8-aligned; 0 if not, or no rule. */
static uint64_t hook_rule_cfa(struct tag_thread_state *t, uintptr_t ra, uintptr_t c, uintptr_t rbp, uint64_t hi)
{
    uint32_t gen = __atomic_load_n(&_tag_code_gen, __ATOMIC_ACQUIRE);
    if (t->hook_gen != gen) {
        memset(t->hook_cache, 0, sizeof t->hook_cache);
        t->hook_gen = gen;
    }
#ifdef __aarch64__
    /* The rule at the call itself (bl, 4 bytes before ra), an exact pc:
     * a return address's is the frame record's (rule_miss), and c, the
     * stack pointer at the call, is what an exact rule starts from.  x30
     * is saved (the function called the hook) at CFA - 8 * slot. */
    uint64_t rule = rule_for((ra - 4) | EXACT_KEY, 0);
    uint64_t slot = (rule >> TAG_RULE_RA_SHIFT) & TAG_RULE_RA_MASK;
    if ((rule & TAG_RULE_TYPE) != TAG_RULE_CFA || (rule & TAG_RULE_RA_LR) || slot == 0)
        return 0;
    uint64_t off = (rule >> TAG_RULE_OFF_SHIFT) & TAG_RULE_OFF_MASK;
    uint64_t cfa = ((rule & TAG_RULE_CFA_RBP) ? rbp : c) + off - 8 * (slot - 1);
#else
    uint64_t rule = rule_for(ra, 0);
    if ((rule & TAG_RULE_TYPE) != TAG_RULE_CFA)
        return 0;
    uint64_t off = (rule >> TAG_RULE_OFF_SHIFT) & 0xffffff;
    uint64_t cfa = ((rule & TAG_RULE_CFA_RBP) ? rbp : c) + off;
#endif
    return cfa > c && cfa <= hi && cfa - c <= UINT32_MAX && !(cfa & 7) ? cfa : 0;
}

/* CFI describes the function; its CFA's slot agreed with the call site,
 * so the offset is trusted for later entries through this hook. */
static void hook_cache_put(struct tag_thread_state *t, uintptr_t ra, uint64_t off)
{
    /* newest first: the others move down a way, the oldest leaves */
    struct tag_hook_set *h = &t->hook_cache[TAG_HOOK_SET(ra)];
    for (unsigned w = TAG_HOOK_WAYS - 1; w > 0; w--) {
        h->ra[w] = h->ra[w - 1];
        h->off[w] = h->off[w - 1];
    }
    h->ra[0] = ra;
    h->off[0] = (uint32_t)off;
}

TAG_COLD uint64_t _tag_hook_cfa(struct tag_thread_state *t, uintptr_t ra, uintptr_t c, uintptr_t rbp,
                                uintptr_t site)
{
    uint64_t hi = t->stack_hi, cfa = hook_rule_cfa(t, ra, c, rbp, hi);
    if (cfa && tag_arch_slot_ra(cfa) == site) {
        hook_cache_put(t, ra, cfa - c);
        return cfa;
    }
    return hook_cfa_scan(c, site, hi);
}

/* The top of the stack that the hook's CFA c lies on, if it may be read:
 * the thread's own from cur up (live frames are there), or its alternate
 * signal stack; 0 elsewhere. */
static uint64_t hook_stack_top(const struct tag_thread_state *t, uint64_t c, uint64_t cur)
{
    if (t->alt_hi && c >= t->alt_lo && c < t->alt_hi)
        return t->alt_hi;
    if (c >= cur && c < t->stack_hi)
        return t->stack_hi;
    return 0;
}

int _tag_shadow_recheck(struct tag_thread_state *t, uint32_t i, uint64_t cur)
{
    uint64_t c = t->hook_sp[i], hi = hook_stack_top(t, c, cur);
    if (!hi)
        return 0;
    uint64_t cfa = hook_rule_cfa(t, t->hook_ra[i], c, t->hook_bp[i], hi);
    if (!cfa || cfa == (t->shadow.sp[i] & ~1ull) || tag_arch_slot_ra(cfa) != t->shadow.site[i])
        return 0;
    t->shadow.sp[i] = cfa;
    return 1;
}

uint64_t _tag_shadow_resolve(struct tag_thread_state *t, uint32_t i, uint64_t cur)
{
    uint64_t c = t->hook_sp[i], ra = t->hook_ra[i], site = t->shadow.site[i];
    uint64_t hi = hook_stack_top(t, c, cur);
    if (!hi)
        return t->shadow.sp[i];  /* elsewhere: the lower bound stays */
    uint64_t off = hook_probe(t, ra), cfa = c + off;
    if (off && cfa <= hi && tag_arch_slot_ra(cfa) == site)
        return t->shadow.sp[i] = cfa;
    cfa = hook_rule_cfa(t, ra, c, t->hook_bp[i], hi);
    if (!cfa)  /* no rule: what the enter hook did before, near c */
        return t->shadow.sp[i] = hook_cfa_scan(c, site, hi);
    if (tag_arch_slot_ra(cfa) == site)
        hook_cache_put(t, ra, cfa - c);
    /* else a frame that is gone: its CFA by rule, which the caller finds
     * dead by its slot */
    return t->shadow.sp[i] = cfa;
}
