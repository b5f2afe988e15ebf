/* guard_faults.c - guarded blocks and the accesses a program must not make.
 * Run under libtag with LIBTAG_GUARD_RATE=1: every allocation is guarded.
 *
 *   guard_faults CASE [OFFSET]
 *
 * Before the bad access it prints what the test must find:
 *   block=0x...    the block involved (its user pointer)
 *   address=0x...  the byte the access touches
 *   tid=N          the thread that makes the access
 *   line=N         the source line of the access (in read_byte/write_byte)
 * then makes it in read_byte() or write_byte(), prints "value=N" (what a
 * read returned) and "survived", and exits 0.
 *
 * Cases: overflow-write, overflow-read (the first byte past the block's
 * aligned end), underflow-read, underflow-write (the byte below the slot
 * of a block that fills it), uaf-read OFFSET, uaf-write OFFSET (in the
 * freeing thread), uaf-read-other OFFSET (a thread frees, main reads),
 * uaf-write-thread OFFSET (a thread frees and writes), uaf-twice (one
 * block read twice after free, then a second block: two reports),
 * slack (a write into the alignment slack: found at free), tag-underflow
 * (p[-1]: found at free), double-free, own-handler (the program's SIGSEGV
 * handler catches its own fault; a guarded fault does not reach it),
 * storm (threads allocate and free while main faults and forks: "bad<k>=0"
 * when each thread always read back what it wrote),
 * usable (malloc_usable_size and realloc of guarded blocks), count N
 * (N allocations of 64 bytes: prints the rate in effect and how many were
 * guarded, from libtag's control block), many N (keeps N blocks of 32
 * bytes alive, then maps 1000 pages of its own and dlopens libresolv:
 * prints how many blocks were guarded, the process's mappings, whether
 * both calls worked, then reads a block after freeing it), reuse N (six
 * rounds: N blocks of 100..12099 bytes filled with 0xab and freed, then N
 * from calloc, each checked for a non-zero byte: prints "dirty=K", the
 * calloc'd blocks that were not all zero, and how many were guarded),
 * shut (reads a block freed in the window after its slot left the window,
 * while other freed slots are queued ahead of it), lone and lone-overflow
 * (a block whose slot left the window live: read after its free, or the
 * byte past its end), churn N (N blocks replaced at random, short lives
 * beside long: prints "bad=K", the blocks that did not keep their bytes,
 * and the process's mappings), resident N (N blocks of 64 bytes, written:
 * prints "live=K", how many of their pages are resident (mincore), frees
 * them, prints "freed=K" the same way, then reads the first one at offset
 * 8).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <malloc.h>
#include <dlfcn.h>
#include <sys/mman.h>

#include "tag_abi.h"

/* libtag's, found at run time in the preloaded library */
extern const void *libtag_control(void) __attribute__((weak));

enum { READ_LINE = __LINE__ + 3 };
__attribute__((noinline)) int read_byte(volatile unsigned char *p)
{
    return *p;
}

enum { WRITE_LINE = __LINE__ + 3 };
__attribute__((noinline)) void write_byte(volatile unsigned char *p, int v)
{
    *p = (unsigned char)v;
}

static unsigned tid(void)
{
    return (unsigned)syscall(SYS_gettid);
}

/* libtag's window of guarded placements: vm.max_map_count / 32, read as
 * libtag reads it (no stdio: its buffers would be placements); 0 if not. */
static size_t guard_window(void)
{
    char buf[24] = {0};
    int fd = open("/proc/sys/vm/max_map_count", O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    return got > 0 ? strtoul(buf, NULL, 10) / 32 : 0;
}

static int count_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, ch;
    while (f && (ch = fgetc(f)) != EOF)
        n += ch == '\n';
    if (f)
        fclose(f);
    return n;
}

/* How many of the pages that hold blocks[0..n) are resident. */
static size_t pages_resident(unsigned char **blocks, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char in = 0;
        void *at = (void *)((uintptr_t)blocks[i] & ~(uintptr_t)(page - 1));
        if (mincore(at, page, &in) == 0)
            k += in & 1;
    }
    return k;
}

static void expect(const void *block, const volatile void *address, int line)
{
    printf("block=%p\naddress=%p\ntid=%u\nline=%d\n", block, (const void *)address, tid(), line);
}

static void do_read(unsigned char *block, unsigned char *at)
{
    expect(block, at, READ_LINE);
    int v = read_byte(at);
    printf("value=%d\n", v);
}

static void do_write(unsigned char *block, unsigned char *at)
{
    expect(block, at, WRITE_LINE);
    write_byte(at, 0x5a);
    printf("value=%d\n", 0x5a);
}

/* ------------------------------------------------------------- threads -- */

struct job {
    size_t offset;
    unsigned char *block;
};

static void *free_it(void *arg)
{
    struct job *j = arg;
    j->block = malloc(256);
    memset(j->block, 1, 256);
    free(j->block);
    printf("free_tid=%u\n", tid());
    return NULL;
}

static void *free_and_write(void *arg)
{
    struct job *j = arg;
    unsigned char *p = malloc(256);
    memset(p, 1, 256);
    free(p);
    printf("free_tid=%u\n", tid());
    do_write(p, p + j->offset);
    return NULL;
}

/* storm: threads that allocate, fill, check and free until told to stop */
static volatile int stop, started;
static unsigned long bad[4], iters[4];

static void *churn(void *arg)
{
    unsigned long k = (unsigned long)(uintptr_t)arg;
    for (unsigned i = 0; !stop; i++) {
        size_t n = 16 + (i * 37 + k) % 900;
        unsigned char *p = malloc(n);
        memset(p, (int)(i & 0xff), n);
        bad[k] += p[0] != (i & 0xff) || p[n - 1] != (i & 0xff);
        free(p);
        if (i == 0)
            __atomic_add_fetch(&started, 1, __ATOMIC_RELEASE);
        iters[k]++;
    }
    return NULL;
}

/* ---------------------------------------------------------- own handler -- */

static sigjmp_buf back;
static volatile int own_faults;

static void own_segv(int sig)
{
    (void)sig;
    own_faults++;
    siglongjmp(back, 1);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *c = argc > 1 ? argv[1] : "";
    size_t off = argc > 2 ? strtoul(argv[2], NULL, 0) : 0;

    if (!strcmp(c, "overflow-write")) {
        unsigned char *p = malloc(128);
        do_write(p, p + 128);
        free(p);
    } else if (!strcmp(c, "overflow-read")) {
        unsigned char *p = malloc(100);
        do_read(p, p + 112);  /* 100 rounded up to 16: the slot's end */
        free(p);
    } else if (!strcmp(c, "underflow-read") || !strcmp(c, "underflow-write")) {
        /* 16384 - 16: the block fills its slot, its 16-byte tag is the
         * first bytes of it, and the byte before is the guard page below */
        unsigned char *p = malloc(16384 - 16);
        if (c[10] == 'r')
            do_read(p, p - 17);
        else
            do_write(p, p - 17);
        free(p);
    } else if (!strcmp(c, "uaf-read") || !strcmp(c, "uaf-write")) {
        unsigned char *p = malloc(256);
        memset(p, 1, 256);
        free(p);
        printf("free_tid=%u\n", tid());
        if (c[4] == 'r')
            do_read(p, p + off);
        else
            do_write(p, p + off);
    } else if (!strcmp(c, "uaf-read-other")) {
        struct job j = {off, NULL};
        pthread_t th;
        pthread_create(&th, NULL, free_it, &j);
        pthread_join(th, NULL);
        do_read(j.block, j.block + off);
    } else if (!strcmp(c, "uaf-write-thread")) {
        struct job j = {off, NULL};
        pthread_t th;
        pthread_create(&th, NULL, free_and_write, &j);
        pthread_join(th, NULL);
    } else if (!strcmp(c, "uaf-twice")) {
        unsigned char *p = malloc(64), *q = malloc(64);
        free(p);
        free(q);
        do_read(p, p + 8);
        do_read(p, p + 16);   /* the same slot: no second report */
        do_write(q, q + 24);  /* another slot: reported */
    } else if (!strcmp(c, "slack")) {
        unsigned char *p = malloc(100);
        expect(p, p + 100, 0);
        write_byte(p + 100, 1);  /* inside the 12 bytes up to the slot's end */
        free(p);
    } else if (!strcmp(c, "tag-underflow")) {
        unsigned char *p = malloc(100);
        expect(p, p - 1, 0);
        write_byte(p - 1, 0x41);
        free(p);
    } else if (!strcmp(c, "double-free")) {
        unsigned char *p = malloc(100);
        expect(p, p, 0);
        free(p);
        free(p);
    } else if (!strcmp(c, "own-handler")) {
        signal(SIGSEGV, own_segv);
        if (!sigsetjmp(back, 1))
            read_byte((volatile unsigned char *)16);  /* the program's own fault */
        unsigned char *p = malloc(256);
        free(p);
        do_read(p, p + 40);  /* libtag's */
        printf("own_faults=%d\n", own_faults);
    } else if (!strcmp(c, "storm")) {
        pthread_t th[4];
        for (unsigned long k = 0; k < 4; k++)
            pthread_create(&th[k], NULL, churn, (void *)(uintptr_t)k);
        while (__atomic_load_n(&started, __ATOMIC_ACQUIRE) < 4)
            usleep(1000);
        unsigned char *p = malloc(256);
        free(p);
        do_read(p, p + 100);
        pid_t child = fork();
        if (child == 0) {
            /* the pool's lock is free in the child, guarded blocks work */
            unsigned char *q = malloc(300);
            memset(q, 3, 300);
            int s = q[299];
            free(q);
            _exit(s == 3 ? 0 : 1);
        }
        int status = 0;
        waitpid(child, &status, 0);
        stop = 1;
        for (int k = 0; k < 4; k++)
            pthread_join(th[k], NULL);
        printf("child=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        for (int k = 0; k < 4; k++)
            printf("bad%d=%lu ran=%d\n", k, bad[k], iters[k] > 0);
    } else if (!strcmp(c, "usable")) {
        unsigned char *p = calloc(1, 100);
        int zero = 1;
        for (int i = 0; i < 100; i++)
            zero &= p[i] == 0;
        printf("usable=%zu zero=%d\n", malloc_usable_size(p), zero);
        memset(p, 7, 100);
        unsigned char *q = realloc(p, 5000);
        printf("moved=%d kept=%d usable=%zu\n", q != p, q[99] == 7, malloc_usable_size(q));
        free(q);
        void *a = NULL;
        int rc = posix_memalign(&a, 4096, 200);
        printf("aligned=%d rc=%d\n", (int)((uintptr_t)a % 4096), rc);
        free(a);
        printf("freed_usable=%zu\n", malloc_usable_size(p));
    } else if (!strcmp(c, "count")) {
        const struct libtag_control *ctl = libtag_control ? libtag_control() : NULL;
        if (!ctl)
            return 3;
        unsigned long guarded = 0;
        for (size_t i = 0; i < off; i++) {
            unsigned char *p = malloc(64);
            guarded += (uintptr_t)p - ctl->guard_pool < ctl->guard_pool_bytes;
            free(p);
        }
        printf("rate=%u guarded=%lu\n", ctl->guard_rate, guarded);
    } else if (!strcmp(c, "many")) {
        const struct libtag_control *ctl = libtag_control ? libtag_control() : NULL;
        if (!ctl)
            return 3;
        unsigned char **keep = calloc(off, sizeof *keep);  /* before any guarded one */
        if (!keep)
            return 3;
        unsigned long guarded = 0;
        for (size_t i = 0; i < off; i++) {
            keep[i] = malloc(32);
            memset(keep[i], (int)(i & 0xff), 32);
            guarded += (uintptr_t)keep[i] - ctl->guard_pool < ctl->guard_pool_bytes;
        }
        printf("guarded=%lu\nmappings=%d\n", guarded, count_mappings());
        /* 1000 mappings of the program's own: alternate protections keep
         * neighbours apart, so each is its own entry in the map table */
        int mapped = 0;
        for (int i = 0; i < 1000; i++) {
            void *m = mmap(NULL, 4096, i % 2 ? PROT_READ : PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            mapped += m != MAP_FAILED;
        }
        void *lib = dlopen("libresolv.so.2", RTLD_NOW);
        printf("mmap=%d\ndlopen=%d\n", mapped, lib != NULL);
        unsigned long bad = 0;
        for (size_t i = 0; i < off; i++)
            bad += keep[i][31] != (unsigned char)(i & 0xff);
        printf("bad=%lu\n", bad);
        /* a block made after all of them is still guarded */
        unsigned char *p = malloc(256);
        memset(p, 1, 256);
        free(p);
        do_read(p, p + 8);
    } else if (!strcmp(c, "churn")) {
        /* off blocks live at once, replaced at random for 400000 rounds,
         * three in four from a sixteenth of them (short lives beside long
         * ones, freed in and out of the window): each block is checked
         * for the bytes written into it before it is freed */
        size_t live = off ? off : 20000;
        unsigned char **b = calloc(live, sizeof *b);
        size_t *len = calloc(live, sizeof *len);
        if (!b || !len)
            return 3;
        uint64_t s = 88172645463325252ull;
        unsigned long bad = 0;
        for (size_t i = 0; i < 400000; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            size_t k = (s & 3) ? (s >> 8) % (live / 16 + 1) : (s >> 8) % live;
            if (b[k]) {
                for (size_t j = 0; j < len[k]; j++)
                    bad += b[k][j] != (unsigned char)(k + len[k]);
                free(b[k]);
            }
            len[k] = 8 + (s >> 40) % 600;
            b[k] = malloc(len[k]);
            memset(b[k], (int)(k + len[k]), len[k]);
        }
        printf("bad=%lu\nmappings=%d\n", bad, count_mappings());
    } else if (!strcmp(c, "lone") || !strcmp(c, "lone-overflow")) {
        /* A block that outlives the window (30 placements after it left):
         * its guards stay shut, and it is shut when freed - its overflow
         * and its use after free are caught at the instruction. */
        size_t window = guard_window(), n = window + 30;
        unsigned char *t = malloc(64);
        unsigned char **keep = calloc(n, sizeof *keep);  /* over a slot: not guarded */
        if (!t || !keep || !window)
            return 3;
        memset(t, 7, 64);
        for (size_t i = 0; i < n; i++)
            keep[i] = malloc(64);
        if (!strcmp(c, "lone")) {
            free(t);
            do_read(t, t + 8);
        } else {
            do_read(t, t + 64);  /* the first byte past it: its guard page */
        }
    } else if (!strcmp(c, "shut")) {
        /* A block freed inside the window, whose slot then leaves it while
         * older freed slots wait in the queue ahead of it: still caught.
         * No stdio before the read (its buffers would be placements too). */
        size_t window = guard_window(), n = window + 100;
        if (!window)
            return 3;
        unsigned char **keep = calloc(n, sizeof *keep);  /* over a slot: not guarded */
        if (!keep)
            return 3;
        for (size_t i = 0; i < n; i++) {
            keep[i] = malloc(64);
            memset(keep[i], 7, 64);
        }
        for (size_t i = 0; i < 100; i++)
            free(keep[i]);  /* out of the window: queued, open */
        unsigned char *t = keep[110];
        free(t);  /* in the window: shut */
        /* 30 placements: each takes the queue's head, and the window's
         * oldest leave - t the 11th - while 70 freed slots stay queued
         * ahead of t */
        for (size_t i = 0; i < 30; i++)
            keep[i] = malloc(64);
        do_read(t, t + 8);
    } else if (!strcmp(c, "resident")) {
        unsigned char **keep = calloc(off, sizeof *keep);
        if (!keep || !off)
            return 3;
        for (size_t i = 0; i < off; i++) {
            keep[i] = malloc(64);
            memset(keep[i], 0xab, 64);
        }
        printf("live=%zu\n", pages_resident(keep, off));
        for (size_t i = 0; i < off; i++)
            free(keep[i]);
        printf("freed=%zu\n", pages_resident(keep, off));
        do_read(keep[0], keep[0] + 8);
    } else if (!strcmp(c, "reuse")) {
        const struct libtag_control *ctl = libtag_control ? libtag_control() : NULL;
        char **keep = ctl ? calloc(off, sizeof *keep) : NULL;
        if (!keep)
            return 3;
        unsigned long dirty = 0, guarded = 0;
        for (int round = 0; round < 6; round++) {
            for (size_t i = 0; i < off; i++) {
                size_t n = 100 + (i * 37) % 12000;
                keep[i] = malloc(n);
                memset(keep[i], 0xab, n);
            }
            for (size_t i = 0; i < off; i++)
                free(keep[i]);
            for (size_t i = 0; i < off; i++) {
                size_t n = 100 + (i * 53) % 12000;
                unsigned char *q = calloc(1, n);
                for (size_t k = 0; k < n; k++)
                    if (q[k]) {
                        dirty++;
                        break;
                    }
                guarded += (uintptr_t)q - ctl->guard_pool < ctl->guard_pool_bytes;
                memset(q, 0xcd, n);
                keep[i] = (char *)q;
            }
            for (size_t i = 0; i < off; i++)
                free(keep[i]);
        }
        printf("dirty=%lu guarded=%lu\n", dirty, guarded);
    } else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    printf("survived\n");
    return 0;
}
