/* lt_aligned_refree.c - free() twice a large aligned block: glibc mmaps its
 * chunk and munmaps it at the first free(), so the second must be reported
 * by libtag, not fault in it.
 *
 *   lt_aligned_refree ALIGN   posix_memalign(ALIGN, 2 MiB), free, free
 *
 * Prints "block=0x... offset=N" (its offset in its page), then "survived". */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    void *p;
    if (posix_memalign(&p, strtoul(argv[1], NULL, 0), 2u << 20) != 0)
        return 1;
    printf("block=%p offset=%lu\n", p, (unsigned long)((unsigned long)p & 4095));
    fflush(stdout);
    free(p);
    free(p);
    puts("survived");
    return 0;
}
