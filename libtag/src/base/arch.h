/* arch.h - the machine: everything in libtag that differs between the
 * processors it runs on, one header a machine, picked by the compiler's
 * target.  The rest of libtag names these and nothing machine-specific:
 *
 *   pages          TAG_PAGE_SIZE (the system's, at start, where the machine
 *                  has more than one) and TAG_PAGE_MAX (for static sizes)
 *   registers      a signal context's pc, sp, frame pointer, link register
 *                  and whether a fault was a write (tag_uc_*); the record's
 *                  registers (tag_arch_save_regs) and the core's
 *                  NT_PRSTATUS (tag_arch_prstatus); the FP registers of
 *                  a core's NT_FPREGSET, where it writes one
 *                  (TAG_ARCH_FPREGS_BYTES, tag_arch_save_fpregs)
 *   frames         the frame pointer a frameless function sees
 *                  (TAG_ARCH_FRAME_REG) and its return address
 *                  (TAG_ARCH_HOOK_RA), the DWARF numbers of its CFI
 *                  (TAG_DW_*), what a return address follows (a call:
 *                  tag_arch_after_call) and the signal trampoline
 *                  (tag_arch_is_sigreturn), a code address's valid form
 *                  (tag_arch_pc_bad) and pointer authentication
 *                  (tag_arch_strip_pc)
 *   shadow stack   the return address an instrumented frame's slot holds
 *                  (tag_arch_slot_ra) and whether an exit hook came by a
 *                  jump after the epilogue (tag_arch_exit_jumped)
 *   counters       tag_arch_add_u64/sub_u64: one uninterruptible update
 *                  of a word only its thread writes
 *   the probe      TAG_ARCH_PROBE_ASM: one load that may fault, and its exit
 *   the core       TAG_ARCH_EM, the calling thread's registers
 *                  (TAG_ARCH_CAPTURE_HERE)
 *
 * Functions that are not inline are static and marked unused: each file
 * compiles the ones it calls, as before they moved here. */
#ifndef LIBTAG_ARCH_H
#define LIBTAG_ARCH_H

#if defined(__x86_64__)
#include "base/arch_x86_64.h"
#elif defined(__aarch64__)
#include "base/arch_aarch64.h"
#else
#error "libtag runs on x86_64 and aarch64 (base/arch.h)"
#endif

#endif /* LIBTAG_ARCH_H */
