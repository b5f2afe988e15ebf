/* bigheap.c - a process with a big live heap that snapshots itself.
 *
 *   bigheap [MIB [MEAN_BLOCK [ZERO_MIB]]]
 *                                  default 1024 MiB in blocks of 1024 bytes
 *                                  on average (~1M blocks); ZERO_MIB (default
 *                                  0): also that many MiB of 1 MiB buffers
 *                                  memset to zero - touched pages that hold
 *                                  only zeros, which a core holds as data
 *                                  (bench/compressed_bench.py)
 *
 * Allocates MIB MiB of live blocks of 512..1535 bytes (mean MEAN_BLOCK),
 * from four allocation stacks (make_session / make_buffer / make_row /
 * make_node, chosen by block index), keeps every pointer in one array (a
 * live block too), prints
 *
 *   pid PID
 *   blocks N bytes B
 *   probe 0x...      a block in the middle, for whoowns
 *
 * then raise(SIGUSR2): libtag (preloaded, LIBTAG_DIR set by the caller)
 * takes an on-demand snapshot, and the program exits 0 once the snapshot's
 * child has been forked (the core is written while it exits).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) static void *make_session(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *make_buffer(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *make_row(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *make_node(size_t n) { return malloc(n); }

static void *volatile zero_keep;

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 1024;
    size_t mean = argc > 2 ? strtoull(argv[2], NULL, 10) : 1024;
    size_t total = mib << 20;
    size_t count = total / mean;
    void **all = malloc(count * sizeof *all);
    if (all == NULL) {
        perror("malloc");
        return 1;
    }
    uint64_t s = 88172645463325252ull, bytes = 0;
    for (size_t i = 0; i < count; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        size_t n = mean / 2 + (size_t)(s % mean);  /* mean/2 .. 3*mean/2 - 1 */
        void *p;
        switch (i & 3) {
        case 0: p = make_session(n); break;
        case 1: p = make_buffer(n); break;
        case 2: p = make_row(n); break;
        default: p = make_node(n); break;
        }
        if (p == NULL) {
            perror("malloc");
            return 1;
        }
        memset(p, (int)(i & 0xff), n < 64 ? n : 64);  /* touch: the pages are dumped */
        ((char *)p)[n - 1] = 1;
        all[i] = p;
        bytes += n;
    }
    size_t zero_mib = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
    for (size_t i = 0; i < zero_mib; i++) {
        void *z = malloc(1 << 20);
        if (z == NULL) {
            perror("malloc");
            return 1;
        }
        memset(z, 0, 1 << 20);
        zero_keep = z;  /* escapes: the stores stay; never freed, so live in the core */
    }
    printf("pid %d\nblocks %zu bytes %llu\nprobe %p\n", (int)getpid(), count,
           (unsigned long long)bytes, all[count / 2]);
    fflush(stdout);
    raise(SIGUSR2);
    return 0;
}
