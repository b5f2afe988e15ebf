/* corewrite.c - the second core path: where the kernel
 * will not write a plain core file (core_pattern pipes to systemd-coredump or
 * apport, or RLIMIT_CORE is 0 and may not be raised), the snapshot fork child
 * writes an ELF core of its own memory itself.
 *
 * What is written mirrors the kernel's fs/binfmt_elf.c with the default
 * coredump_filter 0x33 (see core(5) and vma_dump_size()):
 *
 *   ELF header (ET_CORE, the machine's: EM_X86_64 or EM_AARCH64)
 *   program headers: one PT_NOTE, then one PT_LOAD per mapping in
 *     /proc/self/maps, except [vvar], [vvar_vclock] and [vsyscall]
 *   notes, each named "CORE": NT_PRSTATUS per thread, NT_PRPSINFO, NT_AUXV,
 *     NT_FILE (same layout as the kernel's fill_files_note()); on aarch64
 *     NT_FPREGSET per thread too, after its NT_PRSTATUS (after the
 *     process's notes for the first), as the kernel orders them
 *   page-aligned segment data.  p_filesz = p_memsz for
 *     - anonymous private mappings ([heap], [stack], [anon:...], bss, thread
 *       stacks): pages that were never touched are left as file holes, as the
 *       kernel does (it skips pages get_dump_page() does not find);
 *     - shared anonymous mappings (/dev/zero, memfd, deleted files: the
 *       kernel's "i_nlink == 0" test) and [vdso];
 *     - writable private file mappings (.data) and the read-only RELRO part
 *       just before them (.got, .dynamic: written by ld.so, so the kernel
 *       sees an anon_vma there; gdb needs DT_DEBUG from it to find r_debug);
 *   p_filesz = one page for a readable private file mapping at file offset 0
 *   (the ELF header, MMF_DUMP_ELF_HEADERS); p_filesz = 0 for the rest
 *   (text, read-only data, shared file mappings, unreadable mappings).
 *
 * Memory is never touched directly: it goes to write(2) straight from the
 * mapping, so a page the kernel cannot read (a file mapping past EOF, a
 * VM_IO mapping) makes write() fail with EFAULT instead of raising SIGBUS in
 * the child, and that page is written as zeros.
 *
 * Bounds: at most CW_MAX_MAPS mappings (one program header each; e_phnum is
 * 16 bits and 0xffff means PN_XNUM, which we do not write) - beyond it the
 * list is truncated, keeping the lowest addresses plus [stack] and [vdso] in
 * the last CW_KEEP_SLOTS slots (the core stays valid, the other higher
 * mappings are missing, thread stacks among them); NT_FILE paths share a CW_PATH_POOL pool - a
 * mapping whose path does not fit stays in the PT_LOADs but is left out of
 * NT_FILE; a /proc/self/maps line longer than maps.c's read window
 * (TAG_MAPS_WINDOW) is dropped.
 * Known differences from the kernel: MADV_DONTDUMP is not honoured (maps does
 * not show it), PROT_NONE pages that were once written are not dumped (the
 * kernel reads them with FOLL_FORCE), no NT_SIGINFO, and on x86_64 no
 * NT_FPREGSET/NT_X86_XSTATE.
 *
 * Async-signal-safe: no locks, no malloc, no stdio.  Only open, read, pread,
 * write, lseek, fstat, close and raw syscalls.  All buffers are static: the
 * fork child is single-threaded, and static data keeps the stack small.
 */
#include <elf.h>
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/procfs.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef __x86_64__
#include <asm/prctl.h>
#endif

#include "base/base.h"
#include "base/prim.h"
#include "stacks/thread.h"
#include "snapshot/corewrite.h"
#include "snapshot/snapshot.h"

/* The note layouts gdb and the kernel agree on: pr_reg is x86_64's
 * user_regs_struct, aarch64's user_pt_regs (x0-x30, sp, pc, pstate),
 * filled from the thread record's registers (base/arch.h). */
#ifdef __x86_64__
_Static_assert(sizeof(struct elf_prstatus) == 336, "elf_prstatus is 336 bytes");
#else
_Static_assert(sizeof(struct elf_prstatus) == 392, "elf_prstatus is 392 bytes");
#endif
_Static_assert(sizeof(struct elf_prpsinfo) == 136, "elf_prpsinfo is 136 bytes");
_Static_assert(sizeof(elf_gregset_t) == TAG_ARCH_PRSTATUS_NREGS * 8, "pr_reg is the machine's");

#define CW_PAGE          TAG_PAGE_SIZE
#ifndef CW_MAX_MAPS                  /* -D only to test the truncation */
#define CW_MAX_MAPS      65533u      /* 1 + maps <= 0xfffe program headers;
                                        the default vm.max_map_count is 65530 */
#endif
#define CW_KEEP_SLOTS    4u          /* last slots: [stack] and [vdso] only */
_Static_assert(CW_MAX_MAPS >= 2 * CW_KEEP_SLOTS && CW_MAX_MAPS <= 0xfffd,
               "e_phnum < PN_XNUM");
#define CW_PATH_POOL     (1u << 20)  /* NT_FILE path bytes */
#define CW_SMALL_BUF     8192u       /* auxv, cmdline, comm, stat */
#define CW_OUT_BUF       (64u << 10) /* headers and notes are buffered */
#define CW_PAGEMAP_BATCH 4096u       /* pagemap entries per pread */
#define CW_WRITE_MAX     (1u << 30)  /* per write(2); Linux caps at 0x7ffff000 */

#ifdef __x86_64__
/* user_regs_struct indexes (sys/user.h), the order of pr_reg. */
enum { R_RBP = 4, R_RAX = 10, R_ORIG_RAX = 15, R_RIP = 16, R_CS = 17,
       R_EFLAGS = 18, R_RSP = 19, R_SS = 20, R_FS_BASE = 21, R_GS_BASE = 22 };
#endif

enum { M_R = 1, M_W = 2, M_X = 4, M_SHARED = 8, M_FILE = 16, M_ANON = 32,
       M_VDSO = 64, M_DELETED = 128 };
enum { DUMP_NONE = 0, DUMP_ALL = 1, DUMP_HEADER = 2 };

struct cw_map {
    uint64_t start, end;
    uint64_t offset;     /* file offset in bytes, as /proc/self/maps shows */
    uint32_t path;       /* offset in path_pool */
    uint16_t plen;       /* 0 = not in NT_FILE */
    uint8_t  flags;      /* M_* */
    uint8_t  dump;       /* DUMP_* */
};

static struct cw_map maps[CW_MAX_MAPS];
static unsigned nmaps;
static char path_pool[CW_PATH_POOL];
static uint32_t pool_used;
static unsigned char auxv[CW_SMALL_BUF];
static size_t auxv_len;
static char small[CW_SMALL_BUF];
static uint64_t pagemap_buf[CW_PAGEMAP_BATCH];
static unsigned char obuf[CW_OUT_BUF];
static const unsigned char zero_page[TAG_PAGE_MAX];  /* at least a page */

/* ------------------------------------------------------------ output --
 * Buffered, sequential writer: works on any fd (regular file, /dev/full,
 * a pipe).  On a regular file, untouched anonymous pages become holes. */
static struct {
    int fd;
    int sparse;          /* fd is a regular file: lseek over holes */
    int tail_hole;       /* the last thing emitted was a hole */
    uint64_t off;        /* logical bytes emitted */
    size_t n;            /* bytes pending in obuf */
} W;

static int err_or(int fallback)
{
    return errno ? -errno : -fallback;
}

/* Write all of p (memory we own or a mapping); returns 0 or -errno, and
 * *done = bytes written before the failure. */
static int raw_write(const void *p, size_t len, size_t *done)
{
    const char *c = p;
    size_t left = len;

    while (left) {
        size_t chunk = left > CW_WRITE_MAX ? CW_WRITE_MAX : left;
        ssize_t r = write(W.fd, c, chunk);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                /* a non-blocking pipe (a handed-over snapshot): wait for
                 * the reader, not forever */
                struct pollfd pfd = {.fd = W.fd, .events = POLLOUT};
                int n = poll(&pfd, 1, TAG_HANDOFF_WAIT_MS);
                if (n > 0 && !(pfd.revents & (POLLERR | POLLHUP)))
                    continue;
                if (n == 0)
                    errno = ETIMEDOUT;
                else if (n > 0)
                    errno = EPIPE;
                else if (errno == EINTR)
                    continue;
            }
            *done = len - left;
            return err_or(EIO);
        }
        if (r == 0) {   /* write(2) returning 0 on a non-empty request */
            *done = len - left;
            return -EIO;
        }
        c += r;
        left -= (size_t)r;
    }
    *done = len;
    return 0;
}

static int out_flush(void)
{
    size_t done;
    int rc = 0;

    if (W.n) {
        rc = raw_write(obuf, W.n, &done);
        W.n = 0;
        W.tail_hole = 0;
    }
    return rc;
}

static int out_put(const void *p, size_t len)
{
    if (W.n + len > sizeof obuf) {
        int rc = out_flush();
        if (rc)
            return rc;
    }
    if (len > sizeof obuf) {
        size_t done;
        int rc = raw_write(p, len, &done);
        if (rc)
            return rc;
    } else {
        memcpy(obuf + W.n, p, len);
        W.n += len;
    }
    W.off += len;
    return 0;
}

static int out_zeros(uint64_t len)
{
    while (len) {
        size_t n = len > CW_PAGE ? CW_PAGE : (size_t)len;
        int rc = out_put(zero_page, n);
        if (rc)
            return rc;
        len -= n;
    }
    return 0;
}

/* len bytes that read as zeros: a hole in a regular file. */
static int out_hole(uint64_t len)
{
    int rc;

    if (!len)
        return 0;
    if (!W.sparse)
        return out_zeros(len);
    rc = out_flush();
    if (rc)
        return rc;
    if (lseek(W.fd, (off_t)len, SEEK_CUR) < 0)
        return err_or(EIO);
    W.off += len;
    W.tail_hole = 1;
    return 0;
}

/* Copy [addr, addr+len) of our own memory to the file without reading it
 * here: write(2) reads it, and a page it cannot read (EFAULT) becomes zeros
 * up to the next page boundary. */
static int out_mem(uint64_t addr, uint64_t len)
{
    int rc = out_flush();

    if (rc)
        return rc;
    while (len) {
        size_t done = 0;
        size_t n = len > CW_WRITE_MAX ? CW_WRITE_MAX : (size_t)len;
        rc = raw_write((const void *)(uintptr_t)addr, n, &done);
        addr += done;
        len -= done;
        W.off += done;
        if (done)
            W.tail_hole = 0;
        if (rc == -EFAULT) {
            uint64_t z = CW_PAGE - (addr & (CW_PAGE - 1));
            if (z > len)
                z = len;
            rc = out_zeros(z);
            if (rc == 0)
                rc = out_flush();
            if (rc)
                return rc;
            addr += z;
            len -= z;
        } else if (rc) {
            return rc;
        }
    }
    return 0;
}

/* ---------------------------------------------------------- /proc ----- */
/* Read a whole small file (up to cap bytes); returns its length or -1. */
static ssize_t read_small(const char *path, void *buf, size_t cap)
{
    size_t have = 0;
    int fd = _tag_proc_open(path);

    if (fd < 0)
        return -1;
    while (have < cap) {
        ssize_t r = read(fd, (char *)buf + have, cap - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        have += (size_t)r;
    }
    close(fd);
    return (ssize_t)have;
}

static int starts(const char *p, size_t len, const char *lit)
{
    size_t l = strlen(lit);
    return len >= l && memcmp(p, lit, l) == 0;
}

static int equals(const char *p, size_t len, const char *lit)
{
    return len == strlen(lit) && memcmp(p, lit, len) == 0;
}

/* A mapping for the core: its flags, and its path in the NT_FILE pool. */
static void add_map(const struct tag_maps_line *l, void *ctx)
{
    const char *path = l->path;
    size_t plen = l->plen;
    struct cw_map *m;
    uint8_t flags = 0;
    int keep = 0;

    (void)ctx;
    if (nmaps >= CW_MAX_MAPS)
        return;     /* truncated: see the bounds in the header comment */
    if (l->perms[0] == 'r') flags |= M_R;
    if (l->perms[1] == 'w') flags |= M_W;
    if (l->perms[2] == 'x') flags |= M_X;
    if (l->perms[3] == 's') flags |= M_SHARED;

    if (plen == 0) {
        flags |= M_ANON;
    } else if (path[0] == '[') {
        /* vvar is the kernel's data page (VM_IO/VM_PFNMAP: unreadable
         * through write(2)), vsyscall is execute-only: no PT_LOAD at all. */
        if (starts(path, plen, "[vvar") || equals(path, plen, "[vsyscall]"))
            return;
        flags |= equals(path, plen, "[vdso]") ? M_VDSO : M_ANON;
        if (equals(path, plen, "[stack]"))
            keep = 1;
    } else {
        flags |= M_FILE;
        if (starts(path + (plen > 10 ? plen - 10 : 0), plen > 10 ? 10 : plen,
                   " (deleted)"))
            flags |= M_DELETED;
    }
    /* Near the bound, keep room for the main stack and the vdso, which
     * come last in maps and which gdb needs to unwind. */
    if (nmaps >= CW_MAX_MAPS - CW_KEEP_SLOTS && !keep && !(flags & M_VDSO))
        return;

    m = &maps[nmaps++];
    m->start = l->start;
    m->end = l->end;
    m->offset = l->offset;
    m->flags = flags;
    m->dump = DUMP_NONE;
    m->plen = 0;
    m->path = 0;
    if ((flags & M_FILE) && plen <= 0xffff) {
        /* Consecutive mappings of one file share one copy of the path. */
        const struct cw_map *prev = nmaps > 1 ? m - 1 : NULL;
        if (prev && prev->plen == plen &&
            memcmp(path_pool + prev->path, path, plen) == 0) {
            m->path = prev->path;
            m->plen = prev->plen;
        } else if (pool_used + plen <= sizeof path_pool) {
            memcpy(path_pool + pool_used, path, plen);
            m->path = pool_used;
            m->plen = (uint16_t)plen;
            pool_used += (uint32_t)plen;
        }
    }
}

/* Returns 0 or -errno. */
static int read_maps(void)
{
    nmaps = 0;
    pool_used = 0;
    return _tag_maps_each(add_map, NULL);
}

/* The kernel's vma_dump_size() with filter 0x33, from what maps shows. */
static void choose_dump(void)
{
    unsigned i;

    for (i = 0; i < nmaps; i++) {
        struct cw_map *m = &maps[i];
        const struct cw_map *next = i + 1 < nmaps ? &maps[i + 1] : NULL;

        if (!(m->flags & M_R))
            m->dump = DUMP_NONE;
        else if (m->flags & M_VDSO)
            m->dump = DUMP_ALL;
        else if (m->flags & M_SHARED)
            /* MMF_DUMP_ANON_SHARED: shmem whose file has no link. */
            m->dump = (m->flags & (M_ANON | M_DELETED)) ? DUMP_ALL : DUMP_NONE;
        else if (m->flags & (M_ANON | M_W))
            m->dump = DUMP_ALL;
        else if (!(m->flags & M_X) && next && next->start == m->end &&
                 (next->flags & (M_FILE | M_W | M_SHARED)) == (M_FILE | M_W) &&
                 m->plen && next->plen == m->plen && next->path == m->path)
            m->dump = DUMP_ALL;         /* RELRO: written by ld.so */
        else if (m->offset == 0)
            m->dump = DUMP_HEADER;
        else
            m->dump = DUMP_NONE;
    }
}

static uint64_t filesz(const struct cw_map *m)
{
    uint64_t memsz = m->end - m->start;

    if (m->dump == DUMP_ALL)
        return memsz;
    if (m->dump == DUMP_HEADER)
        return memsz < CW_PAGE ? memsz : CW_PAGE;
    return 0;
}

/* ---------------------------------------------------------- process --- */
struct cw_proc {
    int pid, ppid, pgrp, sid;
    char state;
};

static char *utoa(char *p, unsigned v)
{
    char tmp[12];
    int n = 0;

    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* The parent's ppid and state from /proc/PID/stat (fields after the last
 * ')', because comm may contain spaces and parentheses).  pgrp and sid are
 * inherited by fork, so ours are the parent's. */
static void read_proc(int pid, struct cw_proc *pr)
{
    char path[32], *p = path;
    ssize_t n;

    pr->pid = pid;
    pr->ppid = 0;
    pr->pgrp = getpgrp();
    pr->sid = getsid(0);
    pr->state = 'R';
    memcpy(p, "/proc/", 6);
    p = utoa(p + 6, (unsigned)pid);
    memcpy(p, "/stat", 6);
    n = read_small(path, small, sizeof small - 1);
    if (n > 0) {
        const char *s = small, *end = small + n, *q = NULL;
        int v = 0;

        for (; s < end; s++)
            if (*s == ')')
                q = s;
        if (q && q + 4 < end) {
            pr->state = q[2];
            for (s = q + 4; s < end && *s >= '0' && *s <= '9'; s++)
                v = v * 10 + (*s - '0');
            pr->ppid = v;
        }
    }
}

static void fill_psinfo(struct elf_prpsinfo *ps, const struct cw_proc *pr)
{
    static const char states[] = "RSDTZW";
    ssize_t n;
    int i;

    memset(ps, 0, sizeof *ps);
    for (i = 0; i < 6 && states[i] != pr->state; i++)
        ;
    ps->pr_state = (char)i;
    ps->pr_sname = i < 6 ? states[i] : '.';
    ps->pr_zomb = ps->pr_sname == 'Z';
    ps->pr_uid = getuid();
    ps->pr_gid = getgid();
    ps->pr_pid = pr->pid;
    ps->pr_ppid = pr->ppid;
    ps->pr_pgrp = pr->pgrp;
    ps->pr_sid = pr->sid;

    /* comm is inherited by the fork child, so ours is the parent's. */
    n = read_small("/proc/self/comm", small, sizeof ps->pr_fname);
    for (i = 0; i < n && i < (int)sizeof ps->pr_fname - 1; i++) {
        if (small[i] == '\n')
            break;
        ps->pr_fname[i] = small[i];
    }
    /* As the kernel's fill_psinfo(): at most ELF_PRARGSZ - 1 bytes, every
     * NUL (the last one too) becomes a space, NUL-terminated by the memset. */
    n = read_small("/proc/self/cmdline", small, sizeof ps->pr_psargs - 1);
    for (i = 0; i < n; i++)
        ps->pr_psargs[i] = small[i] ? small[i] : ' ';
}

#ifdef __x86_64__
/* The calling thread's registers in user_regs_struct order, describing the
 * frame this is inlined into (rip is a label in it, rsp/rbp are its own), so
 * gdb unwinds from that function through its callers with their CFI.  Must
 * be inlined into a function that stays live while the core is written. */
static inline __attribute__((always_inline)) void capture_here(uint64_t *r)
{
    uint64_t v;

    __asm__ volatile(
        "movq %%r15,   0(%0)\n\t"
        "movq %%r14,   8(%0)\n\t"
        "movq %%r13,  16(%0)\n\t"
        "movq %%r12,  24(%0)\n\t"
        "movq %%rbp,  32(%0)\n\t"
        "movq %%rbx,  40(%0)\n\t"
        "movq %%r11,  48(%0)\n\t"
        "movq %%r10,  56(%0)\n\t"
        "movq %%r9,   64(%0)\n\t"
        "movq %%r8,   72(%0)\n\t"
        "movq %%rax,  80(%0)\n\t"
        "movq %%rcx,  88(%0)\n\t"
        "movq %%rdx,  96(%0)\n\t"
        "movq %%rsi, 104(%0)\n\t"
        "movq %%rdi, 112(%0)\n\t"
        "movq %%rsp, 152(%0)\n\t"
        "1:\n\t"
        "leaq 1b(%%rip), %%rax\n\t"
        "movq %%rax, 128(%0)\n\t"
        /* pushfq below the red zone, which a compiler may be using. */
        "subq $128, %%rsp\n\t"
        "pushfq\n\t"
        "popq %%rax\n\t"
        "addq $128, %%rsp\n\t"
        "movq %%rax, 144(%0)\n\t"
        "movq %%cs, %%rax\n\t"
        "movq %%rax, 136(%0)\n\t"
        "movq %%ss, %%rax\n\t"
        "movq %%rax, 160(%0)\n\t"
        "movq %%ds, %%rax\n\t"
        "movq %%rax, 184(%0)\n\t"
        "movq %%es, %%rax\n\t"
        "movq %%rax, 192(%0)\n\t"
        "movq %%fs, %%rax\n\t"
        "movq %%rax, 200(%0)\n\t"
        "movq %%gs, %%rax\n\t"
        "movq %%rax, 208(%0)\n\t"
        : : "r"(r) : "rax", "memory", "cc");
    r[R_ORIG_RAX] = (uint64_t)-1;   /* not in a system call */
    v = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_FS, &v) == 0)
        r[R_FS_BASE] = v;
    v = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_GS, &v) == 0)
        r[R_GS_BASE] = v;
}
#elif defined(__aarch64__)
/* The calling thread's registers in the thread record's order
 * (base/arch_aarch64.h: x0-x7, x19-x30, sp, pc, pstate, x8-x11),
 * describing the frame this is inlined into (pc is a label in it, sp and
 * x29 are its own), so gdb unwinds from that function through its callers
 * with their CFI.  Must be inlined into a function that stays live while
 * the core is written. */
static inline __attribute__((always_inline)) void capture_here(uint64_t *r)
{
    __asm__ volatile(
        "stp x0, x1, [%0, #0]\n\t"
        "stp x2, x3, [%0, #16]\n\t"
        "stp x4, x5, [%0, #32]\n\t"
        "stp x6, x7, [%0, #48]\n\t"
        "stp x19, x20, [%0, #64]\n\t"
        "stp x21, x22, [%0, #80]\n\t"
        "stp x23, x24, [%0, #96]\n\t"
        "stp x25, x26, [%0, #112]\n\t"
        "stp x27, x28, [%0, #128]\n\t"
        "stp x29, x30, [%0, #144]\n\t"
        "mov x9, sp\n\t"
        "str x9, [%0, #160]\n\t"
        "1:\n\t"
        "adr x9, 1b\n\t"
        "str x9, [%0, #168]\n\t"
        "mrs x9, nzcv\n\t"
        "str x9, [%0, #176]\n\t"
        "str x8, [%0, #184]\n\t"
        "stp xzr, xzr, [%0, #192]\n\t"
        "str xzr, [%0, #208]\n\t"
        : : "r"(r) : "x9", "memory");
}

/* The calling thread's FP registers, as they are here, in NT_FPREGSET's
 * layout (struct user_fpsimd_state: v0-v31, fpsr, fpcr, 8 reserved). */
static inline __attribute__((always_inline)) void capture_fpregs_here(uint8_t *o)
{
    __asm__ volatile(
        "stp q0, q1, [%0, #0]\n\t"     "stp q2, q3, [%0, #32]\n\t"
        "stp q4, q5, [%0, #64]\n\t"    "stp q6, q7, [%0, #96]\n\t"
        "stp q8, q9, [%0, #128]\n\t"   "stp q10, q11, [%0, #160]\n\t"
        "stp q12, q13, [%0, #192]\n\t" "stp q14, q15, [%0, #224]\n\t"
        "stp q16, q17, [%0, #256]\n\t" "stp q18, q19, [%0, #288]\n\t"
        "stp q20, q21, [%0, #320]\n\t" "stp q22, q23, [%0, #352]\n\t"
        "stp q24, q25, [%0, #384]\n\t" "stp q26, q27, [%0, #416]\n\t"
        "stp q28, q29, [%0, #448]\n\t" "stp q30, q31, [%0, #480]\n\t"
        "mrs x9, fpsr\n\t"
        "str w9, [%0, #512]\n\t"
        "mrs x9, fpcr\n\t"
        "str w9, [%0, #516]\n\t"
        "str xzr, [%0, #520]\n\t"
        : : "r"(o) : "x9", "memory");
}
#endif

#if TAG_ARCH_FPREGS_BYTES
/* A thread's FP registers saved with its record's registers: in its state
 * (stacks/thread.h), which starts at the record's shadow address and is
 * mapped while the record holds registers (the thread saved them, and is
 * held still until the fork, or crashed).  NULL where none were saved. */
static const uint8_t *fpregs_of(const struct libtag_thread *r)
{
    const struct tag_thread_state *t = (const struct tag_thread_state *)(uintptr_t)r->shadow;
    if (!t || (r->flags & TAG_THREAD_EXITED) || !t->fpregs_saved)
        return NULL;
    return t->fpregs;
}
#endif

/* fpvalid: an NT_FPREGSET note of the thread follows (as the kernel says). */
static void fill_prstatus(struct elf_prstatus *st, int tid,
                          const struct cw_proc *pr, const uint64_t *regs, int fpvalid)
{
    memset(st, 0, sizeof *st);
    st->pr_fpvalid = fpvalid;
    st->pr_pid = tid;
    st->pr_ppid = pr->ppid;
    st->pr_pgrp = pr->pgrp;
    st->pr_sid = pr->sid;
    tag_arch_prstatus((uint64_t *)&st->pr_reg, regs);
}

/* ------------------------------------------------------------ notes --- */
#define NOTE_HDR 20u    /* Elf64_Nhdr (12) + "CORE\0" padded to 8 */

static uint64_t align4(uint64_t v) { return (v + 3) & ~(uint64_t)3; }

static uint64_t note_size(uint64_t descsz)
{
    return NOTE_HDR + align4(descsz);
}

static int note_begin(uint32_t type, uint64_t descsz)
{
    struct { Elf64_Nhdr h; char name[8]; } n;

    memset(&n, 0, sizeof n);
    n.h.n_namesz = 5;
    n.h.n_descsz = (Elf64_Word)descsz;
    n.h.n_type = type;
    memcpy(n.name, "CORE", 5);
    _Static_assert(sizeof n == NOTE_HDR, "note header");
    return out_put(&n, sizeof n);
}

static int note_end(uint64_t descsz)
{
    return out_zeros(align4(descsz) - descsz);
}

static int note(uint32_t type, const void *desc, uint64_t descsz)
{
    int rc = note_begin(type, descsz);

    if (rc == 0)
        rc = out_put(desc, descsz);
    if (rc == 0)
        rc = note_end(descsz);
    return rc;
}

/* NT_FILE as the kernel's fill_files_note(): count, page size, then
 * {start, end, offset in pages} per file mapping, then the paths, each
 * NUL-terminated, in the same order. */
static uint64_t nt_file_count(void)
{
    uint64_t c = 0;
    unsigned i;

    for (i = 0; i < nmaps; i++)
        c += maps[i].plen != 0;
    return c;
}

static uint64_t nt_file_size(void)
{
    uint64_t s = 16;
    unsigned i;

    for (i = 0; i < nmaps; i++)
        if (maps[i].plen)
            s += 24 + maps[i].plen + 1;
    return s;
}

static int nt_file_write(void)
{
    uint64_t sz = nt_file_size();
    uint64_t head[3];
    unsigned i;
    int rc = note_begin(NT_FILE, sz);

    head[0] = nt_file_count();
    head[1] = CW_PAGE;
    if (rc == 0)
        rc = out_put(head, 16);
    for (i = 0; rc == 0 && i < nmaps; i++) {
        if (!maps[i].plen)
            continue;
        head[0] = maps[i].start;
        head[1] = maps[i].end;
        head[2] = maps[i].offset / CW_PAGE;
        rc = out_put(head, 24);
    }
    for (i = 0; rc == 0 && i < nmaps; i++) {
        if (!maps[i].plen)
            continue;
        rc = out_put(path_pool + maps[i].path, maps[i].plen);
        if (rc == 0)
            rc = out_put("", 1);
    }
    if (rc == 0)
        rc = note_end(sz);
    return rc;
}

/* ------------------------------------------------------------- data --- */
/* Anonymous private memory: pages neither present nor swapped were never
 * touched (the kernel's get_dump_page() finds none and leaves a hole), so
 * write holes for them.  Without /proc/self/pagemap, write everything. */
static int dump_anon(int pagemap, uint64_t start, uint64_t end)
{
    uint64_t addr = start;

    while (addr < end) {
        uint64_t npages = (end - addr) / CW_PAGE, i, run;
        ssize_t r;

        if (npages > CW_PAGEMAP_BATCH)
            npages = CW_PAGEMAP_BATCH;
        r = pagemap < 0 ? -1 :
            pread(pagemap, pagemap_buf, npages * 8, (off_t)(addr / CW_PAGE * 8));
        if (r < 8)
            return out_mem(addr, end - addr);
        npages = (uint64_t)r / 8;
        for (i = 0; i < npages; i += run) {
            /* bit 63: present, bit 62: swapped (Documentation/admin-guide/
             * mm/pagemap.rst) */
            int used = (pagemap_buf[i] >> 62) != 0;
            int rc;

            for (run = 1; i + run < npages &&
                          ((pagemap_buf[i + run] >> 62) != 0) == used; run++)
                ;
            rc = used ? out_mem(addr + i * CW_PAGE, run * CW_PAGE)
                      : out_hole(run * CW_PAGE);
            if (rc)
                return rc;
        }
        addr += npages * CW_PAGE;
    }
    return 0;
}

/* --------------------------------------------------------------- main - */
/* Async-signal-safe: no locks, no malloc, no stdio. */
/* The ELF header and the program headers: one PT_NOTE of notes_sz bytes
 * at notes_off, then a PT_LOAD a dumped mapping, their data from data_off
 * on.  *end: where the last one's data ends. */
static int write_headers(uint64_t notes_off, uint64_t notes_sz, uint64_t data_off, uint64_t *end)
{
    Elf64_Ehdr eh;
    Elf64_Phdr ph;
    int rc;

    memset(&eh, 0, sizeof eh);
    memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_ident[EI_OSABI] = ELFOSABI_NONE;
    eh.e_type = ET_CORE;
    eh.e_machine = TAG_ARCH_EM;
    eh.e_version = EV_CURRENT;
    eh.e_phoff = sizeof eh;
    eh.e_ehsize = sizeof eh;
    eh.e_phentsize = sizeof ph;
    eh.e_phnum = (Elf64_Half)(1 + nmaps);
    rc = out_put(&eh, sizeof eh);

    memset(&ph, 0, sizeof ph);
    ph.p_type = PT_NOTE;
    ph.p_offset = notes_off;
    ph.p_filesz = notes_sz;
    ph.p_align = 4;
    if (rc == 0)
        rc = out_put(&ph, sizeof ph);
    uint64_t off = data_off;
    for (unsigned i = 0; rc == 0 && i < nmaps; i++) {
        const struct cw_map *m = &maps[i];

        memset(&ph, 0, sizeof ph);
        ph.p_type = PT_LOAD;
        ph.p_flags = (m->flags & M_R ? PF_R : 0) | (m->flags & M_W ? PF_W : 0)
                   | (m->flags & M_X ? PF_X : 0);
        ph.p_offset = off;
        ph.p_vaddr = m->start;
        ph.p_filesz = filesz(m);
        ph.p_memsz = m->end - m->start;
        ph.p_align = CW_PAGE;
        off += ph.p_filesz;
        rc = out_put(&ph, sizeof ph);
    }
    *end = off;
    return rc;
}

/* The process-wide notes after the first prstatus: psinfo, auxv, file. */
static int write_process_notes(const struct elf_prpsinfo *ps)
{
    int rc = note(NT_PRPSINFO, ps, sizeof *ps);
    if (rc == 0)
        rc = note(NT_AUXV, auxv, auxv_len);
    if (rc == 0)
        rc = nt_file_write();
    return rc;
}

/* The notes, in the kernel's order: the first thread's prstatus, psinfo,
 * auxv, file, its fpregset; then each other thread's prstatus and
 * fpregset.  With no valid record, one prstatus of the calling thread's
 * registers (self_regs, self_fp) and pid.  A thread's fpregset: where the
 * machine's cores carry one and its registers were saved (fpregs_of). */
static int write_notes(const struct libtag_thread *threads, unsigned nthreads, unsigned nvalid,
                       const struct cw_proc *pr, const uint64_t *self_regs, const uint8_t *self_fp,
                       uint64_t notes_off)
{
    static struct elf_prstatus st;
    static struct elf_prpsinfo ps;
    int rc = 0;

    fill_psinfo(&ps, pr);
    if (nvalid == 0) {
        fill_prstatus(&st, getpid(), pr, self_regs, self_fp != NULL);
        rc = note(NT_PRSTATUS, &st, sizeof st);
        if (rc == 0)
            rc = write_process_notes(&ps);
        if (rc == 0 && self_fp)
            rc = note(NT_FPREGSET, self_fp, TAG_ARCH_FPREGS_BYTES);
        return rc;
    }
    for (unsigned i = 0; rc == 0 && i < nthreads; i++) {
        if (!(threads[i].flags & TAG_THREAD_REGS))
            continue;
#if TAG_ARCH_FPREGS_BYTES
        const uint8_t *fp = fpregs_of(&threads[i]);
#else
        const uint8_t *fp = NULL;
#endif
        fill_prstatus(&st, (int)threads[i].tid, pr, threads[i].regs, fp != NULL);
        rc = note(NT_PRSTATUS, &st, sizeof st);
        if (rc == 0 && W.off == notes_off + note_size(sizeof st))
            rc = write_process_notes(&ps);
        if (rc == 0 && fp)
            rc = note(NT_FPREGSET, fp, TAG_ARCH_FPREGS_BYTES);
    }
    return rc;
}

/* The segments' data, in program header order, from the file offset the
 * headers gave the first; end: where the last one's ends. */
static int write_segments(int fd, uint64_t end)
{
    int rc = 0;
    int pagemap = _tag_proc_open("/proc/self/pagemap");
    for (unsigned i = 0; rc == 0 && i < nmaps; i++) {
        const struct cw_map *m = &maps[i];
        uint64_t sz = filesz(m);

        if (!sz)
            continue;
        if ((m->flags & (M_ANON | M_SHARED)) == M_ANON)
            rc = dump_anon(pagemap, m->start, m->start + sz);
        else
            rc = out_mem(m->start, sz);
    }
    if (pagemap >= 0)
        close(pagemap);
    if (rc == 0 && W.off != end)
        rc = -EIO;
    /* A trailing hole has no size yet: write its last byte. */
    if (rc == 0 && W.tail_hole) {
        if (lseek(fd, -1, SEEK_CUR) < 0)
            rc = err_or(EIO);
        else {
            size_t done;
            rc = raw_write(zero_page, 1, &done);
        }
    }
    return rc;
}

int _tag_write_core(int fd, int pid, const struct libtag_thread *threads,
                    unsigned nthreads)
{
    static uint64_t self_regs[TAG_NREGS];
#if TAG_ARCH_FPREGS_BYTES
    static uint8_t self_fp[TAG_ARCH_FPREGS_BYTES] __attribute__((aligned(16)));
#else
    static const uint8_t *const self_fp = NULL;
#endif
    struct cw_proc pr;
    struct stat sb;
    uint64_t notes_off, notes_sz, data_off, end;
    unsigned i, nvalid = 0;
    int rc;
    ssize_t n;

    /* Registers first, in this frame, which stays live while we write. */
    capture_here(self_regs);
#if TAG_ARCH_FPREGS_BYTES
    capture_fpregs_here(self_fp);
#endif

    memset(&W, 0, sizeof W);
    W.fd = fd;
    W.sparse = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);

    rc = read_maps();
    if (rc)
        return rc;
    choose_dump();
    n = read_small("/proc/self/auxv", auxv, sizeof auxv);
    auxv_len = n > 0 ? (size_t)n : 0;
    read_proc(pid, &pr);

    unsigned nfp = 0;
    for (i = 0; i < nthreads; i++) {
        nvalid += (threads[i].flags & TAG_THREAD_REGS) != 0;
#if TAG_ARCH_FPREGS_BYTES
        nfp += (threads[i].flags & TAG_THREAD_REGS) && fpregs_of(&threads[i]);
#endif
    }
    if (nvalid == 0)
        nfp = TAG_ARCH_FPREGS_BYTES != 0;  /* self_fp, where the machine has one */

    /* Layout: headers, notes, then page-aligned segment data. */
    notes_off = sizeof(Elf64_Ehdr) + (uint64_t)(1 + nmaps) * sizeof(Elf64_Phdr);
    notes_sz = (nvalid ? nvalid : 1) * note_size(sizeof(struct elf_prstatus))
             + note_size(sizeof(struct elf_prpsinfo))
             + note_size(auxv_len)
             + note_size(nt_file_size())
             + nfp * note_size(TAG_ARCH_FPREGS_BYTES);
    data_off = (notes_off + notes_sz + CW_PAGE - 1) & ~(uint64_t)(CW_PAGE - 1);

    rc = write_headers(notes_off, notes_sz, data_off, &end);
    if (rc == 0)
        rc = write_notes(threads, nthreads, nvalid, &pr, self_regs, self_fp, notes_off);
    if (rc == 0 && W.off != notes_off + notes_sz)
        return -EIO;    /* a layout bug: never write an inconsistent core */
    if (rc == 0)
        rc = out_zeros(data_off - W.off);
    if (rc == 0)
        rc = out_flush();
    if (rc)
        return rc;
    return write_segments(fd, end);
}
