/* new_delete.c - the C++ allocation operators, so a block knows which one
 * made it.
 *
 * libtag defines every replaceable form of operator new and delete (plain,
 * array, aligned, nothrow, sized; C++17 [new.delete]) under its mangled name
 * in the Itanium C++ ABI for x86_64 (size_t is unsigned long: "m"), in C.
 * Each new records its form in the tag (enum libtag_alloc_kind); each
 * delete, like free(), says which form it expects, and a release by the
 * wrong one (free() of a new'd block, delete of a malloc'd one, delete of
 * new[]) is an alloc-dealloc-mismatch anomaly - reported, then the block is
 * released as usual, so the program neither leaks nor crashes.
 *
 * Failure keeps C++ semantics.  A throwing operator new that gets no memory
 * hands the request to the next definition (libstdc++'s, found with
 * dlsym(RTLD_NEXT) on this rare path only), which runs the new_handler loop
 * and throws std::bad_alloc: the exception unwinds through libtag's frames,
 * which have unwind tables.  If a new_handler frees memory and the retry
 * succeeds, the block came from libtag's malloc: it gets its form set
 * again.  The nothrow forms do the same through the next nothrow
 * definition, which returns NULL where the throwing one throws.
 *
 * A program (or a preloaded allocator) that replaces operator new or delete
 * itself pairs them with malloc and free in its own way: then only new
 * against new[] is checked, never new against malloc (_tag_cxx_checked).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/log.h"
#include "alloc/alloc.h"
#include "alloc/tag.h"

#define RET   __builtin_return_address(0)
#define FRAME __builtin_frame_address(0)

typedef void *(*new_fn)(size_t);
typedef void *(*new_nt_fn)(size_t, const void *);
typedef void *(*new_al_fn)(size_t, size_t);
typedef void *(*new_al_nt_fn)(size_t, size_t, const void *);

static TAG_COLD void *next_symbol(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

/* A block the next definition returned came from libtag's malloc family:
 * mark how the program asked for it. */
static TAG_COLD void *set_kind(void *p, uint32_t kind)
{
    if (p && _tag_lookup(p) == TAG_IS_LIVE)
        _tag_set_bits(p, (uint64_t)TAG_ALLOC_MASK << TAG_ALLOC_SHIFT,
                      (uint64_t)kind << TAG_ALLOC_SHIFT);
    return p;
}

static TAG_COLD __attribute__((noreturn)) void no_runtime(const char *name)
{
    _tag_fatal("libtag: %s found no memory and there is no C++ runtime to throw "
               "std::bad_alloc", name);
}

static TAG_COLD void *new_failed(const char *name, size_t size, uint32_t kind)
{
    new_fn next = (new_fn)next_symbol(name);
    if (!next)
        no_runtime(name);
    return set_kind(next(size), kind);
}

static TAG_COLD void *new_nothrow_failed(const char *name, size_t size, const void *nt,
                                         uint32_t kind)
{
    new_nt_fn next = (new_nt_fn)next_symbol(name);
    return next ? set_kind(next(size, nt), kind) : NULL;
}

static TAG_COLD void *new_aligned_failed(const char *name, size_t size, size_t align,
                                         uint32_t kind)
{
    new_al_fn next = (new_al_fn)next_symbol(name);
    if (!next)
        no_runtime(name);
    return set_kind(next(size, align), kind);
}

static TAG_COLD void *new_aligned_nothrow_failed(const char *name, size_t size, size_t align,
                                                 const void *nt, uint32_t kind)
{
    new_al_nt_fn next = (new_al_nt_fn)next_symbol(name);
    return next ? set_kind(next(size, align, nt), kind) : NULL;
}

/* ------------------------------------------------------------------ new */

/* Each form allocates as its kind; on failure it hands over to the next
 * definition of the same name (see the top of this file). */
#define NEW(name, kind)                                                       \
    TAG_EXPORT void *name(size_t size)                                        \
    {                                                                         \
        void *p = _tag_alloc(size, 16, 0, kind, RET, FRAME);                  \
        return TAG_LIKELY(p != NULL) ? p : new_failed(#name, size, kind);     \
    }
#define NEW_NOTHROW(name, kind)                                               \
    TAG_EXPORT void *name(size_t size, const void *nt)                        \
    {                                                                         \
        void *p = _tag_alloc(size, 16, 0, kind, RET, FRAME);                  \
        return TAG_LIKELY(p != NULL) ? p : new_nothrow_failed(#name, size, nt, kind); \
    }
#define NEW_ALIGNED(name, kind)                                               \
    TAG_EXPORT void *name(size_t size, size_t align)                          \
    {                                                                         \
        void *p = _tag_memalign(align, size, kind, RET, FRAME);               \
        return TAG_LIKELY(p != NULL) ? p : new_aligned_failed(#name, size, align, kind); \
    }
#define NEW_ALIGNED_NOTHROW(name, kind)                                       \
    TAG_EXPORT void *name(size_t size, size_t align, const void *nt)          \
    {                                                                         \
        void *p = _tag_memalign(align, size, kind, RET, FRAME);               \
        return TAG_LIKELY(p != NULL) ? p                                      \
                                     : new_aligned_nothrow_failed(#name, size, align, nt, kind); \
    }

NEW(_Znwm, TAG_ALLOC_NEW)                        /* operator new(size_t) */
NEW(_Znam, TAG_ALLOC_NEW_ARRAY)                  /* operator new[](size_t) */
NEW_NOTHROW(_ZnwmRKSt9nothrow_t, TAG_ALLOC_NEW)  /* (size_t, const std::nothrow_t &) */
NEW_NOTHROW(_ZnamRKSt9nothrow_t, TAG_ALLOC_NEW_ARRAY)
NEW_ALIGNED(_ZnwmSt11align_val_t, TAG_ALLOC_NEW_ALIGNED)        /* (size_t, std::align_val_t) */
NEW_ALIGNED(_ZnamSt11align_val_t, TAG_ALLOC_NEW_ARRAY_ALIGNED)
NEW_ALIGNED_NOTHROW(_ZnwmSt11align_val_tRKSt9nothrow_t, TAG_ALLOC_NEW_ALIGNED)
NEW_ALIGNED_NOTHROW(_ZnamSt11align_val_tRKSt9nothrow_t, TAG_ALLOC_NEW_ARRAY_ALIGNED)

/* --------------------------------------------------------------- delete */
/* delete of a null pointer does nothing ([expr.delete]); the sized and
 * nothrow forms release as the plain one of their family. */

#define DELETE(name, params, kind)                                            \
    TAG_EXPORT void name params                                               \
    {                                                                         \
        if (p) {                                                              \
            int saved = errno;  /* as free(): errno is left alone */          \
            _tag_free(p, kind, RET, FRAME);                                   \
            errno = saved;                                                    \
        }                                                                     \
    }
#define UNUSED __attribute__((unused))

DELETE(_ZdlPv, (void *p), TAG_ALLOC_NEW)
DELETE(_ZdaPv, (void *p), TAG_ALLOC_NEW_ARRAY)
DELETE(_ZdlPvm, (void *p, UNUSED size_t size), TAG_ALLOC_NEW)
DELETE(_ZdaPvm, (void *p, UNUSED size_t size), TAG_ALLOC_NEW_ARRAY)
DELETE(_ZdlPvRKSt9nothrow_t, (void *p, UNUSED const void *nt), TAG_ALLOC_NEW)
DELETE(_ZdaPvRKSt9nothrow_t, (void *p, UNUSED const void *nt), TAG_ALLOC_NEW_ARRAY)
DELETE(_ZdlPvSt11align_val_t, (void *p, UNUSED size_t align), TAG_ALLOC_NEW_ALIGNED)
DELETE(_ZdaPvSt11align_val_t, (void *p, UNUSED size_t align), TAG_ALLOC_NEW_ARRAY_ALIGNED)
DELETE(_ZdlPvmSt11align_val_t, (void *p, UNUSED size_t size, UNUSED size_t align),
       TAG_ALLOC_NEW_ALIGNED)
DELETE(_ZdaPvmSt11align_val_t, (void *p, UNUSED size_t size, UNUSED size_t align),
       TAG_ALLOC_NEW_ARRAY_ALIGNED)
DELETE(_ZdlPvSt11align_val_tRKSt9nothrow_t, (void *p, UNUSED size_t align, UNUSED const void *nt),
       TAG_ALLOC_NEW_ALIGNED)
DELETE(_ZdaPvSt11align_val_tRKSt9nothrow_t, (void *p, UNUSED size_t align, UNUSED const void *nt),
       TAG_ALLOC_NEW_ARRAY_ALIGNED)

/* ------------------------------------------------------------ pairing */

/* Are the program's plain operators libtag's?  Then a new'd block freed by
 * free(), or a malloc'd one deleted, is the program's mismatch; otherwise
 * its own operator new or delete may sit on malloc/free and the pairing is
 * its business.  Asked once, on the first mismatch (dlsym may allocate:
 * fine on the free path, which holds no lock). */
static int program_uses_ours(void)
{
    static int answer = -1;
    int a = __atomic_load_n(&answer, __ATOMIC_RELAXED);
    if (a < 0) {
        a = dlsym(RTLD_DEFAULT, "_Znwm") == (void *)_Znwm &&
            dlsym(RTLD_DEFAULT, "_Znam") == (void *)_Znam &&
            dlsym(RTLD_DEFAULT, "_ZdlPv") == (void *)_ZdlPv &&
            dlsym(RTLD_DEFAULT, "_ZdaPv") == (void *)_ZdaPv;
        __atomic_store_n(&answer, a, __ATOMIC_RELAXED);
    }
    return a;
}

int _tag_cxx_checked(uint32_t alloc_kind, uint32_t dealloc)
{
    if (alloc_kind == TAG_ALLOC_MALLOC || dealloc == TAG_ALLOC_MALLOC)
        return program_uses_ours();
    return 1;  /* both sides went through libtag's operators */
}
