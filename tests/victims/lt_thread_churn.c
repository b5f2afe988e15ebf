/* lt_thread_churn.c - many short-lived threads, one after the other, each
 * freeing a block (so libtag gives it a quarantine).  What libtag keeps per
 * exited thread must not grow the address space: prints the VmSize growth
 * over THREADS threads after a warm-up, and the thread records added.
 */
#include <pthread.h>
#include <stdlib.h>

#include "lt_reader.c"

#define WARMUP 50
#define THREADS 2000

static long vm_size_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

static void *worker(void *arg)
{
    void *volatile p = malloc((size_t)arg);
    free(p);
    return NULL;
}

static void run(int n)
{
    for (int i = 0; i < n; i++) {
        pthread_t t;
        pthread_create(&t, NULL, worker, (void *)(size_t)(16 + i % 100));
        pthread_join(t, NULL);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    run(WARMUP);
    struct libtag_stats s0, s1;
    libtag_stats(&s0);
    long before = vm_size_kb();
    run(THREADS);
    long after = vm_size_kb();
    libtag_stats(&s1);
    printf("threads_added=%u\n", s1.thread_count - s0.thread_count);
    printf("vm_growth_kb=%ld\n", after - before);
    return 0;
}
