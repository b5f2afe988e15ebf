/* snapshot.h - the snapshot (snapshot.c): the process stopped, forked, and
 * its core written by the child; the crash hook (crash.c) and the payload
 * redaction (redact.c) beside it. */
#ifndef LIBTAG_SNAPSHOT_H
#define LIBTAG_SNAPSHOT_H

#include <signal.h>
#include <stdint.h>
#include "base/base.h"

/* The real-time signal libtag stops threads with for a snapshot (each saves
 * its registers), and which takes forensics' reap requests (snapshot.c). */
#define TAG_REGS_SIGNAL (SIGRTMAX - 1)

/* How long a handed-over snapshot's child waits for its caller to read
 * the pipe its core goes through (see TAG_SNAPSHOT_REQUEST), between two
 * reads, before it gives up and exits. */
#define TAG_HANDOFF_WAIT_MS 30000

TAG_COLD int _tag_snapshot(uint32_t reason);
/* The calling thread's registers at uc into its record (_tag_save_regs)
 * and, where the machine's cores carry them, its FP registers into its
 * state (NT_FPREGSET: corewrite.c).  Async-signal-safe. */
struct ucontext_t;
void _tag_save_thread(const struct ucontext_t *uc);
TAG_COLD void _tag_snapshot_init(void);   /* signal handler; after libc init */
TAG_COLD void _tag_snapshot_signal_taken(int sig); /* the program's now */
/* The exit snapshot (LIBTAG_AT_EXIT=snapshot), from libtag's destructor:
 * returns once its core is written, so it is complete when the process is
 * gone. */
TAG_COLD void _tag_snapshot_at_exit(void);
TAG_COLD void _tag_snapshot_reap(void);   /* collect exited snapshot children */
extern int _tag_snapshot_pending;         /* children not collected yet */
/* The crash hook, with LIBTAG_DIR set: make the crash core land in a new
 * snapshot directory.  Async-signal-safe; 0 or -errno. */
TAG_COLD int _tag_crash_dir(void);
/* In the snapshot child: blank every tagged block's payload (its own copy
 * of memory) so the core keeps only tags and metadata. */
TAG_COLD void _tag_redact_payloads(void);
TAG_COLD void _tag_crash_init(void);
TAG_COLD int _tag_signal_free(int sig);  /* snapshot.c: libtag may take sig */
/* crash.c's sigaction() and signal() by hidden names: life/attach.c
 * rebinds the program's to them */
struct sigaction;
int _tag_sigaction_self(int, const struct sigaction *, struct sigaction *);
void (*_tag_signal_self(int, void (*)(int)))(int);

#endif /* LIBTAG_SNAPSHOT_H */
