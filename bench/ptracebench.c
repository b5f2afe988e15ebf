/* ptracebench.c - a plain process (no libtag) with a big live heap and
 * idle threads, for the pause of `forensics snapshot PID` by ptrace.
 *
 *   ptracebench GIB THREADS
 *
 * Allocates GIB GiB of live blocks of 512..1535 bytes (each written), starts
 * THREADS-1 more threads that wait in read() on a pipe, prints "ready", then
 * answers on stdin:
 *   fork   a bare fork(): prints "fork NS" (the parent's time in fork(); the
 *          child exits at once and is reaped)
 *   quit   exits
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int idle_pipe[2];

static void *idle_main(void *arg)
{
    (void)arg;
    char c;
    while (read(idle_pipe[0], &c, 1) > 0) {
    }
    return NULL;
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 1.0;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    size_t total = (size_t)(gib * (1u << 30));
    size_t count = total / 1024;
    void **all = malloc(count * sizeof *all);
    if (all == NULL || pipe(idle_pipe) != 0)
        return 1;
    unsigned x = 1;
    for (size_t i = 0; i < count; i++) {
        x = x * 1103515245u + 12345u;
        size_t n = 512 + (x >> 16) % 1024;
        all[i] = malloc(n);
        if (all[i] == NULL)
            return 1;
        memset(all[i], (int)(i & 0xff) | 1, n);
    }
    for (int i = 1; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, idle_main, NULL) != 0)
            return 1;
    }
    printf("ready %zu\n", count);
    fflush(stdout);
    char line[32];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "fork", 4) == 0) {
            long long t0 = now_ns();
            pid_t p = fork();
            if (p == 0)
                _exit(0);
            long long t1 = now_ns();
            waitpid(p, NULL, 0);
            printf("fork %lld\n", t1 - t0);
            fflush(stdout);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    return 0;
}
