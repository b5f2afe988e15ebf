/* heap_damage.c - one write where it must not go, of the kind named by argv:
 *
 *   underflow           p[-1] = 0x41 on a live 40-byte block, then free(p)
 *   underflow-exit      p[-1] = 0x41, never freed; the program just exits
 *   overflow-neighbour  100 bytes past the end of a 64-byte block p, into
 *                       the 64-byte block q right after it (the next slot
 *                       of the same size class); then free(p),
 *                       free(q) (or q first with "overflow-neighbour q-first")
 *   overflow-kept       8 bytes past the end of a 64-byte block that is
 *                       never freed; the program just exits
 *   uaf OFF WHO CHURN   free a 120-byte block, then write 0x5a at offset
 *                       OFF into it: WHO = "same" (the freeing thread
 *                       writes), "other" (another thread writes), "worker"
 *                       (a worker thread allocates and frees it, main
 *                       writes, then the worker exits); CHURN = "evict"
 *                       (enough frees after it to push it out of a 4 KiB
 *                       quarantine) or "none"
 *   uaf-snapshot OFF    free, write at OFF, then libtag_snapshot(); exit
 *
 * Prints what it knows as "key=value" lines before the misuse: block=,
 * size=, tid= (the allocating thread), free_tid= (the freeing thread),
 * neighbour=, address= (the first byte it damaged), and "survived" at the
 * end; exits 0.  The functions that allocate and free are named for the
 * stacks: alloc_victim, free_victim, alloc_neighbour, free_neighbour.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "overwrite.h"

extern int libtag_snapshot(void) __attribute__((weak));

static unsigned tid(void)
{
    return (unsigned)syscall(SYS_gettid);
}

static void say(const char *key, const void *p)
{
    printf("%s=%p\n", key, p);
    fflush(stdout);
}

__attribute__((noinline)) static char *alloc_victim(size_t n)
{
    char *p = malloc(n);
    memset(p, 1, n);
    return p;
}

__attribute__((noinline)) static char *alloc_neighbour(size_t n)
{
    char *p = malloc(n);
    memset(p, 2, n);
    return p;
}

__attribute__((noinline)) static void free_victim(char *p)
{
    free(p);
}

__attribute__((noinline)) static void free_neighbour(char *p)
{
    free(p);
}

/* Enough frees of other blocks to push the victim out of the quarantine
 * (run with LIBTAG_QUARANTINE=4096). */
__attribute__((noinline)) static void churn(void)
{
    for (int i = 0; i < 256; i++) {
        char *volatile q = malloc(64);  /* volatile: gcc drops free(malloc()) */
        free(q);
    }
}

static void write_at(char *p, long off)
{
    char *volatile dangling = p;
    dangling[off] = 0x5a;
}

struct uaf {
    char *p;
    long off;
    int fds[2];  /* worker: "freed" to main */
    int go[2];   /* main to worker: "written" */
};

__attribute__((noinline)) static void *writer(void *arg)
{
    struct uaf *u = arg;
    write_at(u->p, u->off);
    return NULL;
}

__attribute__((noinline)) static void *worker(void *arg)
{
    struct uaf *u = arg;
    char c = 0;
    u->p = alloc_victim(120);
    printf("size=120\ntid=%u\nfree_tid=%u\n", tid(), tid());
    say("block", u->p);
    free_victim(u->p);
    if (write(u->fds[1], "f", 1) != 1 || read(u->go[0], &c, 1) != 1)
        abort();
    return NULL;  /* the thread exits: its quarantine is checked */
}

__attribute__((noinline)) static void uaf(long off, const char *who, const char *churning)
{
    struct uaf u = {.off = off};
    if (!strcmp(who, "worker")) {
        pthread_t th;
        char c;
        if (pipe(u.fds) || pipe(u.go) || pthread_create(&th, NULL, worker, &u) ||
            read(u.fds[0], &c, 1) != 1)
            abort();
        say("address", u.p + off);
        write_at(u.p, off);
        if (write(u.go[1], "w", 1) != 1)
            abort();
        pthread_join(th, NULL);
        return;
    }
    u.p = alloc_victim(120);
    printf("size=120\ntid=%u\nfree_tid=%u\n", tid(), tid());
    say("block", u.p);
    free_victim(u.p);
    say("address", u.p + off);
    if (!strcmp(who, "other")) {
        pthread_t th;
        if (pthread_create(&th, NULL, writer, &u))
            abort();
        pthread_join(th, NULL);
    } else {
        write_at(u.p, off);
    }
    if (!strcmp(churning, "evict"))
        churn();
}

int main(int argc, char **argv)
{
    const char *kind = argc > 1 ? argv[1] : "";
    if (!strcmp(kind, "underflow") || !strcmp(kind, "underflow-exit")) {
        char *p = alloc_victim(40);
        printf("size=40\ntid=%u\n", tid());
        say("block", p);
        say("address", p - 1);
        char *volatile q = p;
        q[-1] = 0x41;
        if (!strcmp(kind, "underflow"))
            free_victim(p);
    } else if (!strcmp(kind, "overflow-neighbour")) {
        char *p = alloc_victim(64);
        char *q = alloc_neighbour(64);
        printf("size=64\ntid=%u\n", tid());
        say("block", p);
        say("neighbour", q);
        say("address", p + 64);
        overwrite(p + 64, 0x42, 100);
        print_written(p + 64, 8);
        if (argc > 2 && !strcmp(argv[2], "q-first")) {
            free_neighbour(q);
            free_victim(p);
        } else {
            free_victim(p);
            free_neighbour(q);
        }
        churn();  /* p leaves the quarantine: libtag must not give it back */
    } else if (!strcmp(kind, "overflow-kept")) {
        char *p = alloc_victim(64);
        char *q = alloc_neighbour(64);
        printf("size=64\ntid=%u\n", tid());
        say("block", p);
        say("address", p + 64);
        overwrite(p + 64, 0x43, 8);
        print_written(p + 64, 8);
        (void)q;
    } else if (!strcmp(kind, "uaf") && argc > 4) {
        uaf(strtol(argv[2], NULL, 0), argv[3], argv[4]);
    } else if (!strcmp(kind, "uaf-snapshot") && argc > 2) {
        uaf(strtol(argv[2], NULL, 0), "same", "none");
        if (!libtag_snapshot || libtag_snapshot() != 0)
            abort();
    } else {
        fprintf(stderr, "usage: heap_damage KIND ...\n");
        return 2;
    }
    printf("survived\n");
    return 0;
}
