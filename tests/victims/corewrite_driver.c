/* corewrite_driver.c - exercises libtag's own core writer (corewrite.c)
 * without the rest of libtag, the way snapshot.c uses it: record the
 * threads' registers in the parent, fork with the raw syscall, and in the
 * child open the core file 0600 and call _tag_write_core().
 *
 * Build: gcc -g -O1 -pthread -Ilibtag/include -Ilibtag/src \
 *            tests/victims/corewrite_driver.c libtag/src/snapshot/corewrite.c \
 *            libtag/src/base/maps.c
 * Usage: corewrite_driver OUT [regs|noregs] [NMAPS]
 *   OUT      the core file to create (O_EXCL, 0600); /dev/full is opened
 *            as it is, to test a full disk
 *   regs     (default) pass the main and worker threads' records
 *   noregs   pass no valid record: the writer uses the child's registers
 *   NMAPS    also create NMAPS one-page anonymous mappings that cannot merge
 *            (alternating protections); the last writable one holds
 *            MANY_MARK at last_map_addr
 * Prints key=value lines; the child prints core_result=<return value>.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>
#include <asm/prctl.h>

#include "tag_abi.h"
#include "snapshot/corewrite.h"

#define NWORKERS 2
#define HEAP_LEN 4096
#define MANY_MARK 0x5eed5eed5eed5eedull

volatile uint64_t driver_global = 0x1122334455667788ull;
unsigned char *driver_heap;
/* A writable private file mapping whose second page lies past EOF: write(2)
 * from it fails with EFAULT, which the writer must turn into zeros. */
unsigned char *driver_filemap;

static struct libtag_thread recs[NWORKERS + 2];
/* Globals, not locals of main: main calls getcontext (returns_twice). */
static unsigned nmany;
static void *last_map;
static int with_regs = 1;
static int block_pipe[2];
static pthread_barrier_t ready;

/* ucontext gregs (REG_*) -> user_regs_struct order (tag_abi.h). */
static void regs_from_ucontext(uint64_t *r, const ucontext_t *uc)
{
    const greg_t *g = uc->uc_mcontext.gregs;
    uint64_t v = 0;

    memset(r, 0, TAG_NREGS * sizeof *r);
    r[0] = (uint64_t)g[REG_R15];
    r[1] = (uint64_t)g[REG_R14];
    r[2] = (uint64_t)g[REG_R13];
    r[3] = (uint64_t)g[REG_R12];
    r[4] = (uint64_t)g[REG_RBP];
    r[5] = (uint64_t)g[REG_RBX];
    r[6] = (uint64_t)g[REG_R11];
    r[7] = (uint64_t)g[REG_R10];
    r[8] = (uint64_t)g[REG_R9];
    r[9] = (uint64_t)g[REG_R8];
    r[10] = (uint64_t)g[REG_RAX];
    r[11] = (uint64_t)g[REG_RCX];
    r[12] = (uint64_t)g[REG_RDX];
    r[13] = (uint64_t)g[REG_RSI];
    r[14] = (uint64_t)g[REG_RDI];
    r[15] = (uint64_t)-1;               /* orig_rax: not in a syscall */
    r[16] = (uint64_t)g[REG_RIP];
    r[17] = 0x33;                       /* cs: __USER_CS */
    r[18] = 0x246;                      /* eflags: getcontext does not save */
    r[19] = (uint64_t)g[REG_RSP];
    r[20] = 0x2b;                       /* ss: __USER_DS */
    if (syscall(SYS_arch_prctl, ARCH_GET_FS, &v) == 0)
        r[21] = v;                      /* fs_base: this thread's TLS */
}

static void *driver_worker(void *arg)
{
    struct libtag_thread *rec = arg;
    ucontext_t uc;
    char c;

    /* getcontext here: the saved rip/rsp are in this frame, which stays
     * live because the thread then blocks in read() below. */
    getcontext(&uc);
    regs_from_ucontext(rec->regs, &uc);
    rec->tid = (uint32_t)syscall(SYS_gettid);
    rec->flags = TAG_THREAD_REGS;
    pthread_barrier_wait(&ready);
    while (read(block_pipe[0], &c, 1) < 0 && errno == EINTR)
        ;
    return NULL;
}

/* The child's only output: no stdio after a fork of a threaded process. */
static void say_result(int rc)
{
    char buf[32] = "core_result=";
    char tmp[12];
    size_t n = strlen(buf);
    unsigned v = rc < 0 ? (unsigned)-rc : (unsigned)rc;
    int k = 0;

    if (rc < 0)
        buf[n++] = '-';
    do
        tmp[k++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (k)
        buf[n++] = tmp[--k];
    buf[n++] = '\n';
    if (write(1, buf, n) < 0)
        _exit(3);
}

/* Reserve 2*n pages, then give alternate pages different protections so the
 * kernel cannot merge them: 2n mappings in /proc/self/maps. */
static __attribute__((noinline)) void *make_many(unsigned n)
{
    unsigned char *base, *last = NULL;
    unsigned i;

    base = mmap(NULL, (size_t)n * 2 * 4096, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    for (i = 0; i < n; i++) {
        unsigned char *pg = base + (size_t)i * 2 * 4096;
        if (mprotect(pg + 4096, 4096, PROT_READ) != 0)
            return NULL;
        *(volatile uint64_t *)pg = MANY_MARK + i;
        last = pg;
    }
    return last;
}

static int make_filemap(void)
{
    char path[] = "corewrite_filemap_XXXXXX";
    int fd = mkstemp(path);

    if (fd < 0)
        return -1;
    unlink(path);
    if (ftruncate(fd, 4096) != 0)
        return -1;
    driver_filemap = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE, fd, 0);
    close(fd);
    if (driver_filemap == MAP_FAILED)
        return -1;
    memset(driver_filemap, 0x5a, 16);
    return 0;
}

int main(int argc, char **argv)
{
    pthread_t th[NWORKERS];
    ucontext_t uc;
    const char *out;
    int i, status;
    unsigned nrecs;
    pid_t child;

    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s OUT [regs|noregs] [NMAPS]\n", argv[0]);
        return 2;
    }
    out = argv[1];
    if (argc == 3)
        with_regs = strcmp(argv[2], "noregs") != 0;
    if (argc == 4)
        nmany = (unsigned)strtoul(argv[3], NULL, 10);
    if (nmany && (last_map = make_many(nmany)) == NULL) {
        perror("make_many");
        return 1;
    }

    driver_heap = malloc(HEAP_LEN);
    if (!driver_heap || pipe(block_pipe) != 0 || make_filemap() != 0) {
        perror("setup");
        return 1;
    }
    for (i = 0; i < HEAP_LEN; i++)
        driver_heap[i] = (unsigned char)(0xa0 + i % 16);

    pthread_barrier_init(&ready, NULL, NWORKERS + 1);
    for (i = 0; i < NWORKERS; i++)
        if (pthread_create(&th[i], NULL, driver_worker, &recs[1 + i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    pthread_barrier_wait(&ready);

    /* A record without TAG_THREAD_REGS: must not become a thread. */
    recs[NWORKERS + 1].tid = 999999;
    recs[NWORKERS + 1].flags = TAG_THREAD_EXITED;

    getcontext(&uc);
    regs_from_ucontext(recs[0].regs, &uc);
    recs[0].tid = (uint32_t)getpid();
    recs[0].flags = TAG_THREAD_REGS;
    nrecs = with_regs ? NWORKERS + 2 : 0;

    printf("pid=%d\n", (int)getpid());
    printf("global_addr=%p\n", (void *)&driver_global);
    printf("heap_addr=%p\n", (void *)driver_heap);
    printf("filemap_addr=%p\n", (void *)driver_filemap);
    if (last_map)
        printf("last_map_addr=%p\nlast_map_value=%#llx\n", last_map,
               (unsigned long long)(MANY_MARK + nmany - 1));
    printf("valid_threads=%d\n", with_regs ? NWORKERS + 1 : 1);
    for (i = 0; i < NWORKERS + 1 && with_regs; i++)
        printf("tid=%u\n", recs[i].tid);
    fflush(stdout);

    child = (pid_t)syscall(SYS_fork);
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        int fd, rc;

        if (strcmp(out, "/dev/full") == 0)
            fd = open(out, O_WRONLY | O_CLOEXEC);
        else
            fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      0600);
        if (fd < 0) {
            say_result(-errno);
            _exit(1);
        }
        rc = _tag_write_core(fd, (int)getppid(), recs, nrecs);
        close(fd);
        say_result(rc);
        _exit(rc == 0 ? 0 : 1);
    }
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    printf("child_status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    fflush(stdout);

    if (close(block_pipe[1]) != 0)
        return 1;
    for (i = 0; i < NWORKERS; i++)
        pthread_join(th[i], NULL);
    return 0;
}
