/* fd_table.c - a program that looks at its own descriptor table, the way
 * daemons and test suites do, around an anomaly libtag reports.
 *
 *   fd_table list            print "start FDS" (every open descriptor, from
 *                            /proc/self/fd), make a double free, print
 *                            "after FDS"
 *   fd_table closefrom FILE  close every descriptor from 3 up (closefrom),
 *                            open FILE and dup2 it onto 3..255 (every number
 *                            libtag ever used for itself), make a double
 *                            free, print "after FDS"
 *
 * Prints "freed twice ADDR pid=N" after the double free; exits 0.  With
 * FD_TABLE_BARE set (a run without libtag, where glibc would abort) it
 * frees once.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void print_fds(const char *label)
{
    int fds[1024], n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        exit(3);
    int own = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 1024) {
        if (e->d_name[0] == '.')
            continue;
        int fd = atoi(e->d_name);
        if (fd != own)
            fds[n++] = fd;
    }
    closedir(d);
    for (int i = 1; i < n; i++)  /* insertion sort: a handful */
        for (int j = i; j > 0 && fds[j - 1] > fds[j]; j--) {
            int t = fds[j];
            fds[j] = fds[j - 1];
            fds[j - 1] = t;
        }
    printf("%s", label);
    for (int i = 0; i < n; i++)
        printf("%s%d", i ? "," : " ", fds[i]);
    printf("\n");
    fflush(stdout);
}

static void double_free(void)
{
    char *volatile p = malloc(40);
    free(p);
    if (!getenv("FD_TABLE_BARE"))
        free(p);
    printf("freed twice %p pid=%d\n", (void *)p, (int)getpid());
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    free(malloc(8));  /* libtag starts here, if not before */
    if (strcmp(argv[1], "list") == 0) {
        print_fds("start");
        double_free();
        print_fds("after");
    } else if (strcmp(argv[1], "closefrom") == 0 && argc == 3) {
        closefrom(3);
        int file = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (file != 3)
            return 3;
        for (int fd = 4; fd < 256; fd++)
            if (dup2(file, fd) != fd)
                return 4;
        double_free();
        for (int fd = 4; fd < 256; fd++)
            close(fd);
        print_fds("after");
    } else {
        return 2;
    }
    return 0;
}
