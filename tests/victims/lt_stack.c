/* lt_stack.c - the allocation stack of a block made three calls deep.
 *
 * main (or, with argument "thread", a thread's start routine) calls level1
 * -> level2 -> level3 -> malloc.  The victim prints the block's
 * alloc_stack frames ("frame <kind> 0x<pc>", innermost first, see
 * lt_print_stack) and, after free, the free stack the same way.  Built
 * -no-pie by the test so the pcs are addresses in this file's functions,
 * which the test names with addr2line.
 *
 * Built without -finstrument-functions it proves the frame-pointer
 * fallback; with it, the shadow stack.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "lt_reader.c"

static void *block;

/* noipa: no inlining, cloning or sibling calls - each level is a real frame. */
__attribute__((noipa)) static void *level3(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");  /* a call that is not in tail position */
    return p;
}

__attribute__((noipa)) static void *level2(size_t n)
{
    void *p = level3(n + 1);
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noipa)) static void *level1(size_t n)
{
    void *p = level2(n + 1);
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noipa)) static void free_level2(void *p)
{
    free(p);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noipa)) static void free_level1(void *p)
{
    free_level2(p);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noipa)) static void report(void)
{
    const struct libtag_tag *t = lt_tag(block);
    if (!t) {
        printf("tag invalid\n");
        return;
    }
    printf("alloc size=%llu\n", (unsigned long long)lt_size(t));
    lt_print_stack(t->alloc_stack);
    free_level1(block);
    const struct libtag_free_rec *f = lt_free_rec(block);
    if (!f) {
        printf("free record invalid\n");
        return;
    }
    printf("free\n");
    lt_print_stack(f->free_stack);
}

__attribute__((noipa)) static void *thread_main(void *arg)
{
    block = level1((size_t)arg);
    __asm__ volatile("" ::: "memory");
    return NULL;
}

/* "forkthread": a thread forks, and the child (whose one thread runs on
 * that thread's stack) makes the block and reports. */
__attribute__((noipa)) static void *fork_thread_main(void *arg)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        block = level1((size_t)arg);
        report();
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child status=%d\n", status);
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "forkthread") == 0) {
        pthread_t th;
        pthread_create(&th, NULL, fork_thread_main, (void *)(size_t)40);
        pthread_join(th, NULL);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "thread") == 0) {
        pthread_t th;
        pthread_create(&th, NULL, thread_main, (void *)(size_t)40);
        pthread_join(th, NULL);
    } else {
        block = level1(40);
    }
    report();
    return 0;
}
