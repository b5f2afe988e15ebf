/* rev_cases MODE: heap and signal corner cases libtag must get right.
 *   bigfree     double free of a 4 MiB block (glibc munmaps it on free)
 *   ignfpe      SIGFPE ignored, then kill(getpid(), SIGFPE): must survive
 *   resethand   a SIGSEGV handler installed with SA_RESETHAND that returns:
 *               the fault repeats and must kill the process (handler once)
 *   stale       snapshot with a worker alive, join it, snapshot again
 *   zero        malloc(0), print it, snapshot */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile int calls;

static void on_segv(int sig)
{
    (void)sig;
    calls++;
    static const char msg[] = "handler\n";
    write(1, msg, sizeof msg - 1);
}

static volatile int go;

static void *worker(void *arg)
{
    free(malloc(32));
    while (!go)  /* alive until the first snapshot is taken */
        usleep(1000);
    return arg;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (strcmp(mode, "bigfree") == 0) {
        char *volatile p = malloc(4 << 20);
        printf("address=%p\n", (void *)p);
        free(p);
        free(p);
    } else if (strcmp(mode, "ignfpe") == 0) {
        signal(SIGFPE, SIG_IGN);
        kill(getpid(), SIGFPE);
    } else if (strcmp(mode, "resethand") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_segv;
        sa.sa_flags = SA_RESETHAND;
        sigaction(SIGSEGV, &sa, NULL);
        *(volatile int *)16 = 1;
        puts("not reached");
    } else if (strcmp(mode, "stale") == 0) {
        pthread_t t;
        pthread_create(&t, NULL, worker, NULL);
        usleep(100000);
        raise(SIGUSR2);
        go = 1;
        pthread_join(t, NULL);
        usleep(100000);
        raise(SIGUSR2);
    } else if (strcmp(mode, "zero") == 0) {
        char *volatile z = malloc(0);
        printf("address=%p\n", (void *)z);
        raise(SIGUSR2);
    }
    puts("survived");
    return 0;
}
