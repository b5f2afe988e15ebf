/* ctor_main.c - linked with tests/victims/ctor_lib.c (libctor_lib.so):
 * prints the block its constructor allocated ("ctor ADDR SIZE"), its pid,
 * then raise(SIGUSR2) (an on-demand snapshot into $LIBTAG_DIR), exit 0. */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

extern void *g_ctor_block;

int main(void)
{
    printf("ctor %p 333\npid %d\n", g_ctor_block, (int)getpid());
    fflush(stdout);
    raise(SIGUSR2);
    return 0;
}
