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
 * It touches only rcx, rsi, rdi, r8-r11 (caller-saved and not return
 * registers), so rax, rdx, xmm0, xmm1 and st(0) reach the caller intact.
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
    "  movq 8(%r9), %r8\n"               /* real return address */         \
    "  testq %r10, %r10\n"                                                 \
    "  jz 1f\n"                                                            \
    "  movq -24(%r9), %rdi\n"            /* e[n-2].slot */                 \
    "  leaq tramp_ret(%rip), %rsi\n"                                       \
    "  movq %rsi, (%rdi)\n"              /* mark the next frame outward */ \
    "1:\n"                                                                 \
    "  jmp *%r8\n"                                                         \
    "2:\n"                                                                 \
    "  ud2\n"                                                              \
    ".size tramp_ret, .-tramp_ret\n"                                       \
);

#endif
