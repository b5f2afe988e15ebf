/* A plain program (never run under libtag) for `forensics snapshot PID` by
 * ptrace: known blocks, one leaked, three threads blocked in three ways, and
 * counters of everything the program could notice of a snapshot.
 *
 *   plain_threads [seccomp]
 *
 * seccomp: once its threads run, a seccomp filter that kills the process at
 * any fork or clone (and allows everything else) is installed.
 *
 * Prints, then waits for commands on stdin:
 *   block kept 0xADDR 1000        a live block of 1000 bytes, filled with 'k'
 *   block freed 0xADDR 200        a freed one (a tcache chunk)
 *   block leaked 0xADDR 777       allocated, filled, its only pointer dropped
 *   thread reader TID             blocked in read() on a pipe nobody writes
 *   thread sleeper TID            in nanosleep() of 1 s, in a loop
 *   thread spinner TID            computing, no system call
 *   ready
 * "report" prints "report eintr=N handlers=N children=N spins=N": read()s and
 * nanosleep()s that failed with EINTR, calls of its SIGCHLD / SIGUSR1 / SIGURG
 * handlers (installed without SA_RESTART, so a handler that ran would also
 * show as EINTR), and children wait() sees; "quit" exits 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_long eintr_count, handler_count, spins;
static int quiet_pipe[2];
void *volatile kept_block;

static void on_signal(int sig) { (void)sig; atomic_fetch_add(&handler_count, 1); }

static long tid(void) { return syscall(SYS_gettid); }

__attribute__((noinline)) void *reader_main(void *arg)
{
    (void)arg;
    printf("thread reader %ld\n", tid());
    fflush(stdout);
    char c;
    for (;;) {
        ssize_t n = read(quiet_pipe[0], &c, 1);
        if (n < 0 && errno == EINTR)
            atomic_fetch_add(&eintr_count, 1);
        else if (n <= 0)
            return NULL;
    }
}

__attribute__((noinline)) void *sleeper_main(void *arg)
{
    (void)arg;
    printf("thread sleeper %ld\n", tid());
    fflush(stdout);
    for (;;) {
        struct timespec ts = {1, 0};
        if (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            atomic_fetch_add(&eintr_count, 1);
    }
}

__attribute__((noinline)) void *spinner_main(void *arg)
{
    (void)arg;
    printf("thread spinner %ld\n", tid());
    fflush(stdout);
    volatile unsigned long x = 1;
    for (;;) {
        for (int i = 0; i < 100000; i++)
            x = x * 6364136223846793005UL + 1442695040888963407UL;
        atomic_fetch_add(&spins, 1);
    }
}

static void forbid_fork(void)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fork, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_vfork, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {sizeof code / sizeof code[0], code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) {
        perror("seccomp");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;  /* no SA_RESTART */
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGURG, &sa, NULL);
    if (pipe(quiet_pipe) != 0)
        return 1;

    char *kept = malloc(1000);
    memset(kept, 'k', 1000);
    kept_block = kept;
    char *freed = malloc(200);
    memset(freed, 'f', 200);
    char *leaked = malloc(777);
    memset(leaked, 'l', 777);
    printf("block kept %p 1000\nblock freed %p 200\nblock leaked %p 777\n",
           (void *)kept, (void *)freed, (void *)leaked);
    free(freed);
    leaked = NULL;
    fflush(stdout);

    pthread_t t[3];
    pthread_create(&t[0], NULL, reader_main, NULL);
    usleep(20000);
    pthread_create(&t[1], NULL, sleeper_main, NULL);
    usleep(20000);
    pthread_create(&t[2], NULL, spinner_main, NULL);
    usleep(20000);
    if (argc > 1 && strcmp(argv[1], "seccomp") == 0)
        forbid_fork();
    printf("ready\n");
    fflush(stdout);

    char line[64];
    for (;;) {
        if (!fgets(line, sizeof line, stdin)) {
            if (ferror(stdin) && errno == EINTR) {
                atomic_fetch_add(&eintr_count, 1);
                clearerr(stdin);
                continue;
            }
            return 0;
        }
        if (strncmp(line, "report", 6) == 0) {
            int children = 0;
            while (waitpid(-1, NULL, WNOHANG) > 0)
                children++;
            printf("report eintr=%ld handlers=%ld children=%d spins=%ld\n",
                   atomic_load(&eintr_count), atomic_load(&handler_count), children,
                   atomic_load(&spins));
            fflush(stdout);
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        }
    }
}
