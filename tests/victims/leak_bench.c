/* leak_bench.c - a big heap for timing the leak scan (docs/benchmarks.md),
 * not a test: N blocks of SIZE bytes (default 1,000,000 x 1000 B = 1 GB),
 *   half held by one pointer array (a wide graph),
 *   0.4 N in 4 linked lists whose heads are globals (long chains),
 *   0.1 N in one linked list whose head is dropped (a leak: 1 definite,
 *   the rest indirect).
 * Every block is filled with non-pointer bytes after its link.  Takes one
 * on-demand snapshot (raise(SIGUSR2)), then exits.
 *
 *   leak_bench [N [SIZE]]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct node {
    struct node *next;
};

void **table;
struct node *lists[4];

static struct node *make(size_t size, struct node *next)
{
    struct node *n = malloc(size);
    if (!n)
        abort();
    memset(n, 0x11, size);
    n->next = next;
    return n;
}

static void drop_list(size_t count, size_t size)
{
    struct node *head = NULL;
    for (size_t i = 0; i < count; i++)
        head = make(size, head);
    printf("leaked head %p\n", (void *)head);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000;
    size_t size = argc > 2 ? strtoul(argv[2], NULL, 10) : 1000;
    size_t wide = n / 2, chain = n * 4 / 10, lost = n - wide - chain;
    table = malloc(wide * sizeof *table);
    for (size_t i = 0; i < wide; i++)
        table[i] = make(size, NULL);
    for (size_t i = 0; i < chain; i++)
        lists[i % 4] = make(size, lists[i % 4]);
    drop_list(lost, size);
    printf("pid %d blocks %zu\n", getpid(), n + 1);
    fflush(stdout);
    raise(SIGUSR2);
    return 0;
}
