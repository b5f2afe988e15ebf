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
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "libtag_internal.h"
#include "libtag.h"

int _tag_attached;
int _tag_late;

extern void __libc_free(void *);
extern void *__libc_realloc(void *, size_t);

/* The malloc family as libtag defines it (interpose.c's hidden aliases):
 * the addresses written into the modules' GOTs. */
struct rebind {
    const char *name;
    void *to;
};

static void *attach_dlopen(const char *file, int mode);
static void *attach_dlmopen(Lmid_t lm, const char *file, int mode);

static const struct rebind *rebinds(size_t *n)
{
    static const struct rebind table[] = {
        {"malloc", (void *)_tag_malloc_self},
        {"free", (void *)_tag_free_self},
        {"calloc", (void *)_tag_calloc_self},
        {"realloc", (void *)_tag_realloc_self},
        {"reallocarray", (void *)_tag_reallocarray_self},
        {"memalign", (void *)_tag_memalign_self},
        {"aligned_alloc", (void *)_tag_aligned_alloc_self},
        {"posix_memalign", (void *)_tag_posix_memalign_self},
        {"valloc", (void *)_tag_valloc_self},
        {"pvalloc", (void *)_tag_pvalloc_self},
        {"malloc_usable_size", (void *)_tag_malloc_usable_size_self},
        {"dlopen", (void *)attach_dlopen},
        {"dlmopen", (void *)attach_dlmopen},
    };
    *n = sizeof table / sizeof table[0];
    return table;
}

/* The usable size of a glibc chunk (its header: the size word 8 bytes in
 * front of the pointer, bit 1 set for an mmap'ed one). */
static size_t glibc_usable(const void *p)
{
    size_t head = ((const size_t *)p)[-1];
    size_t size = head & ~(size_t)7;
    return (head & 2) ? size - 16 : size - 8;
}

void _tag_foreign_free(void *p)
{
    __libc_free(p);
}

void *_tag_foreign_realloc(void *p, size_t n)
{
    return __libc_realloc(p, n);
}

size_t _tag_foreign_usable(const void *p)
{
    return glibc_usable(p);
}

/* ------------------------------------------------------------ rebinding */

static uintptr_t dyn_ptr(uintptr_t base, uintptr_t v)
{
    /* ld.so relocates most of a module's dynamic entries in place; those of
     * a module it could not write (and the vDSO's) stay offsets */
    return v >= base ? v : v + base;
}

struct rebind_state {
    const ElfW(Dyn) *self_dynamic;
    unsigned patched;
    int error;
};

/* Write to each GOT entry of the module's relocations [rel, rel+size) that
 * names a function of the table. */
static void rebind_relocs(uintptr_t base, const ElfW(Rela) *rel, size_t size,
                          const ElfW(Sym) *symtab, const char *strtab,
                          const ElfW(Phdr) *phdr, int phnum, struct rebind_state *st)
{
    size_t n;
    const struct rebind *table = rebinds(&n);
    long page = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < size / sizeof *rel; i++) {
        unsigned type = ELF64_R_TYPE(rel[i].r_info);
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
            continue;
        const char *name = strtab + symtab[ELF64_R_SYM(rel[i].r_info)].st_name;
        for (size_t k = 0; k < n; k++) {
            if (strcmp(name, table[k].name) != 0)
                continue;
            void **slot = (void **)(base + rel[i].r_offset);
            if (*slot == table[k].to)
                break;
            /* the slot's protection: RELRO's read-only, else writable */
            int ro = 0;
            for (int p = 0; p < phnum; p++) {
                if (phdr[p].p_type == PT_GNU_RELRO &&
                    (uintptr_t)slot - (base + phdr[p].p_vaddr) < phdr[p].p_memsz)
                    ro = 1;
            }
            void *pg = (void *)((uintptr_t)slot & ~(uintptr_t)(page - 1));
            if (ro && mprotect(pg, (size_t)page, PROT_READ | PROT_WRITE) != 0) {
                st->error = errno;
                break;
            }
            __atomic_store_n(slot, table[k].to, __ATOMIC_RELEASE);
            if (ro)
                mprotect(pg, (size_t)page, PROT_READ);
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
    if (!dyn || dyn == st->self_dynamic)
        return 0;  /* no dynamic section (the vDSO may have one), or libtag */
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    if (strstr(name, "/ld-linux") || strncmp(name, "ld-linux", 8) == 0)
        return 0;  /* the dynamic linker calls glibc's allocator by pointer */
    uintptr_t base = info->dlpi_addr;
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



static int rebind_all(void)
{
    struct rebind_state st = {.self_dynamic = _DYNAMIC};  /* link.h: this module's own */
    dl_iterate_phdr(rebind_module, &st);
    if (st.error)
        return -st.error;
    return (int)st.patched;
}

static void *attach_dlopen(const char *file, int mode)
{
    void *h = dlopen(file, mode);
    int saved = errno;
    if (h)
        rebind_all();
    errno = saved;
    return h;
}

static void *attach_dlmopen(Lmid_t lm, const char *file, int mode)
{
    void *h = dlmopen(lm, file, mode);
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
    if (__atomic_exchange_n(&_tag_attached, 1, __ATOMIC_ACQ_REL))
        return -EALREADY;
    int r = rebind_all();
    return r == 0 ? -ENOENT : r;
}
