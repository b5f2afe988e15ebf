/* a64_shadow.c - where the walk of an aarch64 core ends early, libtag's
 * shadow stack goes on (tests/integration/test_aarch64_shadow.py).
 *
 * Built with -finstrument-functions (with and without
 * -mbranch-protection=standard): main -> shadow_a -> shadow_b -> park_nocfi
 * -> snap, which asks libtag for a snapshot (libtag_snapshot).  park_nocfi
 * is assembly with no CFI whose x29 holds the bytes "key" instead of a
 * frame record while it calls snap, so a walk from snap's frame ends
 * there; libtag's shadow stack knows shadow_b, shadow_a and main above it,
 * each keyed by the slot where its prologue saved x30 (signed with PAC).
 * Prints "pid N".
 */
#include <stdio.h>
#include <unistd.h>

extern int libtag_snapshot(void) __attribute__((weak));

__attribute__((noinline)) void snap(void)
{
    if (libtag_snapshot)
        libtag_snapshot();  // LINE snapshot
    __asm__ volatile("" ::: "memory");
}

/* park_nocfi: no CFI, x29 = "key" while it calls snap */
void park_nocfi(void);
__asm__(".text\n"
        ".globl park_nocfi\n"
        ".type park_nocfi, %function\n"
        "park_nocfi:\n"
        "  stp x29, x30, [sp, #-16]!\n"
        "  mov x29, #0x656b\n"
        "  movk x29, #0x79, lsl #16\n"
        "  bl snap\n"
        "  ldp x29, x30, [sp], #16\n"
        "  ret\n"
        ".size park_nocfi, .-park_nocfi\n");

__attribute__((noinline)) void shadow_b(void)
{
    park_nocfi();
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void shadow_a(void)
{
    shadow_b();  // LINE call-b
    __asm__ volatile("" ::: "memory");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("pid %d\n", (int)getpid());
    shadow_a();  // LINE call-a
    return 0;
}
