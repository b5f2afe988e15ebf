/* stackcount.c - allocbench's exact allocation pattern, then libtag's counters.
 *
 * allocbench.c is included unchanged (its main renamed), so the stacks seen
 * are the benchmark's own.  Run under LD_PRELOAD=libtag.so: libtag_stats and
 * libtag_control are looked up with dlsym, so the binary is loaded exactly as
 * allocbench is in the benchmark.  Prints the stack table's node count and,
 * from /proc/self/smaps, what the table's mapping costs in resident memory.
 *
 *   usage: stackcount THREADS ITERS
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#define main allocbench_main
#include "allocbench.c"
#undef main

#include "../libtag/include/libtag.h"
#include "../libtag/include/tag_abi.h"

/* Rss and Size (KiB) of the mapping that holds addr. */
static void mapping_of(uint64_t addr, long *size_kib, long *rss_kib)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0;
    *size_kib = *rss_kib = -1;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = addr >= lo && addr < hi;
        else if (in && strncmp(line, "Size:", 5) == 0)
            *size_kib = atol(line + 5);
        else if (in && strncmp(line, "Rss:", 4) == 0)
            *rss_kib = atol(line + 4);
    }
    if (f)
        fclose(f);
}

int main(int argc, char **argv)
{
    void (*stats)(struct libtag_stats *) = (void (*)(struct libtag_stats *))dlsym(RTLD_DEFAULT, "libtag_stats");
    const void *(*control)(void) = (const void *(*)(void))dlsym(RTLD_DEFAULT, "libtag_control");
    if (!stats || !control) {
        fprintf(stderr, "stackcount: run me under LD_PRELOAD=libtag.so\n");
        return 2;
    }
    allocbench_main(argc, argv);
    struct libtag_stats s;
    stats(&s);
    const struct libtag_control *c = control();
    long size_kib, rss_kib;
    mapping_of(c->stack_nodes, &size_kib, &rss_kib);
    printf("stack_count %u stack_capacity %u stack_full %llu allocs %llu threads %u "
           "shadow_overflows %llu table_map_kib %ld table_rss_kib %ld\n",
           s.stack_count, c->stack_capacity, (unsigned long long)s.stack_full,
           (unsigned long long)s.allocs, s.thread_count,
           (unsigned long long)s.shadow_overflows, size_kib, rss_kib);
    return 0;
}
