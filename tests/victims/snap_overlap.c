/* snap_overlap.c - a second on-demand request made while the first snapshot
 * is being taken.
 *
 * Thread A takes the first snapshot signal (SIGUSR2, sent to it alone with
 * tgkill).  Main and thread B block libtag's register signal (SIGRTMAX - 1),
 * so that snapshot waits for them (200 ms) before it forks.  As soon as its
 * directory exists in $LIBTAG_DIR (the snapshot has started), main sends the
 * second SIGUSR2 to B, which is free to take it at once, while A's snapshot
 * is still under way.  Then main waits up to 20 s for two snapshot
 * directories with an info file.  Prints "pid=N" and "snapshots=N"
 * (directories with info at the end); exits 0.
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pid_t tids[2];

static void block(int sig)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static void *thread(void *arg)
{
    int i = (int)(long)arg;
    if (i == 1)
        block(SIGRTMAX - 1);
    __atomic_store_n(&tids[i], (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    for (;;)
        pause();
}

/* Snapshot directories of this process in dir: all of them, and how many
 * have their info file. */
static int count(const char *dir, int *with_info)
{
    char prefix[32], path[1024];
    snprintf(prefix, sizeof prefix, "-%d-", (int)getpid());
    DIR *d = opendir(dir);
    int n = 0;
    *with_info = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strstr(e->d_name, prefix))
            continue;
        n++;
        snprintf(path, sizeof path, "%s/%s/info", dir, e->d_name);
        *with_info += access(path, F_OK) == 0;
    }
    if (d)
        closedir(d);
    return n;
}

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void)
{
    const char *dir = getenv("LIBTAG_DIR");
    pthread_t t;
    if (!dir || pthread_create(&t, NULL, thread, (void *)0L) ||
        pthread_create(&t, NULL, thread, (void *)1L))
        return 1;
    block(SIGUSR2);
    block(SIGRTMAX - 1);
    while (!__atomic_load_n(&tids[0], __ATOMIC_ACQUIRE) || !__atomic_load_n(&tids[1], __ATOMIC_ACQUIRE))
        pause_ms(1);
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    int info = 0;
    syscall(SYS_tgkill, getpid(), tids[0], SIGUSR2);
    for (int i = 0; i < 20000 && count(dir, &info) < 1; i++)
        pause_ms(1);
    syscall(SYS_tgkill, getpid(), tids[1], SIGUSR2);
    for (int i = 0; i < 2000 && (count(dir, &info), info < 2); i++)
        pause_ms(10);
    printf("snapshots=%d\n", info);
    return 0;
}
