/* control.c - the control block and libtag's start-up.
 *
 * _tag_init runs at the first allocation, which may come before libc's
 * constructors (from the dynamic linker or another library's constructor),
 * so it uses nothing that allocates: getenv, mmap, clock_gettime, getauxval.
 * What needs an initialised libc (pthread keys, atfork handlers, signal
 * handlers) waits for libtag's constructor.
 */
#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include <sys/auxv.h>
#include <elf.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/log.h"
#include "base/options.h"
#include "base/prim.h"
#include "heap/heap.h"
#include "stacks/modules.h"
#include "stacks/stack_table.h"
#include "stacks/thread.h"
#include "stacks/unwind.h"
#include "alloc/alloc.h"
#include "alloc/foreign.h"
#include "alloc/guard.h"
#include "alloc/quarantine.h"
#include "alloc/sweep.h"
#include "alloc/tag.h"
#include "snapshot/snapshot.h"
#include "life/life.h"
#include "libtag.h"

struct libtag_control _tag_ctl;
int _tag_ready;
static int init_state;  /* 0 = not started, 1 = running, 2 = done */
static __thread int in_init __attribute__((tls_model("initial-exec")));

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The vDSO's clock_gettime, called directly: glibc's clock_gettime adds a
 * function of its own and an indirect call in front of it, about a third
 * of the cost of a coarse clock read (4.4 ns instead of 6.5-9 ns per call
 * measured on the CI machine's kind; libtag reads the clock twice per
 * malloc/free pair).  Found at start in the vDSO's own symbol table (the
 * kernel maps it with DT_HASH); NULL when there is none (valgrind hides
 * it, an exotic kernel): _tag_now_ms then calls glibc. */
int (*_tag_vdso_gettime)(clockid_t, struct timespec *);

static TAG_COLD void vdso_init(void)
{
    const char *base = (const char *)getauxval(AT_SYSINFO_EHDR);
    if (!base)
        return;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64)
        return;
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(base + eh->e_phoff);
    const Elf64_Dyn *dyn = NULL;
    uintptr_t bias = 0;
    int have_load = 0;
    for (unsigned i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type == PT_LOAD && !have_load) {
            bias = (uintptr_t)base + ph[i].p_offset - ph[i].p_vaddr;
            have_load = 1;
        } else if (ph[i].p_type == PT_DYNAMIC) {
            dyn = (const Elf64_Dyn *)(base + ph[i].p_offset);
        }
    }
    if (!have_load || !dyn)
        return;
    const Elf64_Sym *sym = NULL;
    const char *str = NULL;
    const Elf32_Word *hash = NULL;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB)
            sym = (const Elf64_Sym *)(bias + dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_STRTAB)
            str = (const char *)(bias + dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_HASH)
            hash = (const Elf32_Word *)(bias + dyn->d_un.d_ptr);
    }
    if (!sym || !str || !hash)
        return;
    for (Elf32_Word i = 0; i < hash[1]; i++) {  /* nchain: the symbol count */
        if (ELF64_ST_TYPE(sym[i].st_info) == STT_FUNC && sym[i].st_shndx != SHN_UNDEF &&
            strcmp(str + sym[i].st_name, "__vdso_clock_gettime") == 0) {
            int (*f)(clockid_t, struct timespec *) =
                (int (*)(clockid_t, struct timespec *))(bias + sym[i].st_value);
            struct timespec a, b;
            /* trust it only if it agrees with glibc's */
            if (f(CLOCK_MONOTONIC_COARSE, &a) == 0 && clock_gettime(CLOCK_MONOTONIC_COARSE, &b) == 0 &&
                (uint64_t)(b.tv_sec - a.tv_sec) <= 1)
                _tag_vdso_gettime = f;
            return;
        }
    }
}

static uint64_t random_secret(void)
{
    /* AT_RANDOM: 16 random bytes the kernel gave the process at exec; the
     * stack protector uses the first 8, we mix in both halves. */
    const unsigned char *r = (const unsigned char *)getauxval(AT_RANDOM);
    uint64_t a = 0, b = 0;
    if (r) {
        memcpy(&a, r, 8);
        memcpy(&b, r + 8, 8);
    }
    uint64_t s = (a * TAG_MIX1) ^ b ^ clock_ns(CLOCK_MONOTONIC);
    s ^= (uint64_t)(uintptr_t)&s * TAG_MIX2;  /* ASLR as a last resort */
    return s ? s : TAG_MIX1;
}

void _tag_init(void)
{
    int expected = 0;
    if (!__atomic_compare_exchange_n(&init_state, &expected, 1, 0,
                                     __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE)) {
        if (expected == 1 && !in_init) {
            /* Another thread is initialising: wait for it. */
            while (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2)
                tag_arch_pause();
        }
        return;
    }
    in_init = 1;
    _tag_page_init();
    _tag_options_init();
    _tag_pattern_init();
    vdso_init();
    _tag_ctl.self = (uint64_t)(uintptr_t)&_tag_ctl;
    _tag_ctl.abi_version = TAG_ABI_VERSION;
    _tag_ctl.tag_size = sizeof(struct libtag_tag);
    _tag_ctl.heap = (uint64_t)(uintptr_t)&_tag_heap;
    _tag_ctl.free_rec_size = sizeof(struct libtag_free_rec);
    _tag_ctl.canary_size = TAG_CANARY_SIZE;
    _tag_ctl.secret = random_secret();
    _tag_ctl.start_realtime_ns = clock_ns(CLOCK_REALTIME);
    _tag_ctl.start_mono_ns = clock_ns(CLOCK_MONOTONIC_COARSE);
    _tag_ctl.pid = (uint32_t)getpid();
    _tag_ctl.quarantine_bytes = _tag_opt.quarantine_bytes;
    _tag_ctl.quarantine_fill = _tag_opt.quarantine_fill;
    _tag_ctl.thread_state_bytes = sizeof(struct tag_thread_state);
    _tag_ctl.guard_rate = _tag_opt.guard_rate;
    _tag_ctl.page_size = TAG_PAGE_SIZE;
    _tag_ctl.guard_slot_size = TAG_GUARD_SLOT_SIZE;
    _tag_ctl.guard_capacity = _tag_opt.guard_slots ? _tag_opt.guard_slots
                              : _tag_opt.guard_rate == 1 ? TAG_GUARD_ALL_SLOTS
                                                         : TAG_GUARD_SAMPLED_CAP;
    _tag_guard_init();
    _tag_stack_table_init(_tag_opt.stack_nodes);
    _tag_threads_init();
    _tag_heap_init();
    _tag_guard_sites = _tag_opt.guard_rate && _tag_stats ? _tag_opt.guard_sites : 0;
    /* The magic last: a reader that finds it finds a complete block. */
    memcpy(_tag_ctl.magic, TAG_CONTROL_MAGIC, sizeof _tag_ctl.magic);
    _tag_modules_allow();
    __atomic_store_n(&init_state, 2, __ATOMIC_RELEASE);
    __atomic_store_n(&_tag_ready, 1, __ATOMIC_RELEASE);
    in_init = 0;
}

/* dl_iterate_phdr's first module is the executable: its dynamic section */
static int exe_dynamic(struct dl_phdr_info *info, size_t size, void *out)
{
    (void)size;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            *(const void **)out = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    return 1;
}

#pragma weak _DYNAMIC

/* Loaded after start (dlopen, by forensics attach): a shared libtag that
 * the process's malloc is not.  libtag.a linked into the program is never
 * late (its malloc may not even be exported for dlsym to find). */
static int loaded_late(void)
{
    const void *exe = NULL;
    dl_iterate_phdr(exe_dynamic, &exe);
    if (exe == NULL || exe == (const void *)_DYNAMIC)
        return 0;
    void *m = dlsym(RTLD_DEFAULT, "malloc");
    return m != NULL && m != (void *)_tag_malloc_self;
}

__attribute__((constructor(101))) static void libtag_constructor(void)
{
    /* Loaded late (dlopen by forensics attach): the process calls another
     * malloc, and its signal handlers are in place (attach.c) */
    _tag_late = loaded_late();
    _tag_ensure_init();
    (void)_tag_self();
    _tag_threads_late_init();
    _tag_modules_init();
    _tag_snapshot_init();
    _tag_crash_init();
}

/* At exit: the exiting thread's recent blocks and quarantine are checked
 * (a short run's write after free or overflow is reported before it ends:
 * the thread-exit hook does the same for other threads, but never runs for
 * the one that calls exit()), then with LIBTAG_AT_EXIT=snapshot the exit
 * snapshot (after any anomaly snapshot those checks took), then with
 * LIBTAG_STATS=1 one line of counters.  The ring stays: a later destructor
 * may still free.
 *
 * Priority 101 runs this after every default-priority destructor of the
 * object it is linked into: nothing when preloaded (libtag.so is finalised
 * after the program and the libraries loaded after it, since it was
 * initialised before them), the program's own destructors when libtag.a is
 * linked into it.  exit() has run the atexit handlers and C++ static
 * destructors by then.  _exit() and a fatal signal run no destructor. */
__attribute__((destructor(101))) static void libtag_destructor(void)
{
    if (!_tag_ready)
        return;
    struct tag_thread_state *t = _tag_tls.t;
    if (t->rec && !t->exiting) {
        if (_tag_opt.sweep_every)
            _tag_sweep(t, __builtin_return_address(0), __builtin_frame_address(0));
        _tag_quarantine_flush(t);
    }
    if (_tag_opt.at_exit == TAG_AT_EXIT_SNAPSHOT)
        _tag_snapshot_at_exit();
    if (!_tag_opt.stats || _tag_opt.log == TAG_LOG_OFF)
        return;
    struct libtag_stats s;
    libtag_stats(&s);
    if (t->rec)
        _tag_unwind_settle(t);
    /* the guarded share, as one allocation in N (N rounded), against
     * LIBTAG_GUARD_RATE's promise: 0 when nothing was guarded */
    uint64_t guarded = _tag_guard_allocs(), sampled, sites, no_slot;
    _tag_guard_kinds(&sampled, &sites, &no_slot);
    unsigned long share = guarded ? (unsigned long)((s.allocs + guarded / 2) / guarded) : 0;
    _tag_log_always("libtag: stats pid=%u allocs=%lu frees=%lu live_blocks=%lu live_bytes=%lu "
             "stack_nodes=%u stack_table_bytes=%lu threads=%u shadow_overflows=%lu "
             "stack_full=%lu anomalies=%u snapshots=%u damaged_leaked=%lu damaged_bytes=%lu "
             "captures=%lu capture_frames=%lu guard_slots_used=%u guard_faults=%lu "
             "guard_window=%u guard_allocs=%lu guard_mappings=%u guard_sampled=%lu "
             "guard_site_firsts=%lu guard_one_in=%lu guard_no_slot=%lu shard_chunks=%u",
             _tag_ctl.pid, (unsigned long)s.allocs, (unsigned long)s.frees,
             (unsigned long)s.live_blocks, (unsigned long)s.live_bytes, s.stack_count,
             (unsigned long)s.stack_count * sizeof(struct libtag_stack_node), s.thread_count,
             (unsigned long)s.shadow_overflows, (unsigned long)s.stack_full, s.anomalies,
             s.snapshots, (unsigned long)_tag_ctl.damaged_leaked,
             (unsigned long)_tag_ctl.damaged_bytes,
             (unsigned long)(_tag_capture_total + t->captures),
             (unsigned long)(_tag_capture_frames_total + t->capture_frames),
             _tag_ctl.guard_used, (unsigned long)_tag_ctl.guard_faults, _tag_guard_window(),
             (unsigned long)guarded, _tag_guard_mappings(), (unsigned long)sampled,
             (unsigned long)sites, share, (unsigned long)no_slot,
             _tag_ctl.stack_shard_count < _tag_ctl.stack_shard_capacity
                 ? _tag_ctl.stack_shard_count
                 : _tag_ctl.stack_shard_capacity);
}

TAG_EXPORT const void *libtag_control(void)
{
    _tag_ensure_init();
    return &_tag_ctl;
}

TAG_EXPORT void libtag_stats(struct libtag_stats *out)
{
    _tag_ensure_init();
    memset(out, 0, sizeof *out);
    const struct libtag_thread *r = (const struct libtag_thread *)(uintptr_t)_tag_ctl.threads;
    uint32_t n = __atomic_load_n(&_tag_ctl.thread_count, __ATOMIC_ACQUIRE);
    uint64_t alloc_bytes = 0, free_bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        out->allocs += __atomic_load_n(&r[i].allocs, __ATOMIC_RELAXED);
        out->frees += __atomic_load_n(&r[i].frees, __ATOMIC_RELAXED);
        alloc_bytes += __atomic_load_n(&r[i].alloc_bytes, __ATOMIC_RELAXED);
        free_bytes += __atomic_load_n(&r[i].free_bytes, __ATOMIC_RELAXED);
    }
    out->live_blocks = out->allocs - out->frees;
    out->live_bytes = alloc_bytes - free_bytes;
    out->stack_count = __atomic_load_n(&_tag_ctl.stack_count, __ATOMIC_ACQUIRE);
    out->thread_count = n;
    out->stack_full = _tag_ctl.stack_full;
    out->shadow_overflows = _tag_ctl.shadow_overflows + _tag_tls.t->shadow.overflows;
    out->anomalies = _tag_ctl.anomaly_count;
    out->snapshots = _tag_ctl.snapshot_seq;
}
