/* arch_x86_64.h - x86_64 (base/arch.h says what a machine header holds).
 * The code that was libtag's only machine, moved here as it was. */
#ifndef LIBTAG_ARCH_X86_64_H
#define LIBTAG_ARCH_X86_64_H

#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#define TAG_ARCH_NAME "x86_64"
#define TAG_ARCH_EM 62 /* EM_X86_64 */

/* x86_64 Linux has one base page size: a constant, as the code assumed. */
#define TAG_PAGE_SIZE 4096u
#define TAG_PAGE_MAX  4096u

/* ------------------------------------------------------------ registers */
/* (the REG_* names are glibc's under _GNU_SOURCE, which libtag's sources
 * have: a program that includes libtag's headers without it gets none) */
#ifdef _GNU_SOURCE
TAG_INLINE uint64_t tag_uc_pc(const ucontext_t *uc) { return (uint64_t)uc->uc_mcontext.gregs[REG_RIP]; }
TAG_INLINE uint64_t tag_uc_sp(const ucontext_t *uc) { return (uint64_t)uc->uc_mcontext.gregs[REG_RSP]; }
TAG_INLINE uint64_t tag_uc_fp(const ucontext_t *uc) { return (uint64_t)uc->uc_mcontext.gregs[REG_RBP]; }
/* no link register: a return address is on the stack */
TAG_INLINE uint64_t tag_uc_lr(const ucontext_t *uc) { (void)uc; return 0; }
TAG_INLINE void tag_uc_set_pc(ucontext_t *uc, uint64_t pc) { uc->uc_mcontext.gregs[REG_RIP] = (greg_t)pc; }
/* the page fault's error code: bit 1, a write */
TAG_INLINE int tag_uc_is_write(const ucontext_t *uc) { return (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0; }

/* The record's registers (tag_abi.h's TAG_NREGS): struct user_regs_struct,
 * as in a core's NT_PRSTATUS note. */
__attribute__((unused)) static void tag_arch_save_regs(uint64_t *o, const ucontext_t *uc)
{
    const greg_t *g = uc->uc_mcontext.gregs;
    o[0] = g[REG_R15];  o[1] = g[REG_R14];  o[2] = g[REG_R13];  o[3] = g[REG_R12];
    o[4] = g[REG_RBP];  o[5] = g[REG_RBX];  o[6] = g[REG_R11];  o[7] = g[REG_R10];
    o[8] = g[REG_R9];   o[9] = g[REG_R8];   o[10] = g[REG_RAX]; o[11] = g[REG_RCX];
    o[12] = g[REG_RDX]; o[13] = g[REG_RSI]; o[14] = g[REG_RDI]; o[15] = (uint64_t)-1;
    o[16] = g[REG_RIP]; o[17] = g[REG_CSGSFS] & 0xffff;       o[18] = g[REG_EFL];
    o[19] = g[REG_RSP]; o[20] = 0x2b;
    o[21] = (uint64_t)(uintptr_t)__builtin_thread_pointer();  o[22] = 0;
    o[23] = o[24] = o[25] = o[26] = 0;
}
#endif /* _GNU_SOURCE */

/* NT_PRSTATUS's pr_reg is the record's registers as they are. */
#define TAG_ARCH_PRSTATUS_NREGS 27
TAG_INLINE void tag_arch_prstatus(uint64_t *pr, const uint64_t *rec) { memcpy(pr, rec, 27 * 8); }

/* libtag's x86_64 cores carry no NT_FPREGSET (nor NT_X86_XSTATE). */
#define TAG_ARCH_FPREGS_BYTES 0

/* --------------------------------------------------------------- frames */
/* The caller's frame pointer in a function without a frame of its own. */
#define TAG_ARCH_FRAME_REG(v) __asm__("mov %%rbp, %0" : "=r"(v))
/* The return address of a function without a frame of its own (the
 * trace hooks), as it is: a load of the word at the stack pointer. */
#define TAG_ARCH_HOOK_RA(v) ((v) = (uint64_t)(uintptr_t)__builtin_return_address(0))

/* DWARF register numbers */
#define TAG_DW_FP 6   /* rbp */
#define TAG_DW_SP 7   /* rsp */
#define TAG_DW_RA 16  /* the return address column */

/* No pointer authentication. */
TAG_INLINE uint64_t tag_arch_strip_pc(uint64_t pc) { return pc; }
/* Not a code address: the first page, or not canonical (user space is
 * below 2^47). */
TAG_INLINE int tag_arch_pc_bad(uint64_t pc) { return pc < TAG_PAGE_SIZE || (pc >> 47); }

__attribute__((unused)) static int tag_arch_is_prefix(uint8_t b)
{
    return b == 0x26 || b == 0x2e || b == 0x36 || b == 0x3e || b == 0x64 || b == 0x65 ||
           b == 0x66 || b == 0x67 || b == 0xf2 || b == 0xf3;
}

/* Do the bytes before ra decode as a call that ends at ra?  e8 rel32, or
 * ff /2 (call r/m64) with its ModRM, SIB and displacement, after at most
 * two prefixes and a REX.  Reads only [max(lo, ra - 10), ra): lo is the
 * start of the code it lies in. */
__attribute__((unused)) static int tag_arch_after_call(uintptr_t ra, uintptr_t lo)
{
    uint8_t b[10];
    unsigned have = ra - lo < 10 ? (unsigned)(ra - lo) : 10;
    memset(b, 0, sizeof b);
    memcpy(b + 10 - have, (const void *)(ra - have), have);
    if (have >= 5 && b[5] == 0xe8)
        return 1;
    for (unsigned len = 2; len <= have; len++) {
        unsigned i = 10 - len, np = 0;
        while (np < 2 && i < 10 && tag_arch_is_prefix(b[i])) {
            i++;
            np++;
        }
        if (i < 10 && (b[i] & 0xf0) == 0x40)
            i++;
        if (i + 1 >= 10 || b[i] != 0xff || ((b[i + 1] >> 3) & 7) != 2)
            continue;
        unsigned mod = b[i + 1] >> 6, rm = b[i + 1] & 7, end = i + 2;
        if (mod != 3 && rm == 4) {
            if (end >= 10)
                continue;
            uint8_t sib = b[end++];
            if (mod == 0 && (sib & 7) == 5)
                end += 4;
        } else if (mod == 0 && rm == 5) {
            end += 4;  /* rip-relative */
        }
        if (mod == 1)
            end += 1;
        else if (mod == 2)
            end += 4;
        if (end == 10)
            return 1;
    }
    return 0;
}

/* glibc's x86_64 __restore_rt: mov $0xf,%rax; syscall (what gdb checks).
 * hi: the end of the code it lies in. */
__attribute__((unused)) static int tag_arch_is_sigreturn(uintptr_t pc, uintptr_t hi)
{
    static const uint8_t code[9] = {0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05};
    return pc + sizeof code <= hi && memcmp((const void *)pc, code, sizeof code) == 0;
}

/* Through a signal frame: sp is the handler's CFA, where the kernel put the
 * ucontext (struct rt_sigframe after its return address).  The address of
 * its general registers. */
TAG_INLINE uint64_t tag_arch_sigframe_regs(uint64_t sp) { return sp + offsetof(ucontext_t, uc_mcontext.gregs); }
#define TAG_ARCH_SIGFRAME_REGS_BYTES sizeof(gregset_t)
#define TAG_ARCH_SIGFRAME_PC(g) ((uint64_t)((const greg_t *)(g))[REG_RIP])  /* _GNU_SOURCE */
#define TAG_ARCH_SIGFRAME_SP(g) ((uint64_t)((const greg_t *)(g))[REG_RSP])
#define TAG_ARCH_SIGFRAME_FP(g) ((uint64_t)((const greg_t *)(g))[REG_RBP])

/* ------------------------------------------------------- shadow stack */
/* An instrumented function's shadow entry is keyed by the end of the slot
 * that holds its return address (stacks/shadow.h): here its CFA, the word
 * below it the one the call pushed.  The return address a frame keyed at
 * key holds: */
TAG_INLINE uint64_t tag_arch_slot_ra(uint64_t key) { return ((const uint64_t *)key)[-1]; }
/* Did the exit hook of a function entered from site come by a jump after
 * the function's epilogue?  Then the hook's CFA c is the function's own,
 * the slot below it its return address.  (ra, the hook's return address,
 * says nothing here: the call pushed it where the function's was.) */
TAG_INLINE int tag_arch_exit_jumped(uint64_t c, uint64_t ra, uint64_t site)
{
    (void)ra;
    return ((const uint64_t *)c)[-1] == site;
}

/* A spin-wait's turn. */
#define tag_arch_pause() __builtin_ia32_pause()

/* ------------------------------------------------------------- counters */
/* One add to memory: a signal handler on this thread sees it done or not. */
TAG_INLINE void tag_arch_add_u64(uint64_t *p, uint64_t v)
{
    __asm__ volatile("addq %1, %0" : "+m"(*p) : "er"(v));
}
TAG_INLINE void tag_arch_sub_u64(uint64_t *p, uint64_t v)
{
    __asm__ volatile("subq %1, %0" : "+m"(*p) : "er"(v));
}

/* ------------------------------------------------------------ the probe */
/* int _tag_probe_word(const void *src, uint64_t *dst): the body after the
 * labels _tag_probe_insn (the load) and _tag_probe_fixup (its exit). */
#define TAG_ARCH_PROBE_LOAD  "    movq (%rdi), %rax\n" \
                             "    movq %rax, (%rsi)\n" \
                             "    xorl %eax, %eax\n"   \
                             "    ret\n"
#define TAG_ARCH_PROBE_FAIL  "    movl $1, %eax\n" \
                             "    ret\n"
#define TAG_ARCH_FUNC_TYPE "@function"

#endif /* LIBTAG_ARCH_X86_64_H */
