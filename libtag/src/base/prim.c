/* prim.c - libtag's primitives: the low-level operations its feature
 * files share, each a thin layer over the kernel or the CPU.  Nothing here
 * calls a feature file (tag, heap, quarantine, sweep, snapshot, ...): the
 * arrows point one way, from the features down to these (and to log.c).
 *
 *   _tag_map, _tag_unmap      libtag's own memory, fenced by guard pages
 *   _tag_copy_own             a copy of our own memory that cannot fault
 *   _tag_probe_*              a load that may fault, recovered by the crash
 *                             hook (the sweep's reads outside the heap)
 *   _tag_save_regs            a signal context's registers into a record
 *   _tag_die                  die of a signal's default action, now
 *
 * /proc/self/maps is read by maps.c.  All of it is async-signal-safe but
 * _tag_map (mmap and prctl are, but it is not called from a handler).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/base.h"
#include "base/prim.h"

#ifdef __aarch64__
/* ---------------------------------------------------------------- pages */
unsigned _tag_page_size;

/* The system's page size (4, 16 or 64 KiB), once, before anything maps:
 * sysconf reads the kernel's AT_PAGESZ, which the loader kept (no malloc,
 * no system call). */
void _tag_page_init(void)
{
    if (!__atomic_load_n(&_tag_page_size, __ATOMIC_RELAXED)) {
        long p = sysconf(_SC_PAGESIZE);
        __atomic_store_n(&_tag_page_size, p >= 4096 && p <= (long)TAG_PAGE_MAX ? (unsigned)p : 4096u,
                         __ATOMIC_RELAXED);
    }
}
#endif

/* ------------------------------------------------------------- memory */
/* libtag's own memory: never the heap it tags.  A PROT_NONE page on each
 * side keeps the kernel from merging the mapping with a neighbour (a glibc
 * mmap'ed chunk, a thread stack), so a reader can tell libtag's tables from
 * the program's memory by address range, and a scan that skips them skips
 * nothing else.  The name shows in /proc/PID/maps where the kernel has
 * CONFIG_ANON_VMA_NAME. */
void *_tag_map(size_t bytes, int noreserve)
{
    _tag_page_init();
    size_t page = TAG_PAGE_SIZE, len = (bytes + page - 1) & ~(page - 1);
    char *p = mmap(NULL, len + 2 * page, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (mmap(p + page, len, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | (noreserve ? MAP_NORESERVE : 0),
             -1, 0) == MAP_FAILED) {
        munmap(p, len + 2 * page);
        return NULL;
    }
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)(p + page), len,
          (unsigned long)"libtag");
    return p + page;
}

void _tag_unmap(void *addr, size_t bytes)
{
    size_t page = TAG_PAGE_SIZE, len = (bytes + page - 1) & ~(page - 1);
    munmap((char *)addr - page, len + 2 * page);
}

/* ------------------------------------------------------ own-memory copy */
int _tag_copy_own_refused;

unsigned _tag_copy_own(struct iovec *local, struct iovec *remote, unsigned n)
{
    unsigned done = 0;
    pid_t pid = getpid();
    while (done < n) {
        ssize_t got = process_vm_readv(pid, local + done, n - done, remote + done, n - done, 0);
        if (got < 0) {
            if (errno == EPERM || errno == ENOSYS)
                _tag_copy_own_refused = 1;
            return done;
        }
        /* whole iovecs copied; the next one faulted (or all are done) */
        while (done < n && (size_t)got >= remote[done].iov_len) {
            got -= (ssize_t)remote[done].iov_len;
            done++;
        }
        if (done < n) {
            /* mark the faulting one as unreadable and go on after it */
            local[done].iov_len = 0;
            done++;
        }
    }
    return done;
}

/* --------------------------------------------------------------- probe */
/* A remembered block outside the heap may be unmapped: it is read with a
 * probe, one 8-byte load at a known instruction (_tag_probe_insn) that may
 * fault.  While the thread is probing (tag_thread_state.probing), libtag's
 * SIGSEGV/SIGBUS handler, which runs first for every such signal
 * (crash.c), recognises a fault at that instruction and resumes at the
 * probe's failure exit (_tag_probe_fixup), the way the kernel's exception
 * tables work.  That is only safe where libtag's handler is installed for
 * both signals (_tag_probe_armed) and neither is blocked in this thread
 * (_tag_probe_safe). */
int _tag_probe_armed;

/* int _tag_probe_word(const void *src, uint64_t *dst): copy 8 bytes from
 * src; 0, or 1 when the load faulted (then dst is left alone).  The load
 * is the one instruction the crash hook recovers from. */
__asm__(".text\n"
        ".p2align 4\n"
        ".globl _tag_probe_word\n"
        ".hidden _tag_probe_word\n"
        ".type _tag_probe_word, " TAG_ARCH_FUNC_TYPE "\n"
        "_tag_probe_word:\n"
        ".cfi_startproc\n"
        ".globl _tag_probe_insn\n"
        ".hidden _tag_probe_insn\n"
        "_tag_probe_insn:\n"
        TAG_ARCH_PROBE_LOAD
        ".globl _tag_probe_fixup\n"
        ".hidden _tag_probe_fixup\n"
        "_tag_probe_fixup:\n"
        TAG_ARCH_PROBE_FAIL
        ".cfi_endproc\n"
        ".size _tag_probe_word, .-_tag_probe_word\n");
extern const char _tag_probe_insn[], _tag_probe_fixup[];

int _tag_probe_fault(int sig, void *ucv)
{
    ucontext_t *uc = ucv;
    if ((sig != SIGSEGV && sig != SIGBUS) ||
        tag_uc_pc(uc) != (uint64_t)(uintptr_t)_tag_probe_insn)
        return 0;
    tag_uc_set_pc(uc, (uint64_t)(uintptr_t)_tag_probe_fixup);
    return 1;
}

/* May this thread probe now?  libtag's handler installed, and SIGSEGV and
 * SIGBUS not blocked (one rt_sigprocmask, which only reads the mask). */
int _tag_probe_safe(void)
{
    if (!__atomic_load_n(&_tag_probe_armed, __ATOMIC_RELAXED))
        return 0;
    sigset_t cur;
    if (pthread_sigmask(SIG_BLOCK, NULL, &cur) != 0)
        return 0;
    return !sigismember(&cur, SIGSEGV) && !sigismember(&cur, SIGBUS);
}

/* ---------------------------------------------------------- registers */
/* The order is the machine's (base/arch.h: tag_arch_save_regs); on x86_64
 * struct user_regs_struct, as in a core's NT_PRSTATUS note. */
void _tag_save_regs(struct libtag_thread *r, const struct ucontext_t *uc)
{
    if (!r)
        return;  /* a thread without a record (its state could not be mapped) */
    tag_arch_save_regs(r->regs, uc);
    __atomic_or_fetch(&r->flags, TAG_THREAD_REGS, __ATOMIC_RELEASE);
}

/* --------------------------------------------------------------- death */
/* Die of sig with its default action, whatever handler is installed.
 * Raw system calls: in a raw-clone child glibc's raise() would signal the
 * parent's thread id cached in the thread descriptor. */
void _tag_die(int sig)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof(sigset_t) / 16);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    syscall(SYS_rt_sigprocmask, SIG_UNBLOCK, &set, NULL, 8);
    syscall(SYS_tgkill, syscall(SYS_getpid), syscall(SYS_gettid), sig);
}
