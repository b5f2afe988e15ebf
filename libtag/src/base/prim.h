/* prim.h - libtag's primitives (prim.c, maps.c): the low-level operations
 * the other parts share.  They call no other part; the parts call them. */
#ifndef LIBTAG_PRIM_H
#define LIBTAG_PRIM_H

#include <stddef.h>
#include <stdint.h>
#include "base/base.h"

struct iovec;
struct libtag_thread;
struct sigaction;
struct ucontext_t;

/* ------------------------------------------------------------ prim.c */
/* Memory of libtag's own (tables, rings), fenced by guard pages; NULL on
 * failure.  No malloc. */
TAG_COLD void *_tag_map(size_t bytes, int noreserve);
TAG_COLD void _tag_unmap(void *addr, size_t bytes);

/* Copy n iovecs of the process's own memory with process_vm_readv, so an
 * unmapped or unreadable address shortens the copy instead of faulting.
 * Returns the iovecs handled; one that faulted gets local iov_len 0.
 * Returns 0 where the kernel refuses the call (a seccomp filter), and then
 * sets _tag_copy_own_refused for good. */
unsigned _tag_copy_own(struct iovec *local, struct iovec *remote, unsigned n);
extern int _tag_copy_own_refused;

/* The probe: a load that may fault, recovered by the crash hook.
 * _tag_probe_word copies 8 bytes from src: 0, or 1 when the load faulted
 * (then dst is left alone); the caller sets its thread state's probing
 * around it.  _tag_probe_armed: libtag's handler is installed for SIGSEGV
 * and SIGBUS (crash.c sets it, and clears it where it gives one back).
 * _tag_probe_safe: may this thread probe now (armed, and neither signal
 * blocked)?  _tag_probe_fault: the crash hook's first question, asked in
 * a thread that is probing (its state's probing, which the crash hook
 * reads) - is this a fault of the probe's load?  Then the context resumes
 * at the probe's failure exit and 1 is returned.
 * Async-signal-safe. */
int _tag_probe_word(const void *src, uint64_t *dst);
extern int _tag_probe_armed;
int _tag_probe_safe(void);
int _tag_probe_fault(int sig, void *uc);

/* Save the registers of a signal context into a thread record (the order
 * of struct user_regs_struct).  Async-signal-safe. */
void _tag_save_regs(struct libtag_thread *r, const struct ucontext_t *uc);

/* The system's page size into TAG_PAGE_SIZE, where the machine has more
 * than one (aarch64): _tag_init's first step, and _tag_map's. */
#ifdef __aarch64__
void _tag_page_init(void);
#else
#define _tag_page_init() ((void)0)
#endif
void _tag_die(int sig);   /* default action of sig, now */

/* glibc's sigaction under another name: libtag's own handlers must not go
 * through the sigaction() it interposes for the program (crash.c). */
extern int __sigaction(int, const struct sigaction *, struct sigaction *);

/* ------------------------------------------------------------ maps.c */
/* open(path, O_RDONLY | O_CLOEXEC), again after EINTR: a /proc file. */
int _tag_proc_open(const char *path);

/* One line of /proc/self/maps. */
struct tag_maps_line {
    uint64_t start, end;   /* [start, end) */
    uint64_t offset;       /* file offset, bytes */
    uint64_t inode;        /* 0 for anonymous memory */
    char perms[4];         /* as shown: "rw-p", "r-xs" ... */
    const char *path;      /* not NUL-terminated; plen 0 = none */
    size_t plen;
};

/* Call fn(line, ctx) for each line of /proc/self/maps, in order: libtag's
 * one maps parser (the core writer and the payload redaction use it).
 * Returns 0 or -errno.  Async-signal-safe, no malloc; one static read
 * buffer, so one caller at a time (the fork child is single-threaded). */
int _tag_maps_each(void (*fn)(const struct tag_maps_line *, void *), void *ctx);

#endif /* LIBTAG_PRIM_H */
