/* modules.c - the loaded objects an unwind may step through.
 *
 * The unwinder needs, for a code address, the object that holds it: its
 * executable range (a return address outside every one is junk), and its
 * .eh_frame_hdr (PT_GNU_EH_FRAME) with the PT_LOAD segment around it, which
 * bounds every read of call frame information.  dl_iterate_phdr gives all of
 * them, but it takes the loader's lock: it is called only from normal
 * context (the first capture after libtag's constructor, and a capture that
 * meets a code address in no known object), never from a signal handler or
 * the fork child.  A snapshot of the list lives in a static table that
 * readers search without locks under a sequence counter.
 *
 * dlclose() is interposed because the objects it unmaps
 * may be mid-read by another thread's unwinder (code bytes, .eh_frame).
 * Those reads are bracketed by _tag_modules_enter/_leave, and dlclose waits
 * for them to finish before the real one runs; after it the table is
 * rebuilt and every cached unwind rule is dropped (_tag_code_gen), since new
 * code may appear at the same addresses.
 */
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "base/base.h"
#include "stacks/modules.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"

#define MAX_MODULES 1024

static struct tag_module table[MAX_MODULES];
static uint32_t count;
/* Odd while the table is rewritten; readers retry or give up. */
static uint32_t seq;
/* One writer at a time; a capture that finds it taken does not wait. */
static int write_lock;
/* Set at the end of libtag's start-up (the first allocation), so that an
 * allocation made before libtag's constructor runs - in another library's
 * constructor, which the loader runs first, or by the loader itself after
 * it relocated libc - unwinds through every object loaded so far.  By then
 * the loader has relocated libc (libtag's malloc is reached only through
 * libc's relocated symbols), so dl_iterate_phdr works: it allocates nothing
 * and takes only the loader's write lock, a recursive one, which the
 * loader's own thread takes again at once if it allocates or frees while
 * holding it (dlclose does, after libtag's constructor as before it). */
static int scan_allowed;
/* dl_iterate_phdr's load/unload counters at the last scan. */
static unsigned long long seen_adds, seen_subs;

uint32_t _tag_code_gen;
static uint32_t readers;   /* threads reading module memory now */
static uint32_t unloading; /* a dlclose waits for readers to leave */

struct scan {
    struct tag_module *out;
    uint32_t n;
};

static int scan_one(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct scan *s = arg;
    (void)size;
    uintptr_t bias = (uintptr_t)info->dlpi_addr, hdr = 0, data_lo = 0, data_hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME)
            hdr = bias + info->dlpi_phdr[i].p_vaddr;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t lo = bias + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (hdr >= lo && hdr < hi) {
            /* Only the file-backed part: the .bss tail is not CFI. */
            data_lo = lo;
            data_hi = lo + ph->p_filesz;
        }
    }
    for (int i = 0; i < info->dlpi_phnum && s->n < MAX_MODULES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || ph->p_memsz == 0)
            continue;
        struct tag_module *m = &s->out[s->n++];
        m->lo = bias + ph->p_vaddr;
        m->hi = m->lo + ph->p_filesz;  /* code past the file is zero fill */
        m->eh_hdr = data_hi > hdr ? hdr : 0;
        m->data_lo = data_lo;
        m->data_hi = data_hi;
    }
    return 0;
}

static int counters_one(struct dl_phdr_info *info, size_t size, void *arg)
{
    unsigned long long *c = arg;
    if (size < offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        return 1;
    c[0] = info->dlpi_adds;
    c[1] = info->dlpi_subs;
    return 1;  /* the counters are the same in every entry: stop */
}

static void sort_modules(struct tag_module *m, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        struct tag_module k = m[i];
        uint32_t j = i;
        while (j > 0 && m[j - 1].lo > k.lo) {
            m[j] = m[j - 1];
            j--;
        }
        m[j] = k;
    }
}

/* Rescan the loaded objects.  Normal context only.  force: even when the
 * loader's counters say nothing changed. */
static TAG_COLD void rescan(int force)
{
    if (!__atomic_load_n(&scan_allowed, __ATOMIC_ACQUIRE))
        return;
    if (__atomic_exchange_n(&write_lock, 1, __ATOMIC_ACQUIRE))
        return;  /* someone else is rescanning: use what is there */
    unsigned long long c[2] = {0, 0};
    dl_iterate_phdr(counters_one, c);
    if (force || c[0] != seen_adds || c[1] != seen_subs) {
        /* Rewritten in place under seq (a copy aside would be 40 KiB on
         * a thread stack that may be small); readers meanwhile find
         * nothing and end their walk there. */
        __atomic_store_n(&seq, seq + 1, __ATOMIC_RELEASE);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        struct scan s = {table, 0};
        dl_iterate_phdr(scan_one, &s);
        sort_modules(table, s.n);
        __atomic_store_n(&count, s.n, __ATOMIC_RELAXED);
        seen_adds = c[0];
        seen_subs = c[1];
        /* walks recorded before may have ended at a pc now known */
        __atomic_add_fetch(&_tag_code_gen, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&seq, seq + 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&write_lock, 0, __ATOMIC_RELEASE);
}

/* The child of the program's fork(): a thread that was rescanning or
 * reading module memory in the parent does not exist here.  Free the locks
 * and rebuild the table (it may be half written) at the next unknown pc. */
void _tag_modules_atfork_child(void)
{
    __atomic_store_n(&write_lock, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&readers, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&unloading, 0, __ATOMIC_RELAXED);
    if (seq & 1) {
        count = 0;
        seen_adds = seen_subs = 0;  /* the counters force the rescan */
        __atomic_store_n(&seq, seq + 1, __ATOMIC_RELEASE);
    }
}

void _tag_modules_allow(void)
{
    __atomic_store_n(&scan_allowed, 1, __ATOMIC_RELEASE);
}

void _tag_modules_init(void)
{
    __atomic_store_n(&scan_allowed, 1, __ATOMIC_RELEASE);
    rescan(1);
}

/* Lock-free: binary search under the sequence counter.  Returns 1 and a
 * copy of the module, 0 when pc is in none (or the table is being
 * rewritten right now). */
static int lookup(uintptr_t pc, struct tag_module *out)
{
    for (int tries = 0; tries < 2; tries++) {
        uint32_t s1 = __atomic_load_n(&seq, __ATOMIC_ACQUIRE);
        if (s1 & 1)
            return 0;
        uint32_t lo = 0, hi = __atomic_load_n(&count, __ATOMIC_RELAXED);
        if (hi > MAX_MODULES)
            hi = MAX_MODULES;
        int found = 0;
        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;
            if (pc < table[mid].lo) {
                hi = mid;
            } else if (pc >= table[mid].hi) {
                lo = mid + 1;
            } else {
                *out = table[mid];
                found = 1;
                break;
            }
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&seq, __ATOMIC_RELAXED) == s1)
            return found;
    }
    return 0;
}

int _tag_module_find(uintptr_t pc, struct tag_module *out, int may_rescan)
{
    if (lookup(pc, out))
        return 1;
    if (!may_rescan)
        return 0;
    /* Asking the loader costs its lock: do it once per code page found in
     * no module (JIT code and the junk a frame-pointer walk tries would
     * otherwise ask at every capture), remembered per thread until the
     * module list changes.  dlopen() is not interposed to know better:
     * glibc resolves the caller's RUNPATH and namespace from its return
     * address, which would then be libtag's. */
    struct tag_thread_state *t = _tag_tls.t;
    if (t->rec == NULL) {  /* no state of its own (_tag_tls_none): no memo */
        rescan(0);
        return lookup(pc, out);
    }
    uint32_t gen = __atomic_load_n(&_tag_code_gen, __ATOMIC_ACQUIRE);
    if (t->unknown_gen != gen) {
        memset(t->unknown_pages, 0, sizeof t->unknown_pages);
        t->unknown_gen = gen;
    }
    uint64_t page = pc / TAG_PAGE_SIZE;
    for (unsigned i = 0; i < sizeof t->unknown_pages / sizeof t->unknown_pages[0]; i++)
        if (t->unknown_pages[i] == page)
            return 0;
    t->unknown_pages[t->unknown_next++ % (sizeof t->unknown_pages / sizeof t->unknown_pages[0])] = page;
    rescan(0);
    return lookup(pc, out);
}

/* Reads of module memory: a dlclose() waits until they are done, and
 * readers that arrive during one give up (their unwind ends there).
 * Async-signal-safe: a handler that interrupts a waiting dlclose sees
 * `unloading` and leaves at once. */
int _tag_modules_enter(void)
{
    __atomic_add_fetch(&readers, 1, __ATOMIC_SEQ_CST);
    if (TAG_UNLIKELY(__atomic_load_n(&unloading, __ATOMIC_SEQ_CST))) {
        __atomic_sub_fetch(&readers, 1, __ATOMIC_RELEASE);
        return 0;
    }
    return 1;
}

void _tag_modules_leave(void)
{
    __atomic_sub_fetch(&readers, 1, __ATOMIC_RELEASE);
}

static int (*real_dlclose)(void *);
TAG_EXPORT int dlclose(void *handle)
{
    if (!real_dlclose) {
        int (*f)(void *) = (int (*)(void *))dlsym(RTLD_NEXT, "dlclose");
        if (!f)
            return -1;
        __atomic_store_n(&real_dlclose, f, __ATOMIC_RELEASE);
    }
    /* Several threads may dlclose at once: unloading counts them. */
    __atomic_add_fetch(&unloading, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&readers, __ATOMIC_SEQ_CST))
        tag_arch_pause();
    int r = real_dlclose(handle);
    rescan(0);
    _tag_unwind_flush();
    __atomic_sub_fetch(&unloading, 1, __ATOMIC_SEQ_CST);
    return r;
}
