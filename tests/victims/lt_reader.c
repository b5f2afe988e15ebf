/* lt_reader.c - a tiny reader of libtag's tags, from inside the victim.
 *
 * Not a victim on its own: the lt_* victims #include it.  It validates a tag
 * exactly as a reader of a core would (a block's state, check value with the
 * control block's secret), finds a block's slot and a big block's size in
 * libtag's heap (control.heap), finds the calling thread's record, and walks
 * a stack id through the stack table.  libtag_control/libtag_stats are weak, so the
 * same victim runs without libtag (they are NULL then).
 */
#ifndef LT_READER_C
#define LT_READER_C

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "libtag.h"
#include "tag_abi.h"  /* compiles as C and as C++ */

#ifdef __cplusplus
extern "C" {
#endif
extern const void *libtag_control(void) __attribute__((weak));
extern void libtag_stats(struct libtag_stats *) __attribute__((weak));
#ifdef __cplusplus
}
#endif

__attribute__((unused)) static const struct libtag_control *lt_ctl(void)
{
    return libtag_control ? (const struct libtag_control *)libtag_control() : NULL;
}

__attribute__((unused)) static uint32_t lt_gettid(void)
{
    return (uint32_t)syscall(SYS_gettid);
}

/* The tag in front of user if it validates, else NULL: a block's state
 * (live or freed, not a free slot's NONE or a forward record) and the check
 * value of its bits, stack and time. */
__attribute__((unused)) static const struct libtag_tag *lt_tag(const void *user)
{
    const struct libtag_control *c = lt_ctl();
    if (!c || !user)
        return NULL;
    const struct libtag_tag *t =
        (const struct libtag_tag *)((const char *)user - sizeof(struct libtag_tag));
    uint32_t state = tag_state_of(t);
    if (state != TAG_STATE_LIVE && state != TAG_STATE_FREED)
        return NULL;
    if (tag_check_of(t) != tag_check_value((uint64_t)(uintptr_t)t, c->secret, t))
        return NULL;
    return t;
}

/* The entry of the span that holds address a in libtag's heap, and the
 * span's first byte in *start; NULL when a is not in the heap (a guarded
 * block, or no heap). */
__attribute__((unused)) static const struct libtag_slice *lt_span(uint64_t a, uint64_t *start)
{
    const struct libtag_control *c = lt_ctl();
    if (!c || !c->heap)
        return NULL;
    const struct libtag_heap *h = (const struct libtag_heap *)(uintptr_t)c->heap;
    uint64_t used = __atomic_load_n(&h->used, __ATOMIC_ACQUIRE);
    if (a < h->base || (a - h->base) / TAG_HEAP_SLICE >= used)
        return NULL;
    const struct libtag_slice *meta = (const struct libtag_slice *)(uintptr_t)h->meta;
    uint64_t i = (a - h->base) / TAG_HEAP_SLICE;
    if (meta[i].first_off > i)
        return NULL;
    i -= meta[i].first_off;
    *start = h->base + i * TAG_HEAP_SLICE;
    return &meta[i];
}

/* Requested size of the block t is the tag of: the tag's size field, or,
 * for a big block (TAG_SIZE_BIG), its large span's large_size (the field
 * itself when the span is not found). */
__attribute__((unused)) static uint64_t lt_size(const struct libtag_tag *t)
{
    uint64_t size = tag_size_field(t), start;
    if (size != TAG_SIZE_BIG)
        return size;
    const struct libtag_slice *s = lt_span((uint64_t)(uintptr_t)t, &start);
    return s && s->kind == TAG_SPAN_LARGE ? s->large_size : size;
}
__attribute__((unused)) static unsigned lt_state(const struct libtag_tag *t) { return tag_state_of(t); }
__attribute__((unused)) static unsigned lt_kind(const struct libtag_tag *t) { return tag_kind_of(t); }
/* Did thread tid allocate the block?  The tag keeps a tid's low 22 bits. */
__attribute__((unused)) static int lt_tid_is(const struct libtag_tag *t, uint32_t tid)
{
    return tag_tid_of(t) == (tid & TAG_TID_MASK);
}

/* The bytes from the start of t's slot in libtag's heap to t: 0 when the
 * tag starts its slot, else the pad of the forward record that starts it
 * (an aligned block), checked to lead to t; -1 when the slot is not found
 * or its forward record does not lead to t. */
__attribute__((unused)) static long lt_pad(const struct libtag_tag *t)
{
    uint64_t a = (uint64_t)(uintptr_t)t, start, slot;
    const struct libtag_slice *s = lt_span(a, &start);
    if (!s)
        return -1;
    if (s->kind == TAG_SPAN_SMALL && s->block_size)
        slot = start + (a - start) / s->block_size * s->block_size;
    else if (s->kind == TAG_SPAN_LARGE)
        slot = start + s->block_off;
    else
        return -1;
    if (slot == a)
        return 0;
    const struct libtag_tag *fwd = (const struct libtag_tag *)(uintptr_t)slot;
    if (tag_state_of(fwd) != TAG_STATE_FORWARD || slot + fwd->alloc_stack != a)
        return -1;
    return (long)fwd->alloc_stack;
}

/* Does the canary after a live block's payload hold its value? */
__attribute__((unused)) static int lt_canary_ok(const void *user)
{
    const struct libtag_control *c = lt_ctl();
    const struct libtag_tag *t = lt_tag(user);
    if (!t)
        return 0;
    uint64_t have, want = tag_canary_value((uint64_t)(uintptr_t)t, c->secret);
    memcpy(&have, (const char *)user + lt_size(t), sizeof have);
    return have == want;
}

/* The free record of a block the calling thread freed, if it validates:
 * libtag keeps it in the freeing thread's quarantine ring, next to the
 * pointer, not in the block.  Only the calling thread's ring is read: another
 * thread's may be unmapped at any moment (a thread that exits drains and
 * unmaps its ring). */
__attribute__((unused)) static const struct libtag_free_rec *lt_free_rec(const void *user)
{
    const struct libtag_control *c = lt_ctl();
    const struct libtag_tag *t = lt_tag(user);
    if (!t || lt_state(t) != TAG_STATE_FREED)
        return NULL;
    const struct libtag_thread *r = (const struct libtag_thread *)(uintptr_t)c->threads;
    uint32_t n = __atomic_load_n(&c->thread_count, __ATOMIC_ACQUIRE);
    uint32_t self = (uint32_t)syscall(SYS_gettid);
    for (uint32_t i = 0; i < n && i < c->thread_capacity; i++) {
        if (__atomic_load_n(&r[i].tid, __ATOMIC_ACQUIRE) != self)
            continue;
        const struct libtag_quarantine_ring *q =
            (const struct libtag_quarantine_ring *)(uintptr_t)r[i].quarantine;
        for (uint32_t k = 0; q && k < q->count; k++) {
            const struct libtag_qentry *e = &q->e[(q->head + k) % TAG_QUARANTINE_SLOTS];
            if (e->user == (uint64_t)(uintptr_t)user &&
                e->rec.check == free_rec_check_value((uint64_t)(uintptr_t)t, c->secret, &e->rec))
                return &e->rec;
        }
    }
    return NULL;
}

/* The thread record whose tid is tid (latest one if several), or NULL. */
__attribute__((unused)) static const struct libtag_thread *lt_record(uint32_t tid)
{
    const struct libtag_control *c = lt_ctl();
    if (!c)
        return NULL;
    const struct libtag_thread *r = (const struct libtag_thread *)(uintptr_t)c->threads;
    uint32_t n = __atomic_load_n(&c->thread_count, __ATOMIC_ACQUIRE);
    const struct libtag_thread *found = NULL;
    for (uint32_t i = 0; i < n && i < c->thread_capacity; i++)
        if (__atomic_load_n(&r[i].tid, __ATOMIC_ACQUIRE) == tid)
            found = &r[i];
    return found;
}

/* "<label> tag ok=1 size=N state=S tid_self=1 stack_set=1" - one line a
 * test can assert on; ok=0 and nothing else when the tag does not validate. */
__attribute__((unused)) static void lt_print_tag(const char *label, const void *user)
{
    const struct libtag_tag *t = lt_tag(user);
    if (!t) {
        printf("%s tag ok=0\n", label);
        return;
    }
    printf("%s tag ok=1 size=%llu state=%u tid_self=%d stack_set=%d canary=%d\n",
           label, (unsigned long long)lt_size(t), lt_state(t),
           lt_tid_is(t, lt_gettid()), t->alloc_stack != 0,
           lt_state(t) == TAG_STATE_LIVE ? lt_canary_ok(user) : -1);
}

/* "frame <kind> 0x<pc>" per frame, innermost first, then "end <count>". */
__attribute__((unused)) static void lt_print_stack(uint32_t id)
{
    const struct libtag_control *c = lt_ctl();
    const struct libtag_stack_node *nodes =
        (const struct libtag_stack_node *)(uintptr_t)c->stack_nodes;
    unsigned n = 0;
    while (id != 0 && id < c->stack_count && n < 300) {
        printf("frame %u 0x%llx\n", nodes[id].kind, (unsigned long long)nodes[id].pc);
        if (nodes[id].parent >= id) {      /* parents are always older */
            printf("bad-parent %u of %u\n", nodes[id].parent, id);
            break;
        }
        id = nodes[id].parent;
        n++;
    }
    printf("end %u\n", n);
}

/* The uw_* victims' form of the allocation stack of the block user, for a
 * test to set beside gdb's bt: "stack <m> 0x<pc> ..." then "kinds <m> <kind>
 * ...", innermost first; "stack <m> none" when user has no valid tag. */
__attribute__((unused)) static void lt_print_marked_stack(int m, const void *user)
{
    const struct libtag_tag *t = lt_tag(user);
    if (!t) {
        printf("stack %d none\n", m);
        return;
    }
    const struct libtag_control *c = lt_ctl();
    const struct libtag_stack_node *nodes =
        (const struct libtag_stack_node *)(uintptr_t)c->stack_nodes;
    printf("stack %d", m);
    for (uint32_t id = t->alloc_stack; id && id < c->stack_count; id = nodes[id].parent)
        printf(" 0x%llx", (unsigned long long)nodes[id].pc);
    printf("\nkinds %d", m);
    for (uint32_t id = t->alloc_stack; id && id < c->stack_count; id = nodes[id].parent)
        printf(" %u", nodes[id].kind);
    printf("\n");
}

#endif /* LT_READER_C */
