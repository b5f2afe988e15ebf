/* report_more.c - what `forensics report` must say beyond the heap's shape:
 * where allocations through wrappers come from, an anomaly that later cores
 * still hold, and per-stack peaks and temporary allocations.
 *
 *   dup_name()    10 x strdup("name-N") (glibc's strdup: a default wrapper)
 *   make_label()  10 x xmalloc(40), xmalloc being the program's own (its name
 *                 is in the default wrapper list)
 *   copy_text()   10 x dupstr(...), dupstr being the program's own wrapper
 *                 that no default pattern names (--wrapper dupstr does)
 *   churn_temp()  1000 x malloc(32) freed at once: temporary allocations
 *   peak_burst()  10 x malloc(1000) held while keep_more() makes 100 blocks
 *                 of 16 bytes, then freed: a peak of 10000 bytes, none live
 *   snapshot 1 (on-demand); release_twice(): a double free of a 24-byte block
 *   (snapshot 2, double-free, with LIBTAG_ON_ANOMALY=snapshot); snapshot 3
 *   (on-demand), which still holds that anomaly.
 *
 * Prints "pid=N", "snapshot N rc=R" after each snapshot, "done" at the end.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

void *keep[256];  /* global: the blocks stay reachable */
int nkeep;

static void snapshot(int n)
{
    int (*snap)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "libtag_snapshot");
    int rc = snap ? snap() : -1;
    printf("snapshot %d rc=%d\n", n, rc);
    fflush(stdout);
    /* the curve tells snapshots apart by time (ms) */
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

NOINLINE static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        abort();
    return p;
}

NOINLINE static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n + 16);
    memcpy(p, s, n);
    return p;
}

NOINLINE static void dup_name(int i)
{
    char buf[32];
    snprintf(buf, sizeof buf, "name-%d", i);
    keep[nkeep++] = strdup(buf);
}

NOINLINE static void make_label(void)
{
    char *p = xmalloc(40);
    memset(p, 'l', 40);
    keep[nkeep++] = p;
}

NOINLINE static void copy_text(void)
{
    keep[nkeep++] = dupstr("some text to copy");
}

NOINLINE static void churn_temp(void)
{
    for (int i = 0; i < 1000; i++) {
        char *volatile p = malloc(32);
        p[0] = (char)i;
        free(p);
    }
}

NOINLINE static void keep_more(void)
{
    for (int i = 0; i < 100; i++)
        keep[nkeep++] = malloc(16);
}

NOINLINE static void peak_burst(void)
{
    void *burst[10];
    for (int i = 0; i < 10; i++)
        burst[i] = malloc(1000);
    keep_more();
    for (int i = 0; i < 10; i++)
        free(burst[i]);
}

NOINLINE static void release_twice(void)
{
    char *volatile p = malloc(24);
    free(p);
    free(p);
}

int main(void)
{
    printf("pid=%d\n", (int)getpid());
    for (int i = 0; i < 10; i++) {
        dup_name(i);
        make_label();
        copy_text();
    }
    churn_temp();
    peak_burst();
    snapshot(1);
    release_twice();
    struct timespec ts = {0, 20 * 1000 * 1000};  /* apart from the anomaly's snapshot */
    nanosleep(&ts, NULL);
    snapshot(3);
    printf("done\n");
    return 0;
}
