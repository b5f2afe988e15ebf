/* snap_secret: a block holds a secret; the snapshot (LIBTAG_PAYLOAD decides)
 * must or must not carry it.  Prints the block's address; argv[1] "crash"
 * then dereferences NULL instead of exiting. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The secret is computed straight into the block: no copy of it exists in
 * the binary, on the stack or anywhere else, so finding its bytes in a core
 * means the block's payload is there.  Byte i is SECRET_BYTE(i). */
#define SECRET_BYTE(i) ("KQZXJVWPMB"[((i) * 7 + 3) % 10])

__attribute__((noinline)) static char *store_secret(void)
{
    char *p = malloc(4096 * 3);  /* spans whole pages: both blanking paths */
    for (size_t i = 0; i < 4096 * 3; i++)
        p[i] = SECRET_BYTE(i);
    return p;
}

int main(int argc, char **argv)
{
    char *volatile p = store_secret();
    printf("address=%p\n", (void *)p);
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "crash") == 0)
        *(volatile int *)0 = 1;
    raise(SIGUSR2);
    puts(p[0] == SECRET_BYTE(0) && p[4096 * 3 - 1] == SECRET_BYTE(4096 * 3 - 1) ? "intact" : "changed");  /* the parent's copy is untouched */
    return 0;
}
