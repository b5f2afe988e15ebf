/* The return-address trampoline shared by tramp.c (the LD_PRELOAD
 * interposer) and firebench.c (the fire-cost microbenchmark).
 *
 * Per-thread state (initial-exec TLS, no malloc): a side stack of the frames
 * outward of the marker, outermost first.  e[n-1] is the marked frame: its
 * return-address slot holds tramp_ret instead of e[n-1].ret.  When that frame
 * returns, the `ret` pops tramp_ret (the return-stack buffer predicted the
 * real caller: one mispredict), and tramp_ret
 *   - checks that the slot it came from (rsp-8) is e[n-1].slot (ud2 if not:
 *     a longjmp/exception skipped the marked frame - unsupported),
 *   - pops e[n-1], counts the fire,
 *   - marks the next frame outward (writes tramp_ret into e[n-2].slot),
 *   - jumps to the real return address (an indirect jmp).
 * It changes no register but the flags: a first version used the
 * caller-saved scratch registers (r8-r11, rcx, rsi, rdi) freely, and
 * firebench hung - gcc's -fipa-ra (on at -O2) lets a caller keep values in
 * caller-saved registers across a call to a function of the same unit that
 * it knows does not touch them, so a return through the trampoline must
 * preserve every register, not only the ABI's callee-saved ones.  It saves
 * r8-r11 in the red zone below the returned frame (the kernel does not
 * deliver signals into the red zone) and jumps through the old slot word.
 */
#ifndef TRAMP_ASM_H
#define TRAMP_ASM_H
#include <stdint.h>

#define TRAMP_MAX 4096

struct tramp_entry {
    uintptr_t *slot;  /* address of the return-address slot */
    uintptr_t ret;    /* the real return address */
    uint64_t pid;     /* id of the stack from the outermost frame to this one */
};

struct tramp_state {
    uint64_t n;       /* entries in e; e[n-1] is marked when n > 0 */
    uint64_t fires;
    struct tramp_entry e[TRAMP_MAX];
};

extern __thread struct tramp_state tramp_tls __attribute__((tls_model("initial-exec")));
extern void tramp_ret(void) __attribute__((visibility("hidden")));

#define TRAMP_DEFINE_ASM                                                   \
__thread struct tramp_state tramp_tls __attribute__((tls_model("initial-exec"))); \
__asm__(                                                                   \
    ".text\n"                                                              \
    ".globl tramp_ret\n"                                                   \
    ".hidden tramp_ret\n"                                                  \
    ".type tramp_ret,@function\n"                                          \
    ".p2align 4\n"                                                         \
    "tramp_ret:\n"                                                         \
    "  endbr64\n"                                                          \
    /* save what it uses in the red zone of the frame that just returned: \
       the -8(%rsp) word is that frame's old slot, below it r8-r11 */     \
    "  movq %r11, -16(%rsp)\n"                                             \
    "  movq %r10, -24(%rsp)\n"                                             \
    "  movq %r9, -32(%rsp)\n"                                              \
    "  movq %r8, -40(%rsp)\n"                                              \
    "  movq tramp_tls@gottpoff(%rip), %r11\n"                              \
    "  addq %fs:0, %r11\n"               /* r11 = &tramp_tls */            \
    "  movq (%r11), %r10\n"              /* n */                           \
    "  subq $1, %r10\n"                                                    \
    "  movq %r10, (%r11)\n"                                                \
    "  addq $1, 8(%r11)\n"               /* fires++ */                     \
    "  leaq (%r10,%r10,2), %r9\n"                                          \
    "  leaq 16(%r11,%r9,8), %r9\n"       /* r9 = &e[n-1] */                \
    "  leaq -8(%rsp), %r8\n"                                               \
    "  cmpq (%r9), %r8\n"                /* came from e[n-1].slot? */      \
    "  jne 2f\n"                                                           \
    "  movq 8(%r9), %r8\n"               /* real return address ... */     \
    "  movq %r8, -8(%rsp)\n"             /* ... back into the old slot */  \
    "  testq %r10, %r10\n"                                                 \
    "  jz 1f\n"                                                            \
    "  movq -24(%r9), %r8\n"             /* e[n-2].slot */                 \
    "  leaq tramp_ret(%rip), %r10\n"                                       \
    "  movq %r10, (%r8)\n"               /* mark the next frame outward */ \
    "1:\n"                                                                 \
    "  movq -16(%rsp), %r11\n"                                             \
    "  movq -24(%rsp), %r10\n"                                             \
    "  movq -32(%rsp), %r9\n"                                              \
    "  movq -40(%rsp), %r8\n"                                              \
    "  jmp *-8(%rsp)\n"                                                    \
    "2:\n"                                                                 \
    "  ud2\n"                                                              \
    ".size tramp_ret, .-tramp_ret\n"                                       \
);

#endif
