/* tramp.c - a MEASURING DEVICE, not a product: how cheap can a full-stack id
 * of every malloc/free caller be with HPCToolkit's return-address trampoline
 * (an incremental walk that visits only the frames that changed since the
 * thread's last capture), against a plain frame-pointer walk of every frame?
 *
 * Standalone LD_PRELOAD interposer (nothing of libtag): malloc, free, calloc
 * and realloc capture, then call glibc's __libc_* functions (no dlsym).
 *
 *   TRAMP_MODE=none     no capture: the interposer's own floor
 *   TRAMP_MODE=walk     walk the rbp chain to the end of the stack, hash every
 *                       return address (h = (h ^ pc) * K, innermost first)
 *   TRAMP_MODE=marker   the incremental walk: walk outward only until a frame
 *                       whose return-address slot holds tramp_ret; the id of
 *                       everything outward of it is cached in the side stack
 *                       (tramp_asm.h), so only the new frames are folded in
 *                       (outermost first, onto the cached prefix id).
 *   TRAMP_MODE=verify   marker, plus a full walk at every capture folded the
 *                       same way; mismatching ids are counted (must be 0).
 *
 *   TRAMP_PLACE=inner      after every capture that walked a new frame, the
 *                          marker moves to the return slot of the innermost
 *                          frame's caller (the function that called malloc):
 *                          HPCToolkit's choice.  Exact; fires whenever that
 *                          function returns, i.e. about once per capture.
 *   TRAMP_PLACE=junction   (default) the marker stays where it is while it is
 *                          valid and the capture walked at most 2*J new frames
 *                          (TRAMP_JDEPTH=J, default 4); otherwise (no marker
 *                          yet, or a long walk) it is put J frames outward of
 *                          malloc's caller.  A fire moves it one frame outward,
 *                          so it settles on the innermost frame that survives
 *                          between captures (the junction of the changing part
 *                          and the stable part).  Equally exact: correctness
 *                          only needs every frame outward of the marker to be
 *                          unchanged while the marker has not fired.
 *
 * Exit (destructor, main thread's counters): one line on stderr with the
 * captures, frames walked, trampoline fires, mismatches (verify) and `short`:
 * captures whose walk ended before reaching a valid marker (a return address
 * outside the executable, e.g. fopen calling malloc; the id is what was
 * walked, the marker stays).  TRAMP_CHECK (a -D at build time) also checks
 * the whole side stack at every capture.
 *
 * What it does NOT handle (each would crash it, or give wrong ids, and each
 * is something a product would have to handle):
 *   - C++ exceptions: the unwinder reads return addresses from the stack; a
 *     marked slot holds tramp_ret, which has no FDE, so the unwind stops with
 *     std::terminate, and a frame skipped by the unwind leaves a stale marker;
 *   - longjmp / siglongjmp / setcontext / coroutines and green threads
 *     switching stacks: frames vanish without returning, the marker is lost or
 *     tramp_ret's check (ud2) fires;
 *   - signals: a handler that allocates runs on the same stack (fine) but one
 *     that longjmps out is the case above; sigaltstack stacks are out of the
 *     bounds this walk uses;
 *   - backtrace(), gdb, perf, profilers, crash handlers: they see tramp_ret
 *     instead of the caller in one frame of every stack;
 *   - CET shadow stacks (-fcf-protection with a kernel/CPU that enforces
 *     user shadow stacks): the `ret` from a rewritten slot is a control
 *     protection fault; it cannot work there at all;
 *   - threads: state is per thread (initial-exec TLS) but only the main
 *     thread's counters are printed; stack bounds come from
 *     pthread_getattr_np once per thread;
 *   - binaries without frame pointers, and frame-pointer chains broken by
 *     frameless code that uses rbp as a general register (the marker could
 *     then be written into a slot that is not a return address).
 */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tramp_asm.h"

TRAMP_DEFINE_ASM

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

enum { M_NONE, M_WALK, M_MARKER, M_VERIFY };
static int mode = M_NONE;
static int place_inner;
static unsigned jdepth = 4;

#define K 0x9E3779B97F4A7C15ull
#define SEED 0xcbf29ce484222325ull
#define MAXW 2048

/* The main executable's code: a walk includes a frame and goes on outward
 * only while the return address it read points into it (a frame-pointer
 * build); the first return address elsewhere (libc's fwrite calling malloc,
 * main returning into __libc_start_call_main) ends the walk, since libc's
 * frameless code may hold anything in rbp.  Without this rule the marker was
 * written into words that were not return-address slots (lua crashed). */
static uintptr_t text_lo, text_sz;

static int find_text(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            text_lo = info->dlpi_addr + ph->p_vaddr;
            text_sz = ph->p_memsz;
        }
    }
    return 1; /* the first object is the main program */
}

static inline int in_text(uintptr_t pc) { return pc - text_lo < text_sz; }

static inline uint64_t fold(uint64_t h, uintptr_t pc) { return (h ^ pc) * K; }

struct tstate {
    uintptr_t lo, hi;
    int init, busy;
    uint64_t captures, frames, mism, lost, sink;
    uintptr_t *slots[MAXW];
    uintptr_t vrets[MAXW];
};
static __thread struct tstate ts __attribute__((tls_model("initial-exec")));

static void init_bounds(void)
{
    pthread_attr_t a;
    void *addr;
    size_t size;
    ts.init = 1;
    if (pthread_getattr_np(pthread_self(), &a) == 0) {
        if (pthread_attr_getstack(&a, &addr, &size) == 0) {
            ts.lo = (uintptr_t)addr;
            ts.hi = (uintptr_t)addr + size;
        }
        pthread_attr_destroy(&a);
    }
}

/* The loops below check only the upper stack bound: the first frame is the
 * interposer's own and every next frame must be higher (nb > b). */

/* Plain walk: every frame, innermost first. */
__attribute__((noinline)) static uint64_t walk_all(uintptr_t *b)
{
    const uintptr_t hi = ts.hi - 16;
    uint64_t h = SEED, n = 0;
    for (;;) {
        uintptr_t r = b[1];
        h = fold(h, r);
        n++;
        if (!in_text(r))
            break;
        uintptr_t *nb = (uintptr_t *)b[0];
        if (nb <= b || (uintptr_t)nb > hi)
            break;
        b = nb;
    }
    ts.frames += n;
    return h;
}

/* verify: every frame, folded outermost first like the marker ids, with the
 * marked slot's real return address in place of tramp_ret. */
static uint64_t walk_verify(uintptr_t *b)
{
    struct tramp_state *T = &tramp_tls;
    uintptr_t tr = (uintptr_t)tramp_ret;
    unsigned n = 0;
    const uintptr_t hi = ts.hi - 16;
    while (n < MAXW) {
        uintptr_t r = b[1];
        if (r == tr)
            r = T->n ? T->e[T->n - 1].ret : 0;
        ts.vrets[n++] = r;
        if (!in_text(r))
            break;
        uintptr_t *nb = (uintptr_t *)b[0];
        if (nb <= b || (uintptr_t)nb > hi)
            break;
        b = nb;
    }
    uint64_t h = SEED;
    while (n)
        h = fold(h, ts.vrets[--n]);
    return h;
}

__attribute__((noinline)) static uint64_t walk_marker(uintptr_t *b)
{
    struct tramp_state *T = &tramp_tls;
    const uintptr_t tr = (uintptr_t)tramp_ret;
    const uintptr_t hi = ts.hi - 16;
    uintptr_t **const s0 = ts.slots, **const end = ts.slots + MAXW;
    uintptr_t **sp = s0;
    int found = 0;
    uint64_t h = SEED;
    /* Only the slots are kept: a new frame's return address is reread from
     * its slot (nothing has changed it since). */
    for (;;) {
        uintptr_t r = b[1];
        if (r == tr) {
            found = 1;
            h = T->e[T->n - 1].pid;
            break;
        }
        *sp++ = &b[1];
        if (!in_text(r))
            break;
        uintptr_t *nb = (uintptr_t *)b[0];
        if (nb <= b || (uintptr_t)nb > hi || sp == end)
            break;
        b = nb;
    }
    unsigned n = (unsigned)(sp - s0);
    ts.frames += n;
    if (!found && T->n) {
        /* The walk ended (a return address outside the executable, e.g.
         * fopen calling malloc) before reaching the marker, which is still
         * valid further out: the id is what the walk saw, the marker stays. */
        ts.lost++;
        while (sp != s0)
            h = fold(h, **--sp);
        return h;
    }
    /* Where does the marker go?  k indexes ts.slots (0 = malloc's own return
     * slot, never marked: it would fire at once). */
    int k = -1;
    if (n >= 2) {
        if (place_inner)
            k = 1;
        else if (!found || n - 1 > 2 * jdepth)
            k = (int)(n - 1 < jdepth ? n - 1 : jdepth);
    }
    if (k >= 0 && T->n + (n - k) > TRAMP_MAX)
        k = -1;
    if (k < 0) {
        while (sp != s0)
            h = fold(h, **--sp);
        return h;
    }
    if (found) /* the old marker becomes a plain entry */
        *T->e[T->n - 1].slot = T->e[T->n - 1].ret;
    uintptr_t **mk = s0 + k;
    while (sp != mk) {
        uintptr_t *slot = *--sp;
        uintptr_t r = *slot;
        h = fold(h, r);
        struct tramp_entry *e = &T->e[T->n++];
        e->slot = slot;
        e->ret = r;
        e->pid = h;
    }
    *ts.slots[k] = tr;
    while (sp != s0)
        h = fold(h, **--sp);
    return h;
}

static inline __attribute__((always_inline)) void capture(uintptr_t *fp)
{
    if (mode == M_NONE || ts.busy)
        return;
    if (!ts.init) {
        ts.busy = 1;
        init_bounds();
        ts.busy = 0;
    }
    ts.captures++;
#ifdef TRAMP_CHECK
    {
        struct tramp_state *T = &tramp_tls;
        for (uint64_t i = 0; i < T->n; i++) {
            uintptr_t want = i + 1 == T->n ? (uintptr_t)tramp_ret : T->e[i].ret;
            if (*T->e[i].slot != want || (i && T->e[i].slot >= T->e[i - 1].slot)) {
                fprintf(stderr, "tramp check: capture %lu entry %lu/%lu slot %p holds %lx want %lx fires %lu\n",
                        (unsigned long)ts.captures, (unsigned long)i, (unsigned long)T->n,
                        (void *)T->e[i].slot, (unsigned long)*T->e[i].slot, (unsigned long)want,
                        (unsigned long)T->fires);
                abort();
            }
        }
    }
#endif
    uint64_t id;
    if (mode == M_WALK) {
        id = walk_all(fp);
    } else if (mode == M_MARKER) {
        id = walk_marker(fp);
    } else {
        uint64_t v = walk_verify(fp);
        id = walk_marker(fp);
        if (v != id)
            ts.mism++;
    }
    ts.sink ^= id;
}

#define CAPTURE() capture((uintptr_t *)__builtin_frame_address(0))

void *malloc(size_t n)
{
    CAPTURE();
    return __libc_malloc(n);
}

void free(void *p)
{
    CAPTURE();
    __libc_free(p);
}

void *calloc(size_t a, size_t b)
{
    CAPTURE();
    return __libc_calloc(a, b);
}

void *realloc(void *p, size_t n)
{
    CAPTURE();
    return __libc_realloc(p, n);
}

static const char *mode_name[] = {"none", "walk", "marker", "verify"};

__attribute__((constructor)) static void tramp_init(void)
{
    const char *m = getenv("TRAMP_MODE");
    const char *p = getenv("TRAMP_PLACE");
    const char *j = getenv("TRAMP_JDEPTH");
    int md = M_NONE;
    if (m && !strcmp(m, "walk"))
        md = M_WALK;
    else if (m && !strcmp(m, "marker"))
        md = M_MARKER;
    else if (m && !strcmp(m, "verify"))
        md = M_VERIFY;
    place_inner = p && !strcmp(p, "inner");
    if (j && atoi(j) > 0)
        jdepth = (unsigned)atoi(j);
    dl_iterate_phdr(find_text, NULL);
    mode = md;
}

__attribute__((destructor)) static void tramp_fini(void)
{
    int md = mode;
    mode = M_NONE;
    unsigned long c = ts.captures;
    fprintf(stderr,
            "tramp: mode=%s place=%s jdepth=%u captures=%lu frames=%lu "
            "(%.2f/capture) fires=%lu (%.3f/capture) mismatches=%lu short=%lu\n",
            mode_name[md], place_inner ? "inner" : "junction", jdepth, c,
            (unsigned long)ts.frames, c ? (double)ts.frames / c : 0.0,
            (unsigned long)tramp_tls.fires,
            c ? (double)tramp_tls.fires / c : 0.0, (unsigned long)ts.mism,
            (unsigned long)ts.lost);
}
