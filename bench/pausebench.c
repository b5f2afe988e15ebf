/* pausebench.c - how long is the process stopped when it is snapshotted?
 *
 * Run under libtag (LD_PRELOAD; libtag_snapshot is found with dlsym, so the
 * binary is not linked to it).  It builds GIB GiB of live heap out of mixed
 * blocks (64 B - 64 KiB, log-uniform, every byte written so the pages are
 * resident), starts one idle helper thread (so the snapshot really has a
 * thread to stop, as a service would), then measures in this same process:
 *
 * Each repetition is a bare fork then a snapshot, interleaved:
 *
 *   fork      a bare fork: syscall(SYS_fork) timed in the parent, the child
 *             _exit(0)s at once, the parent reaps it.  The raw system call,
 *             like libtag's: no atfork handlers, no malloc arena locks.
 *   snapshot  libtag_snapshot(): the pause libtag reports in the snapshot's
 *             info file (pause_ns = register capture of every thread + the
 *             clone; fork_ns = the clone alone) and the wall time of the
 *             call as the calling thread sees it (+ directory creation and
 *             the info file).  Each core is waited for (the child pid named
 *             in info is a zombie or gone) and deleted before the next.
 *
 * Then it prints "GCORE-READY <pid>" and waits for a line on stdin, so the
 * driver (run_pause.py) can time gcore on this process from outside.
 *
 * Output: one "key value..." line per measurement, parsed by run_pause.py.
 *
 *   usage: pausebench GIB [REPS] [SNAPDIR]
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

static volatile int stop_helper;
static void *helper(void *arg)
{
    (void)arg;
    while (!stop_helper) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static long rss_kib(void)
{
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *p = strstr(buf, "VmRSS:");
    return p ? atol(p + 6) : -1;
}

/* 1 while pid exists and is not a zombie. */
static int running(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static long info_value(const char *info, const char *key)
{
    size_t k = strlen(key);
    for (const char *p = info; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, key, k) == 0 && p[k] == '=')
            return atol(p + k + 1);
    return -1;
}

static void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[1400];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* The snapshot directory of this process with sequence number seq. */
static int find_snapshot(const char *root, unsigned seq, char *out, size_t cap)
{
    char want[64];
    snprintf(want, sizeof want, "-%d-%u-on-demand", (int)getpid(), seq);
    DIR *d = opendir(root);
    if (!d)
        return -1;
    struct dirent *e;
    int found = -1;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name), w = strlen(want);
        if (n >= w && strcmp(e->d_name + n - w, want) == 0) {
            snprintf(out, cap, "%s/%s", root, e->d_name);
            found = 0;
            break;
        }
    }
    closedir(d);
    return found;
}

/* One bare fork: the parent's time in the raw system call. */
static int bare_fork(void)
{
    uint64_t a = now_ns();
    long pid = syscall(SYS_fork);
    if (pid == 0)
        _exit(0);
    uint64_t b = now_ns();
    if (pid < 0) {
        perror("fork");
        return -1;
    }
    waitpid((pid_t)pid, NULL, 0);
    printf("fork ns %llu\n", (unsigned long long)(b - a));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 1.0;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *root = argc > 3 ? argv[3] : getenv("LIBTAG_DIR");
    int (*snapshot)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "libtag_snapshot");
    if (!snapshot)
        fprintf(stderr, "pausebench: libtag_snapshot not found (not under libtag): fork only\n");
    if (snapshot && !root) {
        fprintf(stderr, "pausebench: set LIBTAG_DIR (or pass SNAPDIR)\n");
        return 2;
    }

    /* The live heap: log-uniform sizes 64 B .. 64 KiB, fully written. */
    uint64_t target = (uint64_t)(gib * (1ull << 30)), live = 0, s = 88172645463325252ull;
    size_t cap = 1 << 16, n = 0;
    void **blocks = malloc(cap * sizeof *blocks);
    uint64_t t0 = now_ns();
    while (live < target) {
        uint64_t r = rng(&s);
        size_t size = (size_t)64 << (r % 11);            /* 64 .. 64 KiB */
        size += (r >> 8) % size;                         /* spread inside the octave */
        if (size > 65536)
            size = 65536;
        if (n == cap) {
            cap *= 2;
            blocks = realloc(blocks, cap * sizeof *blocks);
        }
        char *p = malloc(size);
        if (!p) {
            perror("malloc");
            return 1;
        }
        memset(p, (int)(r >> 56) | 1, size);
        blocks[n++] = p;
        live += size;
    }
    uint64_t t1 = now_ns();
    printf("heap gib %.2f blocks %zu bytes %llu build_s %.2f rss_kib %ld\n", gib, n,
           (unsigned long long)live, (t1 - t0) / 1e9, rss_kib());
    fflush(stdout);

    pthread_t th;
    pthread_create(&th, NULL, helper, NULL);

    /* Interleaved, fork then snapshot, so each pair sees the same state of
     * the machine (page cache and writeback left by the previous core). */
    for (int i = 0; i < reps; i++) {
        if (bare_fork() < 0)
            return 1;
        if (!snapshot)
            continue;
        uint64_t a = now_ns();
        int rc = snapshot();
        uint64_t b = now_ns();
        if (rc != 0) {
            fprintf(stderr, "pausebench: libtag_snapshot: %s\n", strerror(-rc));
            return 1;
        }
        char dir[1024], path[1100], info[1024];
        if (find_snapshot(root, (unsigned)(i + 1), dir, sizeof dir) < 0) {
            fprintf(stderr, "pausebench: snapshot %d: no directory in %s\n", i + 1, root);
            return 1;
        }
        snprintf(path, sizeof path, "%s/info", dir);
        int fd = open(path, O_RDONLY);
        ssize_t len = fd >= 0 ? read(fd, info, sizeof info - 1) : -1;
        if (fd >= 0)
            close(fd);
        if (len <= 0) {
            fprintf(stderr, "pausebench: no info in %s\n", dir);
            return 1;
        }
        info[len] = 0;
        long child = info_value(info, "child");
        while (child > 0 && running(child)) {
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
        uint64_t d = now_ns();
        struct stat st;
        snprintf(path, sizeof path, "%s/core", dir);
        long long core = -1, disk = -1;  /* apparent size; allocated (holes excluded) */
        if (stat(path, &st) == 0) {
            core = (long long)st.st_size;
            disk = (long long)st.st_blocks * 512;
        }
        snprintf(path, sizeof path, "%s/error", dir);
        if (access(path, F_OK) == 0)
            fprintf(stderr, "pausebench: snapshot %d reported an error (see %s)\n", i + 1, path);
        printf("snapshot pause_ns %ld fork_ns %ld call_ns %llu threads_stopped %ld "
               "core_bytes %lld core_disk %lld core_s %.2f\n",
               info_value(info, "pause_ns"), info_value(info, "fork_ns"),
               (unsigned long long)(b - a), info_value(info, "threads_stopped"), core, disk,
               (d - a) / 1e9);
        fflush(stdout);
        rm_rf(dir);
    }

    printf("GCORE-READY %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        line[0] = 0;
    stop_helper = 1;
    pthread_join(th, NULL);
    /* keep the heap alive until here */
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i += 4096)
        sum += *(unsigned char *)blocks[i];
    printf("done %llu\n", (unsigned long long)sum);
    return 0;
}
