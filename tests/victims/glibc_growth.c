/* glibc_growth.c - a process that never runs libtag and whose heap changes
 * between two points where it waits, for diff of two cores without libtag.
 *
 * At "ready 1": 30 blocks of 72 bytes live.  Then 5 of them are freed and 10
 * blocks of 1000 bytes are allocated; at "ready 2" it waits again.  (72 and
 * 1000 are glibc usable sizes as they are: chunks of 80 and 1008 bytes.)
 * With the argument "leak", 3 blocks of 200 bytes (chunks of 208) are also
 * allocated (before the 1000-byte ones, so the arena's top pointer is not
 * at the end of one of them) and their pointers dropped: lost for good.
 * Prints "pid N", then "ready 1" and "ready 2", each time waiting for a
 * line on stdin before going on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile small[30];
static void *volatile big[10];
static void *volatile sink;

static void wait_line(int n)
{
    char line[16];
    printf("ready %d\n", n);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        exit(1);
}

int main(int argc, char **argv)
{
    printf("pid %d\n", (int)getpid());
    for (int i = 0; i < 30; i++)
        small[i] = malloc(72);
    wait_line(1);
    for (int i = 0; i < 5; i++)
        free(small[i]);
    if (argc > 1 && strcmp(argv[1], "leak") == 0) {
        for (int i = 0; i < 3; i++)
            sink = malloc(200);
        sink = NULL;
    }
    for (int i = 0; i < 10; i++)
        big[i] = malloc(1000);
    wait_line(2);
    return 0;
}
