/* attach.c - libtag loaded into a process that is already running.
 *
 * `forensics attach PID` stops one thread of the process with ptrace and
 * makes it call dlopen() on libtag.so, then libtag_attach().  A library
 * loaded that late interposes nothing by itself: every module's calls to
 * the malloc family were bound to glibc when it was loaded.  libtag_attach
 * rebinds them: in each loaded module (the program, its libraries, glibc
 * itself, whose own calls to malloc go through its PLT) every GOT entry
 * that names a function of the malloc family - a JUMP_SLOT (a call through
 * the PLT) or a GLOB_DAT (an address taken) - is pointed at libtag's, the
 * entry made writable for the store when RELRO made it read-only, and put
 * back as it was.  dlopen and dlmopen are rebound too, to a wrapper that
 * rebinds the modules a dlopen brings in.
 *
 * From then on every new block is libtag's.  The blocks glibc handed out
 * before stay glibc's: free, realloc and malloc_usable_size of a pointer
 * outside libtag's heap region go to glibc (_tag_foreign: the exact-free
 * arithmetic on the address, never a guess from the bytes in front of it).
 * Threads that existed before get their state at their first allocation,
 * as any thread does.
 *
 * The constructor of a library loaded this late finds the program's signal
 * handlers in place: libtag takes a signal (its snapshot request, the crash
 * hook) only where the program left the default action (_tag_late).
 *
 * What it cannot do: a static binary has no GOT to rebind (forensics
 * refuses it); a call to __libc_malloc, or through a function pointer the
 * program copied before the attach, stays glibc's; C++ operators are
 * libstdc++'s, which call malloc and free (so new/delete mismatches are not
 * seen); there is no detach.
 */
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "alloc/alloc.h"
#include "alloc/foreign.h"
#include "snapshot/snapshot.h"
#include "libtag.h"

extern void __libc_free(void *);
extern void *__libc_malloc(size_t);

/* What attach rebinds, in two passes: first what takes a block back
 * (free, realloc, malloc_usable_size - libtag's hands glibc's blocks to
 * glibc), in every module, then what hands one out.  In between, no libtag
 * block exists yet, so a pass 1 that fails can be undone whole; after it,
 * a libtag block can only reach libtag's free. */
struct rebind {
    const char *name;
    void *to;
    int pass;     /* 1: takes blocks back; 2: hands them out; 3: neither */
};

static void *attach_dlopen(const char *file, int mode);
static void *attach_dlmopen(Lmid_t lm, const char *file, int mode);

static const struct rebind *rebinds(size_t *n)
{
    static const struct rebind table[] = {
        {"free", (void *)_tag_free_self, 1},
        {"realloc", (void *)_tag_realloc_self, 1},
        {"reallocarray", (void *)_tag_reallocarray_self, 1},
        {"malloc_usable_size", (void *)_tag_malloc_usable_size_self, 1},
        {"malloc", (void *)_tag_malloc_self, 2},
        {"calloc", (void *)_tag_calloc_self, 2},
        {"memalign", (void *)_tag_memalign_self, 2},
        {"aligned_alloc", (void *)_tag_aligned_alloc_self, 2},
        {"posix_memalign", (void *)_tag_posix_memalign_self, 2},
        {"valloc", (void *)_tag_valloc_self, 2},
        {"pvalloc", (void *)_tag_pvalloc_self, 2},
        {"dlopen", (void *)attach_dlopen, 3},
        {"dlmopen", (void *)attach_dlmopen, 3},
        {"sigaction", (void *)_tag_sigaction_self, 3},
        {"signal", (void *)_tag_signal_self, 3},
    };
    *n = sizeof table / sizeof table[0];
    return table;
}

/* ------------------------------------------------------------ rebinding */

static uintptr_t dyn_ptr(uintptr_t base, uintptr_t v)
{
    /* ld.so relocates most of a module's dynamic entries in place; those of
     * a module it could not write (and the vDSO's) stay offsets */
    return v >= base ? v : v + base;
}

#define UNDO_MAX 1024

struct rebind_state {
    const ElfW(Dyn) *self_dynamic;
    int pass;                  /* the pass being made; 0: only check */
    uintptr_t lo, hi;          /* the module being rebound: its loaded span */
    void *global[32];          /* what the process's global scope binds each name to */
    unsigned patched;
    int error;                 /* an errno: the pass stops */
    unsigned undo_n;           /* pass 1's writes, to undo on failure */
    struct { void **slot; void *old; } undo[UNDO_MAX];
};

/* Write v to GOT/data slot *slot, making its page writable for the store
 * when RELRO made it read-only (ld.so protects [start, end) rounded down
 * to pages at both ends: a partial last page stays writable). */
static int store(void **slot, void *v, uintptr_t base, const ElfW(Phdr) *phdr, int phnum)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    int ro = 0;
    for (int p = 0; p < phnum; p++) {
        if (phdr[p].p_type != PT_GNU_RELRO)
            continue;
        uintptr_t lo = (base + phdr[p].p_vaddr) & ~(page - 1);
        uintptr_t hi = (base + phdr[p].p_vaddr + phdr[p].p_memsz) & ~(page - 1);
        if ((uintptr_t)slot >= lo && (uintptr_t)slot < hi)
            ro = 1;
    }
    void *pg = (void *)((uintptr_t)slot & ~(page - 1));
    if (ro && mprotect(pg, page, PROT_READ | PROT_WRITE) != 0)
        return errno;
    __atomic_store_n(slot, v, __ATOMIC_RELEASE);
    if (ro)
        mprotect(pg, page, PROT_READ);
    return 0;
}

/* The module's relocations [rel, rel+size) that name a function of the
 * table: a JUMP_SLOT (a call through the PLT), a GLOB_DAT (its address
 * taken) or an R_X86_64_64 with no addend (its address stored in data: a
 * library's own table of allocator functions).  Pass 0 checks that each
 * holds the global scope's function (else the process uses another
 * allocator somewhere, and attach refuses); passes 1-3 rewrite. */
static void rebind_relocs(uintptr_t base, const ElfW(Rela) *rel, size_t size,
                          const ElfW(Sym) *symtab, const char *strtab,
                          const ElfW(Phdr) *phdr, int phnum, struct rebind_state *st)
{
    size_t n;
    const struct rebind *table = rebinds(&n);
    for (size_t i = 0; i < size / sizeof *rel && !st->error; i++) {
        unsigned type = ELF64_R_TYPE(rel[i].r_info);
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT &&
            !(type == R_X86_64_64 && rel[i].r_addend == 0))
            continue;
        const char *name = strtab + symtab[ELF64_R_SYM(rel[i].r_info)].st_name;
        for (size_t k = 0; k < n; k++) {
            if (strcmp(name, table[k].name) != 0)
                continue;
            void **slot = (void **)(base + rel[i].r_offset);
            void *cur = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
            if (cur == table[k].to)
                break;
            /* an address in data (R_X86_64_64) the program may have
             * changed since: rewritten only while it is the global one */
            if (type == R_X86_64_64 && cur != st->global[k])
                break;
            if (st->pass == 0) {
                /* a slot bound to another function than the global scope's
                 * (a second namespace, a module bound to itself) would hand
                 * libtag's blocks to another allocator: refuse.  A JUMP_SLOT
                 * not yet bound (lazy binding) holds a stub in its own
                 * module: it is rewritten below all the same. */
                uintptr_t c = (uintptr_t)cur;
                int lazy = type == R_X86_64_JUMP_SLOT && c >= st->lo && c < st->hi;
                if (table[k].pass != 3 && cur != st->global[k] && !lazy)
                    st->error = EOPNOTSUPP;
                break;
            }
            if (table[k].pass != st->pass)
                break;
            int e = store(slot, table[k].to, base, phdr, phnum);
            if (e) {
                st->error = e;
                break;
            }
            if (st->pass == 1) {
                if (st->undo_n == UNDO_MAX) {
                    st->error = E2BIG;
                    break;
                }
                st->undo[st->undo_n].slot = slot;
                st->undo[st->undo_n++].old = cur;
            }
            st->patched++;
            break;
        }
    }
}

static int rebind_module(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct rebind_state *st = data;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn || dyn == st->self_dynamic || st->error)
        return 0;  /* no dynamic section (the vDSO may have one), or libtag */
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    if (strstr(name, "/ld-linux") || strncmp(name, "ld-linux", 8) == 0)
        return 0;  /* the dynamic linker calls glibc's allocator by pointer */
    uintptr_t base = info->dlpi_addr;
    st->lo = UINTPTR_MAX;
    st->hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        if (base + ph->p_vaddr < st->lo)
            st->lo = base + ph->p_vaddr;
        if (base + ph->p_vaddr + ph->p_memsz > st->hi)
            st->hi = base + ph->p_vaddr + ph->p_memsz;
    }
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *rela = NULL, *jmprel = NULL;
    size_t relasz = 0, pltrelsz = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_RELA: rela = (const ElfW(Rela) *)dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
        default: break;
        }
    }
    if (!symtab || !strtab)
        return 0;
    if (jmprel)
        rebind_relocs(base, jmprel, pltrelsz, symtab, strtab, info->dlpi_phdr, info->dlpi_phnum, st);
    if (rela)
        rebind_relocs(base, rela, relasz, symtab, strtab, info->dlpi_phdr, info->dlpi_phnum, st);
    return 0;
}

#pragma weak _DYNAMIC

static struct rebind_state rebind_st;  /* under rebind_lock: its undo log is large */
static int rebind_lock;

/* Check, then rebind every module in passes; 0 slots rewritten is fine on
 * a later call (after a dlopen), an error is a negative errno. */
static int rebind_all(void)
{
    while (__atomic_exchange_n(&rebind_lock, 1, __ATOMIC_ACQUIRE))
        sched_yield();
    struct rebind_state *st = &rebind_st;
    memset(st, 0, sizeof *st);
    st->self_dynamic = _DYNAMIC;  /* link.h: this module's own */
    size_t n;
    const struct rebind *table = rebinds(&n);
    for (size_t k = 0; k < n && k < sizeof st->global / sizeof st->global[0]; k++)
        st->global[k] = dlsym(RTLD_DEFAULT, table[k].name);
    int r = 0;
    for (st->pass = 0; st->pass <= 3 && !st->error; st->pass++) {
        dl_iterate_phdr(rebind_module, st);
        if (st->error && st->pass == 1) {
            while (st->undo_n--)  /* no libtag block exists yet: undo pass 1 whole */
                *st->undo[st->undo_n].slot = st->undo[st->undo_n].old;
            st->patched = 0;
        }
    }
    r = st->error ? -st->error : (int)st->patched;
    __atomic_store_n(&rebind_lock, 0, __ATOMIC_RELEASE);
    return r;
}

/* ------------------------------------------------------------- dlopen */

/* Find a bare-named library (no '/') the way the caller's DT_RUNPATH or
 * DT_RPATH (and $ORIGIN in them) would, since dlopen called from here
 * searches libtag's: into path; 0 when not found there. */
static int caller_search(const void *caller, const char *file, char *path, size_t cap)
{
    struct dl_find_object fo;
    if (strchr(file, '/') || _dl_find_object((void *)caller, &fo) != 0 || !fo.dlfo_link_map)
        return 0;
    struct link_map *lm = fo.dlfo_link_map;
    const char *strtab = NULL, *list = NULL;
    uintptr_t runpath = 0, rpath = 0;
    for (const ElfW(Dyn) *d = lm->l_ld; d && d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_STRTAB)
            strtab = (const char *)dyn_ptr(lm->l_addr, d->d_un.d_ptr);
        else if (d->d_tag == DT_RUNPATH)
            runpath = d->d_un.d_val;
        else if (d->d_tag == DT_RPATH)
            rpath = d->d_un.d_val;
    }
    if (!strtab || !(runpath || rpath))
        return 0;
    list = strtab + (runpath ? runpath : rpath);
    char origin[1024];
    if (lm->l_name && lm->l_name[0] == '/') {
        size_t len = strlen(lm->l_name);
        if (len >= sizeof origin)
            return 0;
        memcpy(origin, lm->l_name, len + 1);
    } else {
        ssize_t len = readlink("/proc/self/exe", origin, sizeof origin - 1);
        if (len <= 0)
            return 0;
        origin[len] = 0;
    }
    char *slash = strrchr(origin, '/');
    if (slash)
        *slash = 0;
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ':');
        size_t dl = end ? (size_t)(end - p) : strlen(p);
        size_t o = 0;
        for (size_t i = 0; i < dl && o < cap - 1;) {
            if (strncmp(p + i, "$ORIGIN", 7) == 0 || strncmp(p + i, "${ORIGIN}", 9) == 0) {
                size_t skip = p[i + 1] == '{' ? 9 : 7;
                for (const char *q = origin; *q && o < cap - 1; q++)
                    path[o++] = *q;
                i += skip;
            } else {
                path[o++] = p[i++];
            }
        }
        size_t fl = strlen(file);
        if (o && o + 1 + fl < cap) {
            path[o++] = '/';
            memcpy(path + o, file, fl + 1);
            if (access(path, R_OK) == 0)
                return 1;
        }
        p = end ? end + 1 : p + dl;
    }
    return 0;
}

static void *attach_dlopen(const char *file, int mode)
{
    char path[4096];
    const char *name = file;
    if (file && caller_search(__builtin_return_address(0), file, path, sizeof path))
        name = path;
    void *h = dlopen(name, mode);
    int saved = errno;
    if (h)
        rebind_all();
    errno = saved;
    return h;
}

static void *attach_dlmopen(Lmid_t lm, const char *file, int mode)
{
    char path[4096];
    const char *name = file;
    if (file && caller_search(__builtin_return_address(0), file, path, sizeof path))
        name = path;
    void *h = dlmopen(lm, name, mode);
    int saved = errno;
    if (h)
        rebind_all();
    errno = saved;
    return h;
}

/* Called once in the process, by `forensics attach` (through ptrace) right
 * after it loaded libtag: rebind every module.  Returns the GOT entries
 * rebound (> 0), or a negative errno; -EALREADY when libtag was preloaded
 * (it interposes already) or attached before. */
TAG_EXPORT int libtag_attach(void)
{
    if (!_tag_late)
        return -EALREADY;
    if (dlsym(RTLD_DEFAULT, "free") != (void *)__libc_free ||
        dlsym(RTLD_DEFAULT, "malloc") != (void *)__libc_malloc)
        return -EOPNOTSUPP;  /* another allocator: its blocks are not glibc's */
    if (__atomic_exchange_n(&_tag_attached, 1, __ATOMIC_ACQ_REL))
        return -EALREADY;
    int r = rebind_all();
    if (r <= 0 && rebind_st.patched == 0)  /* nothing rebound (or undone): as before */
        __atomic_store_n(&_tag_attached, 0, __ATOMIC_RELEASE);
    return r == 0 ? -ENOENT : r;
}
