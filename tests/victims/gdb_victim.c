/* gdb_victim.c - a small heap with known owners, for the gdb `tag` commands.
 *
 *   gdb_victim snap    builds the heap, then frees `twice` twice: under libtag
 *                      that double free takes a snapshot core and the program
 *                      runs on and exits 0
 *   gdb_victim wait    builds the heap, prints "ready pid=N", then waits for
 *                      stdin to close (for gdb -p and forensics snapshot)
 *   gdb_victim steps   builds the heap, stops in at_rest(1), frees the
 *                      session in session_end(), stops in at_rest(2): a gdb
 *                      breakpoint on at_rest sees the block live, then freed
 *
 * The heap (every function instrumented, so each block has its stack):
 *   g_session  48 bytes, from session_new, held by a global
 *   g_list     32-byte node from list_push, whose ->next is another 32-byte
 *              node from list_push: a heap referrer
 *   scratch    200 bytes from scratch_fill, freed by scratch_drop (quarantined)
 *   twice      24 bytes from twice_make (snap: freed twice by twice_free)
 *   a leak     64 bytes from leak_make, whose pointer is dropped at once
 * Their addresses are printed as "name=0x..." lines.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct node {
    struct node *next;
    long value[3];
};

struct session {
    int id;
    char name[44];
};

struct session *g_session;
struct node *g_list;

__attribute__((noinline)) static struct session *session_new(int id)
{
    struct session *s = malloc(sizeof *s);
    s->id = id;
    snprintf(s->name, sizeof s->name, "session-%d", id);
    return s;
}

__attribute__((noinline)) static void session_end(struct session *s)
{
    free(s);
}

__attribute__((noinline)) static struct node *list_push(struct node *head, long v)
{
    struct node *n = calloc(1, sizeof *n);
    n->next = head;
    n->value[0] = v;
    return n;
}

__attribute__((noinline)) static char *scratch_fill(void)
{
    char *p = malloc(200);
    memset(p, 'x', 200);
    return p;
}

__attribute__((noinline)) static void scratch_drop(char *p)
{
    free(p);
}

__attribute__((noinline)) static void *twice_make(void)
{
    return malloc(24);
}

__attribute__((noinline)) static void twice_free(void *p)
{
    free(p);
}

__attribute__((noinline)) static void leak_make(void)
{
    char *volatile p = malloc(64);
    memset(p, 'l', 64);
    p = NULL;
}

/* A breakpoint target: gdb stops here with the heap built. */
__attribute__((noinline)) void at_rest(int step)
{
    __asm__ volatile("" : : "r"(step) : "memory");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "wait";
    g_session = session_new(7);
    g_list = list_push(list_push(NULL, 1), 2);
    char *scratch = scratch_fill();
    scratch_drop(scratch);
    void *twice = twice_make();
    leak_make();
    printf("session=%p\nlist=%p\nlist_next=%p\nscratch=%p\ntwice=%p\n",
           (void *)g_session, (void *)g_list, (void *)g_list->next, (void *)scratch, twice);
    fflush(stdout);

    if (!strcmp(mode, "snap")) {
        twice_free(twice);
        twice_free(twice); /* double free: libtag snapshots and skips it */
        puts("after the double free");
        return 0;
    }
    if (!strcmp(mode, "steps")) {
        at_rest(1);
        session_end(g_session);
        at_rest(2);
        return 0;
    }
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0)
        ;
    return 0;
}
