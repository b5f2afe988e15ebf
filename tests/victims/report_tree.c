/* report_tree.c - a heap of a known shape, snapshotted as it grows, then a
 * double free: the cores `forensics report` is tested on.
 *
 *   report_tree [SCALE]        (SCALE defaults to 1)
 *
 *   phase 1  build_index -> alloc_node: 200*SCALE blocks of 64 bytes
 *            load_config -> read_file:  4 blocks of 4096 bytes
 *            libtag_snapshot()                         (on-demand, seq 1)
 *   phase 2  fill_cache -> alloc_entry: 100*SCALE blocks of 256 bytes
 *            libtag_snapshot()                         (on-demand, seq 2)
 *            lose_buffers: 8 blocks of 512 bytes whose pointers are dropped
 *            (leaks, though a stale copy on the stack may keep one "reachable")
 *   phase 3  session_new: 1 block of 48 bytes, freed by session_end and
 *            again by session_abort: a double free     (double-free, seq 3
 *            with LIBTAG_ON_ANOMALY=snapshot)
 *
 * Prints "snapshot N rc=R" after each snapshot and "done" at the end, with
 * write(2) only: no stdio buffer joins the heap's shape.  Nothing is freed
 * but the session, so every later snapshot holds the earlier blocks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void say(const char *s)
{
    if (write(1, s, strlen(s)) < 0)
        _exit(99);
}

static void snapshot(int n)
{
    int (*snap)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "libtag_snapshot");
    int rc = snap ? snap() : -1;
    char buf[48] = "snapshot N rc=0\n";
    buf[9] = (char)('0' + n);
    if (rc != 0)
        buf[14] = 'E';
    say(buf);
    /* the catalog and the curve tell snapshots apart by time (ms) */
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

__attribute__((noinline)) static void *alloc_node(void)
{
    void *p = malloc(64);
    if (!p)
        abort();
    memset(p, 0x11, 64);
    return p;
}

__attribute__((noinline)) static void **build_index(long n)
{
    void **nodes = calloc((size_t)n, sizeof *nodes);  /* one block from build_index itself */
    if (!nodes)
        abort();
    for (long i = 0; i < n; i++)
        nodes[i] = alloc_node();
    return nodes;
}

__attribute__((noinline)) static void *read_file(void)
{
    void *p = malloc(4096);
    if (!p)
        abort();
    memset(p, 0x22, 4096);
    return p;
}

__attribute__((noinline)) static void load_config(void **out)
{
    for (int i = 0; i < 4; i++)
        out[i] = read_file();
}

__attribute__((noinline)) static void *alloc_entry(void)
{
    void *p = malloc(256);
    if (!p)
        abort();
    memset(p, 0x33, 256);
    return p;
}

__attribute__((noinline)) static void fill_cache(void **out, long n)
{
    for (long i = 0; i < n; i++)
        out[i] = alloc_entry();
}

__attribute__((noinline)) static void lose_buffers(void)
{
    for (int i = 0; i < 8; i++) {
        char *volatile p = malloc(512);
        if (!p)
            abort();
        p[0] = (char)i;
        p = NULL;
    }
}

__attribute__((noinline)) static char *session_new(void)
{
    char *s = malloc(48);
    if (!s)
        abort();
    memset(s, 0x44, 48);
    return s;
}

__attribute__((noinline)) static void session_end(char *s)
{
    free(s);
}

__attribute__((noinline)) static void session_abort(char *s)
{
    free(s);  /* the second free of the same block */
}

int main(int argc, char **argv)
{
    long scale = argc > 1 ? atol(argv[1]) : 1;
    if (scale < 1)
        scale = 1;
    static void *config[4];
    void **index = build_index(200 * scale);
    load_config(config);
    snapshot(1);

    void **cache = malloc((size_t)(100 * scale) * sizeof *cache);  /* from main */
    if (!cache)
        abort();
    fill_cache(cache, 100 * scale);
    lose_buffers();
    snapshot(2);

    char *s = session_new();
    session_end(s);
    session_abort(s);
    say("done\n");
    /* keep the blocks reachable to the end */
    return index[0] == cache[0];
}
