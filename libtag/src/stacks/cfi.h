/* cfi.h - unwind rules (cfi.c): how to go from a frame to its caller's,
 * computed from a module's .eh_frame by cfi.c's interpreter and cached per
 * code address by unwind.c. */
#ifndef LIBTAG_CFI_H
#define LIBTAG_CFI_H

#include <stdint.h>
#include "base/base.h"
#include "stacks/modules.h"

/* An unwind rule: how to go from a frame to its caller's, cached per code
 * address in unwind.c.  bits 0..2: TAG_RULE_*; then flags; bits 8..31 the
 * CFA offset; 32..47 where rbp was saved, in 8-byte slots below the CFA;
 * 48..63 a check of the key (unwind.c). */
#define TAG_RULE_TYPE   7ull
#define TAG_RULE_NONE   0ull  /* empty cache slot / nothing known */
#define TAG_RULE_CFA    1ull  /* CFA = rsp or rbp + offset; RA at CFA - 8 */
#define TAG_RULE_FP     2ull  /* no usable CFI: frame pointers, if valid */
#define TAG_RULE_SIGNAL 3ull  /* the signal trampoline: the sigcontext */
#define TAG_RULE_END    4ull  /* outermost frame: return address undefined */
#define TAG_RULE_BAD    5ull  /* not a return address: the walk ends */
#define TAG_RULE_CFA_RBP   (1ull << 3)  /* the CFA is rbp + offset */
#define TAG_RULE_RBP_SAVED (1ull << 4)  /* rbp saved at CFA - 8 * slot */
#define TAG_RULE_RBP_LOST  (1ull << 5)  /* rbp not recoverable */
#define TAG_RULE_OFF_SHIFT   8
#define TAG_RULE_SLOT_SHIFT  32
#define TAG_RULE_CHECK_SHIFT 48
#ifdef __aarch64__
/* aarch64: the CFA offset is bits 8..23, and the return address is in x30
 * (TAG_RULE_RA_LR) or saved at CFA - 8 * slot, the slot in bits 24..31;
 * "rbp" is x29.  Only an exact pc's rule is a TAG_RULE_CFA: past the first
 * frame the walk follows frame records (unwind.c). */
#define TAG_RULE_RA_LR    (1ull << 6)
#define TAG_RULE_OFF_MASK 0xffffull
#define TAG_RULE_RA_SHIFT 24
#define TAG_RULE_RA_MASK  0xffull
#else
#define TAG_RULE_OFF_MASK 0xffffffull
#endif

/* The rule for code address addr (a return address minus 1, or an exact
 * pc) from the module's CFI: TAG_RULE_CFA, _END or _FP.  Async-signal-safe;
 * call inside _tag_modules_enter/_leave. */
uint64_t _tag_cfi_rule(const struct tag_module *m, uintptr_t addr);

#endif /* LIBTAG_CFI_H */
