/* arch_aarch64.h - aarch64 Linux (base/arch.h says what a machine header
 * holds). */
#ifndef LIBTAG_ARCH_AARCH64_H
#define LIBTAG_ARCH_AARCH64_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#define TAG_ARCH_NAME "aarch64"
#define TAG_ARCH_EM 183 /* EM_AARCH64 */

/* aarch64 kernels run with 4, 16 or 64 KiB pages: the system's, taken at
 * start (_tag_page_init, base/prim.c, from sysconf), before anything maps
 * or rounds; TAG_PAGE_MAX sizes what must be whole pages statically. */
extern unsigned _tag_page_size;
#define TAG_PAGE_SIZE _tag_page_size
#define TAG_PAGE_MAX  65536u

/* ------------------------------------------------------------ registers */
TAG_INLINE uint64_t tag_uc_pc(const ucontext_t *uc) { return uc->uc_mcontext.pc; }
TAG_INLINE uint64_t tag_uc_sp(const ucontext_t *uc) { return uc->uc_mcontext.sp; }
TAG_INLINE uint64_t tag_uc_fp(const ucontext_t *uc) { return uc->uc_mcontext.regs[29]; }
TAG_INLINE uint64_t tag_uc_lr(const ucontext_t *uc) { return uc->uc_mcontext.regs[30]; }
TAG_INLINE void tag_uc_set_pc(ucontext_t *uc, uint64_t pc) { uc->uc_mcontext.pc = pc; }

/* The record of a signal context's __reserved area (struct _aarch64_ctx:
 * magic, size, then its data) with this magic and at least size bytes;
 * NULL where it has none. */
__attribute__((unused)) static const uint8_t *tag_uc_record(const ucontext_t *uc, uint32_t want, uint32_t least)
{
    const uint8_t *p = (const uint8_t *)uc->uc_mcontext.__reserved;
    const uint8_t *end = p + sizeof uc->uc_mcontext.__reserved;
    while (p + 8 <= end) {
        uint32_t magic, size;
        memcpy(&magic, p, 4);
        memcpy(&size, p + 4, 4);
        if (magic == 0 || size < 8 || size > (size_t)(end - p))
            break;
        if (magic == want && size >= least)
            return p;
        p += size;
    }
    return NULL;
}

/* Was the fault a write?  The kernel's ESR record in __reserved says (a
 * data abort's WnR, bit 6); without one (qemu-user before 8.1 writes none)
 * the faulting instruction does: in the load/store class (op0 x1x0) bit 22
 * is L, 1 for a load, for the forms a program's access takes (LDR/STR of
 * every size, pairs, SIMD registers, exclusives). */
#define TAG_ESR_MAGIC 0x45535201u
__attribute__((unused)) static int tag_uc_is_write(const ucontext_t *uc)
{
    const uint8_t *esr_rec = tag_uc_record(uc, TAG_ESR_MAGIC, 16);
    if (esr_rec) {
        uint64_t esr;
        memcpy(&esr, esr_rec + 8, 8);
        return (esr >> 6) & 1;
    }
    uint32_t insn;
    memcpy(&insn, (const void *)(uintptr_t)uc->uc_mcontext.pc, 4);
    if ((insn & 0x0a000000u) != 0x08000000u)
        return 0;  /* not a load or store: read */
    return !((insn >> 22) & 1);
}

/* The record's registers (tag_abi.h's TAG_NREGS, 27 words, x86_64's
 * user_regs_struct size): x0-x7, x19-x30, sp, pc, pstate, x8-x11.  x12-x18
 * (temporaries, intra-call scratch, the platform register) are not kept:
 * the calling convention gives them no value across a call, and the frames
 * a core's stack shows need only sp, pc, x29 and x30. */
__attribute__((unused)) static void tag_arch_save_regs(uint64_t *o, const ucontext_t *uc)
{
    const uint64_t *x = (const uint64_t *)uc->uc_mcontext.regs;
    for (int i = 0; i < 8; i++)
        o[i] = x[i];
    for (int i = 19; i <= 30; i++)
        o[8 + i - 19] = x[i];
    o[20] = uc->uc_mcontext.sp;
    o[21] = uc->uc_mcontext.pc;
    o[22] = uc->uc_mcontext.pstate;
    for (int i = 8; i < 12; i++)
        o[23 + i - 8] = x[i];
}

/* NT_PRSTATUS's pr_reg: struct user_pt_regs, x0-x30, sp, pc, pstate. */
#define TAG_ARCH_PRSTATUS_NREGS 34
TAG_INLINE void tag_arch_prstatus(uint64_t *pr, const uint64_t *o)
{
    memset(pr, 0, 34 * 8);
    for (int i = 0; i < 8; i++)
        pr[i] = o[i];
    for (int i = 19; i <= 30; i++)
        pr[i] = o[8 + i - 19];
    pr[31] = o[20];
    pr[32] = o[21];
    pr[33] = o[22];
    for (int i = 8; i < 12; i++)
        pr[i] = o[23 + i - 8];
}

/* NT_FPREGSET (the kernel's NT_PRFPREG) of a core: struct
 * user_fpsimd_state - v0-v31, fpsr, fpcr and 8 reserved bytes. */
#define TAG_ARCH_FPREGS_BYTES 528
#define TAG_FPSIMD_MAGIC 0x46508001u
/* A signal context's FP registers in that layout, from its FPSIMD record
 * (struct fpsimd_context: magic, size, fpsr, fpcr, v0-v31), which the
 * kernel and qemu-user write in every signal frame and glibc's getcontext
 * with v8-v15 (the rest as they were in uc).  0 where there is none. */
__attribute__((unused)) static int tag_arch_save_fpregs(uint8_t *o, const ucontext_t *uc)
{
    const uint8_t *r = tag_uc_record(uc, TAG_FPSIMD_MAGIC, 16 + 32 * 16);
    if (!r)
        return 0;
    memcpy(o, r + 16, 32 * 16);  /* v0-v31 */
    memcpy(o + 512, r + 8, 8);   /* fpsr, fpcr */
    memset(o + 520, 0, 8);
    return 1;
}
/* --------------------------------------------------------------- frames */
/* The caller's frame record in a function without one of its own. */
#define TAG_ARCH_FRAME_REG(v) __asm__("mov %0, x29" : "=r"(v))
/* The return address of a function without a frame of its own (the
 * trace hooks), as it is: x30.  gcc's __builtin_return_address(0) strips
 * it with xpaclri, which writes x30, so gcc saves x30 on the stack around
 * it - what the hooks must not do; a bl leaves it unsigned anyway. */
#define TAG_ARCH_HOOK_RA(v) __asm__("mov %0, x30" : "=r"(v))

/* DWARF register numbers */
#define TAG_DW_FP 29  /* x29 */
#define TAG_DW_SP 31  /* sp */
#define TAG_DW_RA 30  /* x30, the link register: the return address column */

/* A return address read from a frame record may be signed (pointer
 * authentication, -mbranch-protection=pac-ret: ARMv8.3).  XPACLRI strips
 * the code in x30 as the CPU itself would check it - with the process's
 * real virtual address size and top-byte-ignore setting, neither of which
 * a mask would know - and is in the hint space: a NOP on a CPU without
 * PAC, where there is nothing to strip.  (XPACI would need ARMv8.3 and
 * faults before it.) */
TAG_INLINE uint64_t tag_arch_strip_pc(uint64_t pc)
{
    register uint64_t x30 __asm__("x30") = pc;
    __asm__("hint #7" : "+r"(x30));  /* xpaclri */
    return x30;
}
/* Not a code address: the first page, unaligned, or above the largest
 * user address space (52 bits); a stripped address has no code bits. */
TAG_INLINE int tag_arch_pc_bad(uint64_t pc) { return pc < 4096 || (pc & 3) || (pc >> 52); }

/* Does the instruction before ra branch and link?  BL, BLR, and the
 * authenticating BLRAA, BLRAB, BLRAAZ, BLRABZ.  lo: the start of the code
 * it lies in. */
__attribute__((unused)) static int tag_arch_after_call(uintptr_t ra, uintptr_t lo)
{
    if (ra - lo < 4 || (ra & 3))
        return 0;
    uint32_t i;
    memcpy(&i, (const void *)(ra - 4), 4);
    return (i & 0xfc000000u) == 0x94000000u ||  /* bl */
           (i & 0xfffffc1fu) == 0xd63f0000u ||  /* blr */
           (i & 0xfffffc1fu) == 0xd63f081fu ||  /* blraaz */
           (i & 0xfffffc1fu) == 0xd63f0c1fu ||  /* blrabz */
           (i & 0xfffffc00u) == 0xd73f0800u ||  /* blraa */
           (i & 0xfffffc00u) == 0xd73f0c00u;    /* blrab */
}

/* The signal trampoline (the vdso's __kernel_rt_sigreturn): mov x8, #139;
 * svc #0.  hi: the end of the code it lies in. */
__attribute__((unused)) static int tag_arch_is_sigreturn(uintptr_t pc, uintptr_t hi)
{
    static const uint32_t code[2] = {0xd2801168u, 0xd4000001u};
    return pc + sizeof code <= hi && memcmp((const void *)pc, code, sizeof code) == 0;
}

/* Through a signal frame.  The walk reaches the trampoline with the frame
 * pointer the handler was entered with, which the kernel (and qemu) point
 * at a frame record above struct rt_sigframe holding the interrupted x29
 * and x30; the sigcontext lies below it, at a distance that depends on the
 * records in __reserved (and differs between the kernel and qemu).  Its
 * x29 and x30 are the frame record's: found by them, within the size of
 * struct rt_sigframe below the record.  The address of its regs[], or 0. */
__attribute__((unused)) static uint64_t tag_arch_sigframe_regs(uint64_t rec, uint64_t lo)
{
    const uint64_t *r = (const uint64_t *)rec;
    uint64_t fp = r[0], lr = r[1];
    uint64_t floor = rec > sizeof(ucontext_t) + 256 ? rec - sizeof(ucontext_t) - 256 : 0;
    if (floor < lo)
        floor = lo;
    for (uint64_t a = rec - 16; a >= floor + 29 * 8; a -= 8) {
        const uint64_t *w = (const uint64_t *)a;
        if (w[0] == fp && w[1] == lr && w[2] > rec)  /* x29, x30, then sp */
            return a - 29 * 8;
    }
    return 0;
}
/* regs[0..30], sp, pc */
#define TAG_ARCH_SIGFRAME_REGS_BYTES (33 * 8)
#define TAG_ARCH_SIGFRAME_PC(g) (((const uint64_t *)(g))[32])
#define TAG_ARCH_SIGFRAME_SP(g) (((const uint64_t *)(g))[31])
#define TAG_ARCH_SIGFRAME_FP(g) (((const uint64_t *)(g))[29])
#define TAG_ARCH_SIGFRAME_LR(g) (((const uint64_t *)(g))[30])

/* ------------------------------------------------------- shadow stack */
/* An instrumented function's shadow entry is keyed by the end of the slot
 * where its prologue saved x30, its return address (stacks/shadow.h): in
 * a frame record (stp x29, x30) x29 + 16, elsewhere where the CFI says -
 * not the CFA, which a bl does not push to.  The slot may hold a signed
 * return address (pac-ret): stripped as the walk strips it.  The return
 * address a frame keyed at key holds: */
TAG_INLINE uint64_t tag_arch_slot_ra(uint64_t key) { return tag_arch_strip_pc(((const uint64_t *)key)[-1]); }
/* Did the exit hook of a function entered from site come by a jump after
 * the function's epilogue (b __cyg_profile_func_exit, after ldp x29, x30
 * and autiasp)?  Then x30, the hook's return address ra, is the function's
 * own: site (gcc strips the site it passes with xpaclri, and autiasp has
 * authenticated x30).  A bl from the function would have left ra inside
 * it.  c (the hook's CFA, the function's own after the jump) says nothing
 * here: no slot below a CFA holds a return address. */
TAG_INLINE int tag_arch_exit_jumped(uint64_t c, uint64_t ra, uint64_t site)
{
    (void)c;
    return ra == site;
}

/* A spin-wait's turn. */
#define tag_arch_pause() __asm__ volatile("yield" ::: "memory")

/* ------------------------------------------------------------- counters */
/* No add to memory in one instruction before ARMv8.1's LSE: an atomic
 * add, whose load-exclusive/store-exclusive pair starts again when a
 * signal handler ran between them (the exception return clears the
 * monitor), so a handler's own update is never lost. */
TAG_INLINE void tag_arch_add_u64(uint64_t *p, uint64_t v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
TAG_INLINE void tag_arch_sub_u64(uint64_t *p, uint64_t v) { __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }

/* ------------------------------------------------------------ the probe */
#define TAG_ARCH_PROBE_LOAD  "    ldr x2, [x0]\n" \
                             "    str x2, [x1]\n" \
                             "    mov w0, #0\n"   \
                             "    ret\n"
#define TAG_ARCH_PROBE_FAIL  "    mov w0, #1\n" \
                             "    ret\n"
#define TAG_ARCH_FUNC_TYPE "%function"

#endif /* LIBTAG_ARCH_AARCH64_H */
