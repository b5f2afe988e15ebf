/* snap_idle: allocates a little, then sits in read(2) on stdin without
 * allocating, so libtag has no allocation to piggyback reaping on. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char *volatile keep;

int main(void)
{
    keep = malloc(64);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0)
        ;
    puts("done");
    return 0;
}
