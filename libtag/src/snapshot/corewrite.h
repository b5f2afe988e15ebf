/* corewrite.h - the second core path: libtag writes an ELF core of the
 * calling process itself, for machines where the kernel will not write a
 * plain core file (core_pattern pipes to systemd-coredump or apport, or cores
 * are off).  Meant for the snapshot fork child; see corewrite.c for what is
 * dumped and the bounds. */
#ifndef TAG_COREWRITE_H
#define TAG_COREWRITE_H

#include <stddef.h>
#include <stdint.h>

struct libtag_thread;

/* Write an ELF64 core (the machine's: base/arch.h) of the calling process to fd (already open,
 * O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600 - the caller opens it and
 * unlinks the partial file on failure).
 *
 * threads/nthreads: records whose regs are valid (flags & TAG_THREAD_REGS)
 * get one NT_PRSTATUS each, pr_pid = tid, in the order given (gdb takes the
 * first as the current thread), and on aarch64 an NT_FPREGSET each where
 * their FP registers were saved with them.  These are the parent's threads, recorded
 * before the fork; their registers must point into frames that are still
 * live when the child dumps (the child's own calls overwrite dead frames).
 * If no record is valid, one NT_PRSTATUS carries the calling thread's own
 * registers and pr_pid = getpid().
 * pid: the pid put in NT_PRPSINFO (the parent's pid).
 *
 * Returns 0, or -errno on failure (-ENOSPC, -EIO, ...).
 * Async-signal-safe: no locks, no malloc, no stdio; static buffers, so only
 * one call at a time (the fork child is single-threaded). */
int _tag_write_core(int fd, int pid, const struct libtag_thread *threads,
                    unsigned nthreads);

#endif /* TAG_COREWRITE_H */
