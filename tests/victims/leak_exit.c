/* leak_exit.c - a short-lived program that leaks (or not) and exits, for
 * `forensics run --leaks`.
 *
 *   leak_exit leak          lose_records(): 3 blocks of 100 B, every pointer
 *                           dropped (definite); lose_tree(): one 48 B node
 *                           holding two 40 B children, the node's pointer
 *                           dropped (1 definite, 2 indirect); keep_config():
 *                           64 B held by a global (reachable); return 0
 *   leak_exit clean CODE    allocates and frees everything; exit(CODE)
 *   leak_exit fork          the parent loses 3 x 100 B (lose_records) and
 *                           waits for its child; the child loses 2 x 30 B
 *                           (lose_in_child) and calls exit(0); parent returns 0
 *   leak_exit _exit CODE    loses 3 x 100 B, then _exit(CODE): no destructor
 *                           runs, so no exit snapshot
 *   leak_exit both          lose_records(), then frees one 24 B block twice
 *                           (an anomaly as well as leaks); return 0
 *   leak_exit thread        a worker thread still blocked in read(2) at exit
 *                           holds 56 B on its stack (reachable); main loses
 *                           3 x 100 B and returns 0 without joining it
 *
 * Prints "pid=N" and "block NAME ADDR SIZE [line=L]" per block (L: the
 * line of its malloc call) (the child prints its
 * own pid line); the losing functions print, main holds no pointer, and a
 * scrub of the dead stack below main's frame removes stale copies (a stale
 * pointer on the stack hides a leak from any conservative scan).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scrub.h"

#define NOINLINE __attribute__((noinline))

struct tree {
    void *left, *right;
    char pad[32];
};

void *config;  /* reachable through this global */
static int gate[2];
static pthread_barrier_t started;

NOINLINE static void lose_records(void)
{
    for (int i = 0; i < 3; i++) {
        char *p = malloc(100); int line = __LINE__;
        memset(p, 'r', 100);
        printf("block record %p 100 line=%d\n", (void *)p, line);
    }
}

NOINLINE static void lose_tree(void)
{
    struct tree *t = malloc(sizeof *t); int line = __LINE__;
    t->left = malloc(40);
    t->right = malloc(40);
    memset(t->pad, 0, sizeof t->pad);
    printf("block tree %p %zu line=%d\nblock tree-left %p 40 line=%d\n"
           "block tree-right %p 40 line=%d\n",
           (void *)t, sizeof *t, line, t->left, line + 1, t->right, line + 2);
}

NOINLINE static void keep_config(void)
{
    config = malloc(64);
    memset(config, 'c', 64);
    printf("block config %p 64\n", config);
}

NOINLINE static void lose_in_child(void)
{
    for (int i = 0; i < 2; i++) {
        char *p = malloc(30); int line = __LINE__;
        memset(p, 'k', 30);
        printf("block child %p 30 line=%d\n", (void *)p, line);
    }
}

NOINLINE static void churn(void)
{
    for (int i = 0; i < 100; i++)
        free(malloc(16 + (size_t)i));
}

static void *worker(void *arg)
{
    (void)arg;
    char *held = malloc(56);
    char c;
    memset(held, 'w', 56);
    printf("block held %p 56\n", (void *)held);
    fflush(stdout);
    pthread_barrier_wait(&started);
    if (read(gate[0], &c, 1) < 0)  /* nobody writes: blocked until exit */
        perror("read");
    __asm__ volatile("" : : "r"(held) : "memory");
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: leak_exit leak|clean CODE|fork|both|_exit CODE|thread\n");
        return 2;
    }
    const char *mode = argv[1];
    int code = argc > 2 ? atoi(argv[2]) : 0;
    printf("pid=%d\n", (int)getpid());
    churn();
    if (strcmp(mode, "leak") == 0) {
        lose_records();
        lose_tree();
        keep_config();
    } else if (strcmp(mode, "clean") == 0) {
        keep_config();
        free(config);
        config = NULL;
    } else if (strcmp(mode, "fork") == 0) {
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            printf("pid=%d\n", (int)getpid());
            lose_in_child();
            fflush(stdout);
            scrub();
            exit(0);
        }
        lose_records();
        fflush(stdout);
        waitpid(child, NULL, 0);
    } else if (strcmp(mode, "both") == 0) {
        lose_records();
        char *volatile twice = malloc(24);  /* volatile: gcc drops a malloc freed unused */
        free(twice);
        free(twice);
    } else if (strcmp(mode, "_exit") == 0) {
        lose_records();
        fflush(stdout);
        _exit(code);
    } else if (strcmp(mode, "thread") == 0) {
        pthread_t th;
        if (pipe(gate) < 0)
            return 1;
        pthread_barrier_init(&started, NULL, 2);
        pthread_create(&th, NULL, worker, NULL);
        pthread_barrier_wait(&started);
        lose_records();
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    fflush(stdout);
    scrub();
    return code;
}
