/* test_cfi.c - the CFI interpreter alone (src/stacks/cfi.h, CMake's
 * libtag_cfi): the unwind rule cfi.c computes at given code addresses of
 * functions whose call frame information this file writes itself (.cfi_*
 * directives around hand-written code, so every row is known), read from
 * this program's own .eh_frame_hdr and .eh_frame as the assembler and the
 * linker laid them out.
 *
 * The rules: the CFA from rsp or rbp plus an offset, rbp saved in a slot
 * below the CFA or unchanged, the outermost frame (return address
 * undefined), and TAG_RULE_FP where the CFI says something a rule cannot
 * hold (a CFA expression, a CFA in another register) or says nothing (code
 * outside every FDE, a module without .eh_frame_hdr).  Along the way:
 * advance_loc of each width, remember/restore_state, restore. */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stacks/cfi.h"
#include "stacks/modules.h"

#include "check.h"

/* The functions: never called, only looked up.  Labels mark the rows. */
__asm__(".text\n"
        /* a frame-pointer function: push rbp; mov rsp, rbp; ...; leave; ret */
        ".globl cfi_fp\n.type cfi_fp, @function\n"
        "cfi_fp:\n"
        ".cfi_startproc\n"
        "fp_entry:   push %rbp\n"
        ".cfi_def_cfa_offset 16\n"
        ".cfi_offset %rbp, -16\n"
        "fp_pushed:  mov %rsp, %rbp\n"
        ".cfi_def_cfa_register %rbp\n"
        "fp_body:    sub $32, %rsp\n"
        "            .skip 100, 0x90\n"          /* advance_loc1 */
        "fp_far:     nop\n"
        ".cfi_remember_state\n"
        "            leave\n"
        ".cfi_def_cfa %rsp, 8\n"
        ".cfi_restore %rbp\n"
        "fp_ret:     ret\n"
        ".cfi_restore_state\n"
        "fp_again:   .skip 300, 0x90\n"          /* advance_loc2 next */
        "fp_later:   leave\n"
        "            ret\n"
        ".cfi_endproc\n"
        ".size cfi_fp, .-cfi_fp\n"
        /* without a frame pointer: push rbx; sub; ...; add; pop; ret */
        ".globl cfi_nofp\n.type cfi_nofp, @function\n"
        "cfi_nofp:\n"
        ".cfi_startproc\n"
        "nofp_entry: push %rbx\n"
        ".cfi_def_cfa_offset 16\n"
        ".cfi_offset %rbx, -16\n"
        "nofp_pushed: sub $40, %rsp\n"
        ".cfi_def_cfa_offset 56\n"
        "nofp_body:  .skip 70000, 0x90\n"        /* advance_loc4 next */
        "nofp_far:   add $40, %rsp\n"
        ".cfi_def_cfa_offset 16\n"
        "nofp_added: pop %rbx\n"
        ".cfi_def_cfa_offset 8\n"
        "nofp_ret:   ret\n"
        ".cfi_endproc\n"
        ".size cfi_nofp, .-cfi_nofp\n"
        /* the outermost frame: _start's and clone's say so */
        ".globl cfi_outer\n.type cfi_outer, @function\n"
        "cfi_outer:\n"
        ".cfi_startproc\n"
        ".cfi_undefined %rip\n"
        "outer_body: nop\n"
        "            ret\n"
        ".cfi_endproc\n"
        ".size cfi_outer, .-cfi_outer\n"
        /* a CFA expression (DW_CFA_def_cfa_expression: DW_OP_breg7 8),
         * then a CFA in r10 (a realigned stack) */
        ".globl cfi_odd\n.type cfi_odd, @function\n"
        "cfi_odd:\n"
        ".cfi_startproc\n"
        "odd_entry:  nop\n"
        ".cfi_escape 0x0f, 0x02, 0x77, 0x08\n"
        "odd_expr:   nop\n"
        ".cfi_def_cfa %r10, 0\n"
        "odd_r10:    nop\n"
        ".cfi_def_cfa %rsp, 8\n"
        "odd_back:   ret\n"
        ".cfi_endproc\n"
        ".size cfi_odd, .-cfi_odd\n"
        /* no CFI at all */
        ".globl cfi_none\n.type cfi_none, @function\n"
        "cfi_none:   nop\n"
        "            ret\n"
        ".size cfi_none, .-cfi_none\n");

extern const char fp_entry[], fp_pushed[], fp_body[], fp_far[], fp_ret[], fp_again[], fp_later[];
extern const char nofp_entry[], nofp_pushed[], nofp_body[], nofp_far[], nofp_added[], nofp_ret[];
extern const char outer_body[], odd_entry[], odd_expr[], odd_r10[], odd_back[], cfi_none[];

/* This program's module: the executable segment holding the functions,
 * its .eh_frame_hdr and the PT_LOAD that holds that (modules.c's way). */
static struct tag_module self;

static int find_self(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size, (void)data;
    uintptr_t want = (uintptr_t)fp_entry, hdr = 0;
    int found = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && want >= lo && want < hi) {
            self.lo = lo, self.hi = hi;
            found = 1;
        }
        if (ph->p_type == PT_GNU_EH_FRAME)
            hdr = lo;
    }
    if (!found || !hdr)
        return 0;
    self.eh_hdr = hdr;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type == PT_LOAD && hdr >= lo && hdr < hi)
            self.data_lo = lo, self.data_hi = hi;
    }
    return 1;
}

static uint64_t rule(const char *at)
{
    return _tag_cfi_rule(&self, (uintptr_t)at);
}

/* CFA = rsp + off (rbp unchanged) */
#define RSP(off) (TAG_RULE_CFA | (uint64_t)(off) << TAG_RULE_OFF_SHIFT)
/* ... and rbp saved at CFA - 8 * slot */
#define SAVED(slot) (TAG_RULE_RBP_SAVED | (uint64_t)(slot) << TAG_RULE_SLOT_SHIFT)

int main(void)
{
    CHECK(dl_iterate_phdr(find_self, NULL) == 1);
    CHECK(self.data_lo <= self.eh_hdr && self.eh_hdr < self.data_hi);

    /* the frame-pointer function, row by row */
    CHECK(rule(fp_entry) == RSP(8));
    CHECK(rule(fp_pushed) == (RSP(16) | SAVED(2)));
    CHECK(rule(fp_body) == (RSP(16) | TAG_RULE_CFA_RBP | SAVED(2)));
    CHECK(rule(fp_body + 50) == (RSP(16) | TAG_RULE_CFA_RBP | SAVED(2)));  /* inside a row */
    CHECK(rule(fp_far) == (RSP(16) | TAG_RULE_CFA_RBP | SAVED(2)));
    CHECK(rule(fp_ret) == RSP(8));                            /* after leave; rbp restored */
    CHECK(rule(fp_again) == (RSP(16) | TAG_RULE_CFA_RBP | SAVED(2)));  /* restore_state */
    CHECK(rule(fp_later) == (RSP(16) | TAG_RULE_CFA_RBP | SAVED(2)));
    /* a return address minus 1 inside the body: the body's row */
    CHECK(_tag_cfi_rule(&self, (uintptr_t)fp_far - 1) == (RSP(16) | TAG_RULE_CFA_RBP | SAVED(2)));

    /* no frame pointer: rbp never saved, the CFA moves with rsp */
    CHECK(rule(nofp_entry) == RSP(8));
    CHECK(rule(nofp_pushed) == RSP(16));
    CHECK(rule(nofp_body) == RSP(56));
    CHECK(rule(nofp_body + 65000) == RSP(56));
    CHECK(rule(nofp_far) == RSP(56));    /* the add's own row: before it runs */
    CHECK(rule(nofp_added) == RSP(16));
    CHECK(rule(nofp_ret) == RSP(8));

    /* the outermost frame */
    CHECK(rule(outer_body) == TAG_RULE_END);

    /* what a rule cannot hold: frame pointers, if they look valid */
    CHECK(rule(odd_entry) == RSP(8));
    CHECK(rule(odd_expr) == TAG_RULE_FP);
    CHECK(rule(odd_r10) == TAG_RULE_FP);
    CHECK(rule(odd_back) == RSP(8));

    /* no FDE covers it, or no .eh_frame_hdr at all */
    CHECK(rule(cfi_none) == TAG_RULE_FP);
    struct tag_module bare = self;
    bare.eh_hdr = 0;
    CHECK(_tag_cfi_rule(&bare, (uintptr_t)fp_body) == TAG_RULE_FP);
    /* a table cut short (bounds that end before it): no rule, no fault */
    struct tag_module cut = self;
    cut.data_hi = self.eh_hdr + 8;
    CHECK(_tag_cfi_rule(&cut, (uintptr_t)fp_body) == TAG_RULE_FP);

    printf("test_cfi: %d checks passed\n", checks);
    return 0;
}
