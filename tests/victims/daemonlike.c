/* daemonlike.c - behaves as daemons do toward signals, its environment and
 * its privileges, to check that forensics snapshot never disturbs it.
 *
 *   daemonlike [drop] [rt]
 *
 * - installs its own handlers for SIGUSR1, SIGUSR2, SIGHUP, SIGWINCH,
 *   SIGPWR, SIGURG and SIGTTIN (each counts its calls); with "rt" also for
 *   SIGRTMAX-1, the signal libtag takes requests on;
 * - rewrites its argv and environment as setproctitle() does (the strings
 *   are overwritten in place, so /proc/PID/environ no longer holds
 *   LIBTAG_DIR or anything else);
 * - with "drop", becomes uid/gid 65534 (nobody) after setgroups(0);
 * - allocates a marker block of 4242 bytes in make_marker() and keeps it;
 *   a second thread churns small allocations.
 *
 * Prints "ready pid=P marker=0xADDR uid=U".  Each line on stdin "count"
 * prints "counts usr1=.. usr2=.. hup=.. winch=.. pwr=.. urg=.. ttin=.. rt=..";
 * at end of input it prints the same and exits 0. */
#define _GNU_SOURCE
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static const int owned[] = {SIGUSR1, SIGUSR2, SIGHUP, SIGWINCH, SIGPWR, SIGURG, SIGTTIN};
static const char *const names[] = {"usr1", "usr2", "hup", "winch", "pwr", "urg", "ttin"};
#define NOWNED (sizeof owned / sizeof owned[0])
static volatile sig_atomic_t counts[NOWNED + 1];  /* + SIGRTMAX-1 */
static volatile int stop;

static void on_signal(int sig)
{
    for (size_t i = 0; i < NOWNED; i++)
        if (owned[i] == sig)
            counts[i]++;
    if (sig == SIGRTMAX - 1)
        counts[NOWNED]++;
}

static void own(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

/* setproctitle: argv and environ strings lie in one run of memory; copy
 * the environment elsewhere (no longer visible in /proc/PID/environ) and
 * write the title over all of it. */
static void set_title(int argc, char **argv, const char *title)
{
    char *end = argv[argc - 1] + strlen(argv[argc - 1]);
    size_t n = 0;
    while (environ[n])
        n++;
    char **copy = calloc(n + 1, sizeof *copy);
    for (size_t i = 0; i < n; i++) {
        copy[i] = strdup(environ[i]);
        if (environ[i] + strlen(environ[i]) > end)
            end = environ[i] + strlen(environ[i]);
    }
    environ = copy;
    memset(argv[0], 0, (size_t)(end - argv[0]));
    snprintf(argv[0], (size_t)(end - argv[0]), "%s", title);
}

__attribute__((noinline)) static char *make_marker(void)
{
    char *m = malloc(4242);
    memset(m, 'M', 4242);
    return m;
}

static void *churn(void *arg)
{
    (void)arg;
    void *keep[64] = {0};
    unsigned i = 0;
    while (!stop) {
        free(keep[i % 64]);
        keep[i % 64] = malloc(16 + i % 200);
        i++;
        if (i % 1024 == 0)
            usleep(1000);
    }
    for (int k = 0; k < 64; k++)
        free(keep[k]);
    return NULL;
}

static void print_counts(void)
{
    printf("counts");
    for (size_t i = 0; i < NOWNED; i++)
        printf(" %s=%d", names[i], (int)counts[i]);
    printf(" rt=%d\n", (int)counts[NOWNED]);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int drop = 0, rt = 0;
    for (int i = 1; i < argc; i++) {
        drop |= strcmp(argv[i], "drop") == 0;
        rt |= strcmp(argv[i], "rt") == 0;
    }
    for (size_t i = 0; i < NOWNED; i++)
        own(owned[i]);
    if (rt)
        own(SIGRTMAX - 1);
    set_title(argc, argv, "daemonlike: worker process");
    if (drop && (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)) {
        perror("drop");
        return 1;
    }
    char *marker = make_marker();
    pthread_t th;
    pthread_create(&th, NULL, churn, NULL);
    printf("ready pid=%d marker=%p uid=%d\n", (int)getpid(), (void *)marker, (int)geteuid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin))
        if (strncmp(line, "count", 5) == 0)
            print_counts();
    stop = 1;
    pthread_join(th, NULL);
    print_counts();
    free(marker);
    return 0;
}
