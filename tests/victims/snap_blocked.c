/* snap_blocked.c - blocks both signals an on-demand snapshot can come by
 * (libtag's request signal SIGRTMAX-1 and LIBTAG_SIGNAL's default SIGUSR2)
 * with sigprocmask in every thread, so one can never start; waits for stdin
 * to close, then prints "alive" and exits 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGRTMAX - 1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    free(malloc(32));
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin))
        ;
    printf("alive\n");
    return 0;
}
