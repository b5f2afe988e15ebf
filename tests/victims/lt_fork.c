/* lt_fork.c - a program that forks and keeps allocating in both processes.
 *
 *   lt_fork simple    parent makes a block, forks once; parent and child
 *                     each run ROUNDS of malloc/realloc/free, checking
 *                     every tag; the child also frees the parent's block.
 *   lt_fork fromthread  a thread (not main) forks; the child checks its
 *                     record (pid, tid, stack bound) and allocates.
 *   lt_fork threads   two threads allocate without pause (with new stacks
 *                     all the time) while main forks FORKS times; every
 *                     child allocates from its one thread and from a new
 *                     thread of its own, checks its tags and exits 0.
 *
 * Every child sets alarm(CHILD_ALARM): a child that deadlocks dies of
 * SIGALRM and the parent reports "signal 14" instead of hanging.
 * Output lines are "<who> <what>=<value>"; see test_libtag_fork.py.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "lt_reader.c"

#define ROUNDS 5000
#define FORKS 30
#define CHILD_ALARM 30

/* Allocate and free ROUNDS blocks, checking each tag names this thread;
 * returns the number of blocks whose tag was wrong. */
static unsigned churn(unsigned rounds, unsigned salt)
{
    unsigned bad = 0;
    uint32_t me = lt_gettid();
    void *keep[16] = {0};
    for (unsigned i = 0; i < rounds; i++) {
        size_t n = (i * 37 + salt) % 700;
        unsigned char *p = (i & 1) ? malloc(n) : calloc(1, n);
        if (!p) { bad++; continue; }
        memset(p, (int)(i & 0xff), n);
        const struct libtag_tag *t = lt_tag(p);
        if (!t || lt_state(t) != TAG_STATE_LIVE || lt_size(t) != n || !lt_tid_is(t, me))
            bad++;
        if (i % 7 == 0) {
            p = realloc(p, n + 100);
            t = lt_tag(p);
            if (!t || lt_size(t) != n + 100 || !lt_tid_is(t, me))
                bad++;
        }
        unsigned slot = i % 16;
        free(keep[slot]);
        keep[slot] = p;
    }
    for (unsigned s = 0; s < 16; s++)
        free(keep[s]);
    return bad;
}

/* ------------------------------------------------------------- simple */

static int simple(void)
{
    unsigned char *before = malloc(123);
    memset(before, 0x77, 123);
    pid_t parent = getpid();
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        alarm(CHILD_ALARM);
        const struct libtag_control *c = lt_ctl();
        const struct libtag_tag *t = lt_tag(before);
        printf("child pid_updated=%d\n", c->pid == (uint32_t)getpid());
        printf("child inherited_tag_ok=%d from_parent=%d content=%d\n",
               t != NULL && lt_state(t) == TAG_STATE_LIVE && lt_size(t) == 123,
               t ? lt_tid_is(t, (uint32_t)parent) : 0, before[122] == 0x77);
        struct libtag_stats s0, s1;
        libtag_stats(&s0);
        free(before);
        /* read the quarantined block's tag (not its payload) */
        const struct libtag_tag *ft = lt_tag(before);
        printf("child inherited_freed_state=%u\n", ft ? lt_state(ft) : 0);
        unsigned bad = churn(ROUNDS, 1);
        libtag_stats(&s1);
        const struct libtag_thread *r = lt_record(lt_gettid());
        printf("child bad_tags=%u\n", bad);
        printf("child record_found=%d\n", r != NULL);
        printf("child anomalies=%u\n", s1.anomalies);
        printf("child live_blocks_delta=%lld\n", (long long)(s1.live_blocks - s0.live_blocks));
        printf("child done\n");
        fflush(stdout);
        _exit(0);
    }
    unsigned bad = churn(ROUNDS, 2);
    int status = 0;
    waitpid(child, &status, 0);
    const struct libtag_tag *t = lt_tag(before);
    printf("parent block_still_live=%d content=%d\n",
           t != NULL && lt_state(t) == TAG_STATE_LIVE, before[0] == 0x77);
    free(before);
    struct libtag_stats s;
    libtag_stats(&s);
    printf("parent bad_tags=%u\n", bad);
    printf("parent anomalies=%u\n", s.anomalies);
    printf("parent pid_kept=%d\n", lt_ctl()->pid == (uint32_t)getpid());
    printf("parent child_status=%s%d\n", WIFEXITED(status) ? "exit" : "signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return 0;
}

/* --------------------------------------------------------- fromthread */

/* Does the calling thread's record bound its stack: a local variable lies
 * below stack_hi, and within the 8 MiB default stack of it. */
static int stack_bound_ok(void)
{
    char local;
    const struct libtag_thread *r = lt_record(lt_gettid());
    uintptr_t here = (uintptr_t)&local;
    return r && r->stack_hi > here && r->stack_hi - here < ((uintptr_t)8 << 20);
}

static void *forking_thread(void *arg)
{
    (void)arg;
    void *volatile v = malloc(10);   /* registered before it forks */
    free(v);
    printf("thread stack_bound_ok=%d\n", stack_bound_ok());
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        alarm(CHILD_ALARM);
        const struct libtag_thread *r = lt_record(lt_gettid());
        printf("child pid_updated=%d\n", lt_ctl()->pid == (uint32_t)getpid());
        printf("child record_found=%d tid_is_pid=%d\n", r != NULL,
               lt_gettid() == (uint32_t)getpid());
        printf("child stack_bound_ok=%d\n", stack_bound_ok());
        printf("child bad_tags=%u\n", churn(ROUNDS, 4));
        printf("child done\n");
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("parent child_status=%s%d\n", WIFEXITED(status) ? "exit" : "signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return NULL;
}

static int fromthread(void)
{
    printf("main stack_bound_ok=%d\n", stack_bound_ok());
    pthread_t th;
    pthread_create(&th, NULL, forking_thread, NULL);
    pthread_join(th, NULL);
    return 0;
}

/* ------------------------------------------------------------ threads */

static volatile int stop;
static unsigned long worker_rounds[2];
static unsigned worker_bad[2];

/* Recursion to a varying depth: the allocation stacks keep changing, so
 * stack-table inserts (and their lock) race with fork() too. */
__attribute__((noipa)) static unsigned deep(unsigned depth, unsigned salt)
{
    if (depth == 0)
        return churn(8, salt);
    unsigned r = deep(depth - 1, salt + 1);
    __asm__ volatile("" ::: "memory");
    return r;
}

static void *allocator(void *arg)
{
    long k = (long)arg;
    unsigned long i = 0;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        worker_bad[k] += deep((unsigned)(i % 40), (unsigned)i);
        i++;
    }
    worker_rounds[k] = i;
    return NULL;
}

static void *child_thread(void *arg)
{
    (void)arg;
    return (void *)(uintptr_t)churn(2000, 3);
}

static int threads(void)
{
    pthread_t th[2];
    for (long k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, allocator, (void *)k);
    unsigned clean = 0;
    for (int f = 0; f < FORKS; f++) {
        /* let the allocators run a while between forks */
        unsigned bad = churn(500, (unsigned)f);
        fflush(stdout);
        pid_t child = fork();
        if (child < 0) {
            perror("fork");
            return 1;
        }
        if (child == 0) {
            alarm(CHILD_ALARM);
            int code = 0;
            if (lt_ctl()->pid != (uint32_t)getpid())
                code |= 1;
            if (churn(2000, 5) != 0)
                code |= 2;
            pthread_t t;
            void *res = (void *)1;
            if (pthread_create(&t, NULL, child_thread, NULL) != 0 ||
                pthread_join(t, &res) != 0 || res != NULL)
                code |= 4;
            struct libtag_stats s;
            libtag_stats(&s);
            if (s.anomalies != 0)
                code |= 8;
            _exit(code);
        }
        int status = 0;
        waitpid(child, &status, 0);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && bad == 0)
            clean++;
        else
            printf("fork %d: %s %d, parent bad %u\n", f,
                   WIFEXITED(status) ? "exit" : "signal",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), bad);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    struct libtag_stats s;
    libtag_stats(&s);
    printf("parent clean_children=%u of %d\n", clean, FORKS);
    printf("parent workers_ran=%d\n", worker_rounds[0] > 0 && worker_rounds[1] > 0);
    printf("parent worker_bad_tags=%u\n", worker_bad[0] + worker_bad[1]);
    printf("parent anomalies=%u\n", s.anomalies);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "fromthread") == 0)
        return fromthread();
    if (argc > 1 && strcmp(argv[1], "threads") == 0)
        return threads();
    return simple();
}
