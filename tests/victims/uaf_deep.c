/* uaf_deep: a write after free deep inside a freed block, the shape of a
 * real bug - an object's "destroy" frees its struct, and the caller then
 * clears a field of it.
 *
 *   uaf_deep loop        a 1,160-byte struct freed by loop_destroy, then
 *                        loop_dealloc stores NULL (8 bytes) at offset 1128
 *   uaf_deep buffer OFF  a 4,096-byte block freed by buffer_destroy, then
 *                        buffer_release stores NULL (8 bytes) at OFF
 *
 * Prints block=, size= and address= (the first byte written) before the
 * write, then "survived" at its end.  Nothing else is freed after the
 * write: libtag finds it when the process exits and its quarantine is
 * checked.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct loop {
    char state[1128];
    void *owner;      /* offset 1128: what the caller clears */
    char tail[24];    /* 1,160 bytes in all */
};
_Static_assert(sizeof(struct loop) == 1160, "loop");

__attribute__((noinline)) static struct loop *loop_new(void)
{
    struct loop *l = malloc(sizeof *l);
    memset(l, 0x21, sizeof *l);
    l->owner = l;
    return l;
}

__attribute__((noinline)) static void loop_destroy(struct loop *l)
{
    free(l);
}

__attribute__((noinline)) static void loop_dealloc(struct loop *l)
{
    loop_destroy(l);
    printf("block=%p\nsize=%zu\naddress=%p\n", (void *)l, sizeof *l, (void *)&l->owner);
    fflush(stdout);
    *(void *volatile *)&l->owner = NULL;  /* the write after free */
}

__attribute__((noinline)) static char *buffer_new(void)
{
    char *b = malloc(4096);
    memset(b, 0x33, 4096);
    return b;
}

__attribute__((noinline)) static void buffer_destroy(char *b)
{
    free(b);
}

__attribute__((noinline)) static void buffer_release(char *b, size_t off)
{
    buffer_destroy(b);
    printf("block=%p\nsize=%d\naddress=%p\n", (void *)b, 4096, (void *)(b + off));
    fflush(stdout);
    *(void *volatile *)(b + off) = NULL;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "loop") == 0) {
        loop_dealloc(loop_new());
    } else if (argc >= 3 && strcmp(argv[1], "buffer") == 0) {
        size_t off = strtoul(argv[2], NULL, 0);
        if (off > 4096 - 8)
            return 2;
        buffer_release(buffer_new(), off);
    } else {
        fprintf(stderr, "usage: uaf_deep loop | buffer OFF\n");
        return 2;
    }
    printf("survived\n");
    return 0;
}
