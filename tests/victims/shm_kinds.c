/* shm_kinds.c - a program that maps every kind of shared memory, prints
 * where each is, keeps one heap block's only pointer in the SysV segment,
 * then snapshots itself (raise(SIGUSR2): an on-demand snapshot into
 * $LIBTAG_DIR) and exits 0.
 *
 * The facts (one per line, addresses as 0x...):
 *
 *   pid PID
 *   sysv ADDR KEY      shmget(KEY) + shmat (KEY: 0x7e000000 | pid)
 *   memfd ADDR NAME    memfd_create(NAME) + mmap MAP_SHARED
 *   posix ADDR NAME    shm_open(NAME) + mmap MAP_SHARED (then shm_unlink)
 *   zero ADDR          /dev/zero mmap MAP_SHARED
 *   anon ADDR          mmap MAP_PRIVATE | MAP_ANONYMOUS
 *   kept ADDR SIZE     a heap block (keep_in_shm <- main) whose only pointer
 *                      is the first word of the SysV segment
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#define SEG 8192
#define KEPT_SIZE 72

static void die(const char *what)
{
    perror(what);
    exit(2);
}

__attribute__((noinline)) static void keep_in_shm(void **slot)
{
    char *p = malloc(KEPT_SIZE);
    memset(p, 0x44, KEPT_SIZE);
    *slot = p;
    printf("kept %p %d\n", (void *)p, KEPT_SIZE);
}

int main(void)
{
    pid_t pid = getpid();
    printf("pid %d\n", (int)pid);

    key_t key = (key_t)(0x7e000000 | (pid & 0xffffff));
    int id = shmget(key, SEG, IPC_CREAT | IPC_EXCL | 0600);
    if (id < 0)
        die("shmget");
    char *sysv = shmat(id, NULL, 0);
    if (sysv == (void *)-1)
        die("shmat");
    shmctl(id, IPC_RMID, NULL); /* gone when the process detaches */
    memset(sysv, 0, SEG);
    printf("sysv %p %#x\n", (void *)sysv, (unsigned)key);

    int mfd = memfd_create("fx-memfd", 0);
    if (mfd < 0 || ftruncate(mfd, SEG) != 0)
        die("memfd_create");
    char *memfd = mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (memfd == MAP_FAILED)
        die("mmap memfd");
    memset(memfd, 1, SEG);
    printf("memfd %p fx-memfd\n", (void *)memfd);

    char name[64];
    snprintf(name, sizeof name, "/fx-shm-%d", (int)pid);
    int pfd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (pfd < 0 || ftruncate(pfd, SEG) != 0)
        die("shm_open");
    char *posix = mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    if (posix == MAP_FAILED)
        die("mmap posix");
    shm_unlink(name);
    memset(posix, 2, SEG);
    printf("posix %p %s\n", (void *)posix, name);

    int zfd = open("/dev/zero", O_RDWR);
    char *zero = zfd < 0 ? MAP_FAILED : mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_SHARED, zfd, 0);
    if (zero == MAP_FAILED)
        die("mmap /dev/zero");
    memset(zero, 3, SEG);
    printf("zero %p\n", (void *)zero);

    char *anon = mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED)
        die("mmap anon");
    memset(anon, 4, SEG);
    printf("anon %p\n", (void *)anon);

    keep_in_shm((void **)sysv);
    fflush(stdout);
    raise(SIGUSR2);
    return 0;
}
