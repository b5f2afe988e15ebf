/* heap_publish.c - spans of libtag's heap reused over old bytes, for a
 * debugger to watch the moment each becomes visible to a reader.
 *
 * A large block of 150 KiB (a span of 3 slices) is filled with 0xce and
 * freed; with LIBTAG_QUARANTINE=0 its span goes straight back to the
 * heap's free slices, its bytes still there (too short to be given back to
 * the kernel).  spans_ready(big) is where the debugger looks.  Then:
 *
 * - 8 blocks of 1500 bytes, a class nothing used before: its first span is
 *   the free span's first slice, and its slots past the first lie over the
 *   old 0xce bytes;
 * - one block of 100 KiB: a large span of the 2 slices left, its slot at
 *   the second slice's start, over 0xce bytes too;
 * - one block of 3000 bytes aligned to 4096: its tag 4080 bytes into its
 *   slot, a forward record at the slot's start.
 *
 * Prints "big=0x..." and "done", and exits 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) void spans_ready(void *big)
{
    __asm__ volatile("" : : "r"(big) : "memory");
}

int main(void)
{
    size_t n = 150 * 1024;
    char *big = malloc(n);
    if (!big)
        return 1;
    memset(big, 0xce, n);
    printf("big=%p\n", (void *)big);
    fflush(stdout);
    free(big);
    spans_ready(big);

    void *small[8];
    for (int i = 0; i < 8; i++) {
        small[i] = malloc(1500);
        if (!small[i])
            return 1;
        memset(small[i], 0x11, 1500);
    }
    char *large = malloc(100 * 1024);
    if (!large)
        return 1;
    memset(large, 0x22, 100 * 1024);
    char *aligned = aligned_alloc(4096, 3000);
    if (!aligned)
        return 1;
    memset(aligned, 0x33, 3000);
    printf("small=%p large=%p aligned=%p\n", small[0], (void *)large, (void *)aligned);
    free(aligned);
    for (int i = 0; i < 8; i++)
        free(small[i]);
    free(large);
    printf("done\n");
    return 0;
}
