/* log_fds.c - a program that does to its descriptors what real programs do,
 * then makes libtag say something (a double free, with
 * LIBTAG_ON_ANOMALY=ignore: one log line, and the program runs on).
 *
 *   log_fds reuse-2 FILE    close(2), open FILE (it gets fd 2), double free
 *   log_fds closefrom FILE  close every fd from 3 up, open FILE once for each
 *                           number that was open, so every old number now
 *                           names FILE; double free
 *   log_fds wait            print "ready pid=N", wait for a line on stdin,
 *                           double free
 *   log_fds fork            fork; parent and child each double free; the
 *                           parent waits for the child; prints "child=N"
 *
 * Prints "freed twice ADDR pid=N" after each double free and exits 0.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void double_free(void)
{
    char *volatile p = malloc(24);
    free(p);
    free(p);
    printf("freed twice %p pid=%d\n", (void *)p, (int)getpid());
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    free(malloc(8));  /* libtag starts here, if not before */
    if (strcmp(argv[1], "reuse-2") == 0) {
        close(2);
        int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd != 2)
            return 3;
        double_free();
    } else if (strcmp(argv[1], "closefrom") == 0) {
        int was_open[1024] = {0};
        for (int fd = 3; fd < 1024; fd++)
            if (fcntl(fd, F_GETFD) >= 0) {
                was_open[fd] = 1;
                close(fd);
            }
        int file = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (file < 0)
            return 3;
        for (int fd = 3; fd < 1024; fd++)
            if (was_open[fd] && fd != file)
                dup2(file, fd);
        double_free();
    } else if (strcmp(argv[1], "wait") == 0) {
        char line[16];
        printf("ready pid=%d\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 3;
        double_free();
    } else if (strcmp(argv[1], "fork") == 0) {
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            double_free();
            exit(0);
        }
        waitpid(child, NULL, 0);
        printf("child=%d\n", (int)child);
        double_free();
    } else {
        return 2;
    }
    return 0;
}
