/* scrub.h - for victims whose blocks must be reached only through the
 * pointers they mean to keep: a conservative scan (forensics' leak scan and
 * retention paths, memcheck) counts any copy of a pointer left in a dead
 * stack frame or a register as a reference. */
#ifndef VICTIM_SCRUB_H
#define VICTIM_SCRUB_H
#include <string.h>

/* Clear the dead stack below the caller's frame: the functions it called
 * (printf, malloc, libtag) left copies of pointers there. */
__attribute__((noinline, unused)) static void scrub(void)
{
    volatile char buf[64 * 1024];
    memset((char *)buf, 0, sizeof buf);
    __asm__ volatile("" : : "r"(buf) : "memory");
}

/* Zero every caller-saved register (the signal frame of a snapshot saves
 * them all on the stack). */
__attribute__((noinline, unused)) static void scrub_registers(void)
{
    __asm__ volatile(
        "xor %%eax, %%eax\n\txor %%ecx, %%ecx\n\txor %%edx, %%edx\n\t"
        "xor %%esi, %%esi\n\txor %%edi, %%edi\n\txor %%r8d, %%r8d\n\t"
        "xor %%r9d, %%r9d\n\txor %%r10d, %%r10d\n\txor %%r11d, %%r11d\n\t"
        "pxor %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1\n\tpxor %%xmm2, %%xmm2\n\t"
        "pxor %%xmm3, %%xmm3\n\tpxor %%xmm4, %%xmm4\n\tpxor %%xmm5, %%xmm5\n\t"
        "pxor %%xmm6, %%xmm6\n\tpxor %%xmm7, %%xmm7\n\t"
        ::: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11",
            "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "memory");
}

#endif
