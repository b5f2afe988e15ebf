/* test_stack_table.c - the stack table alone (src/stacks/stack_table.h,
 * CMake's libtag_stack_table): a stack interned twice gets the same id
 * (through the thread's cache, through the table, from a signal handler's
 * path), different stacks get different ids, a stack's nodes lead back
 * through their parents to the root, the index grows under many nodes and
 * keeps every id, threads interning the same stacks at once agree on
 * every id, a full table ends a stack in a marker of what it lost, and the
 * per-stack counters count in the thread's shard. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "base/control.h"
#include "base/options.h"
#include "stacks/stack_table.h"
#include "stacks/thread.h"

#include "check.h"

static const struct libtag_stack_node *node(uint32_t id)
{
    CHECK(id < _tag_ctl.stack_count);
    return (const struct libtag_stack_node *)(uintptr_t)_tag_ctl.stack_nodes + id;
}

/* The pc of frame d of stack s: distinct for every (s, d). */
static uint64_t pc_of(uint32_t s, uint32_t d)
{
    return 0x400000u + (uint64_t)s * 0x10000u + (uint64_t)d * 16u + 5u;
}

/* Stack s, depth frames, interned outermost first: its id. */
static uint32_t intern_stack(struct tag_thread_state *t, uint32_t s, uint32_t depth)
{
    uint32_t id = 0;
    for (uint32_t d = 0; d < depth; d++)
        id = _tag_intern(t, id, TAG_FRAME_CALL, pc_of(s, d));
    return id;
}

static struct tag_thread_state self;

/* Interning: same stack, same id; the nodes are the frames, innermost
 * last, each pointing at its caller's prefix. */
static void same_stack_same_id(void)
{
    enum { DEPTH = 40 };
    uint32_t ids[DEPTH + 1] = {0};
    uint32_t before = _tag_ctl.stack_count;
    for (uint32_t d = 0; d < DEPTH; d++) {
        ids[d + 1] = _tag_intern(&self, ids[d], TAG_FRAME_CALL, pc_of(1, d));
        CHECK(ids[d + 1] != 0 && ids[d + 1] != ids[d]);
    }
    CHECK(_tag_ctl.stack_count == before + DEPTH);
    /* the parent chain, from the innermost node back to the root */
    uint32_t id = ids[DEPTH];
    for (uint32_t d = DEPTH; d > 0; d--) {
        CHECK(id == ids[d]);
        CHECK(node(id)->pc == pc_of(1, d - 1) && node(id)->kind == TAG_FRAME_CALL);
        id = node(id)->parent;
    }
    CHECK(id == 0);
    /* again: the thread's cache answers, nothing is added */
    CHECK(intern_stack(&self, 1, DEPTH) == ids[DEPTH]);
    /* again with the cache cleared: the table answers */
    memset(self.cache, 0, sizeof self.cache);
    CHECK(intern_stack(&self, 1, DEPTH) == ids[DEPTH]);
    /* and from a signal handler's path, no cache */
    uint32_t sid = 0;
    for (uint32_t d = 0; d < DEPTH; d++)
        sid = _tag_intern_signal(sid, TAG_FRAME_CALL, pc_of(1, d));
    CHECK(sid == ids[DEPTH]);
    CHECK(_tag_ctl.stack_count == before + DEPTH);
    CHECK(_tag_ctl.stack_full == 0);
}

/* Distinct stacks, distinct ids: another pc, the same pc under another
 * parent, the same pc and parent as another kind; a shared outer part is
 * shared. */
static void distinct_stacks_distinct_ids(void)
{
    uint32_t a = intern_stack(&self, 2, 10);
    uint32_t b = intern_stack(&self, 3, 10);
    CHECK(a != b);
    uint32_t outer = intern_stack(&self, 2, 9);
    CHECK(node(a)->parent == outer);
    uint32_t sibling = _tag_intern(&self, outer, TAG_FRAME_CALL, pc_of(2, 9) + 1);
    CHECK(sibling != a && node(sibling)->parent == outer);
    uint32_t other_parent = _tag_intern(&self, b, TAG_FRAME_CALL, pc_of(2, 9));
    CHECK(other_parent != a && node(other_parent)->parent == b);
    uint32_t entry = _tag_intern(&self, outer, TAG_FRAME_ENTRY, pc_of(2, 9));
    CHECK(entry != a && node(entry)->kind == TAG_FRAME_ENTRY);
    CHECK(_tag_intern(&self, outer, TAG_FRAME_CALL, pc_of(2, 9)) == a);
}

/* Many nodes: the index doubles several times (it starts at 4096 slots)
 * and every id is found again, unchanged, by the table. */
static void index_grows(void)
{
    enum { STACKS = 2000, DEPTH = 50 };  /* 100,000 nodes */
    static uint32_t ids[STACKS];
    uint32_t before = _tag_ctl.stack_count;
    for (uint32_t s = 0; s < STACKS; s++)
        ids[s] = intern_stack(&self, 100 + s, DEPTH);
    CHECK(_tag_ctl.stack_count == before + STACKS * DEPTH);
    memset(self.cache, 0, sizeof self.cache);
    for (uint32_t s = 0; s < STACKS; s++)
        CHECK(intern_stack(&self, 100 + s, DEPTH) == ids[s]);
    for (uint32_t s = 1; s < STACKS; s++)
        CHECK(ids[s] != ids[s - 1]);
    CHECK(_tag_ctl.stack_count == before + STACKS * DEPTH);
}

/* Threads interning the same new stacks at once, in different orders: one
 * node each, the same id in every thread. */
enum { RACE_THREADS = 4, RACE_STACKS = 500, RACE_DEPTH = 20 };
static uint32_t race_ids[RACE_THREADS][RACE_STACKS];

static void *racer(void *arg)
{
    uint32_t k = (uint32_t)(uintptr_t)arg;
    struct tag_thread_state *t = calloc(1, sizeof *t);
    CHECK(t != NULL);
    for (uint32_t i = 0; i < RACE_STACKS; i++) {
        uint32_t s = k % 2 ? RACE_STACKS - 1 - i : i;
        race_ids[k][s] = intern_stack(t, 10000 + s, RACE_DEPTH);
    }
    free(t);
    return NULL;
}

static void threads_agree(void)
{
    uint32_t before = _tag_ctl.stack_count;
    pthread_t th[RACE_THREADS];
    for (uint32_t k = 0; k < RACE_THREADS; k++)
        CHECK(pthread_create(&th[k], NULL, racer, (void *)(uintptr_t)k) == 0);
    for (uint32_t k = 0; k < RACE_THREADS; k++)
        CHECK(pthread_join(th[k], NULL) == 0);
    for (uint32_t s = 0; s < RACE_STACKS; s++)
        for (uint32_t k = 1; k < RACE_THREADS; k++)
            CHECK(race_ids[k][s] == race_ids[0][s]);
    CHECK(_tag_ctl.stack_count == before + RACE_STACKS * RACE_DEPTH);
    memset(self.cache, 0, sizeof self.cache);
    for (uint32_t s = 0; s < RACE_STACKS; s++)
        CHECK(intern_stack(&self, 10000 + s, RACE_DEPTH) == race_ids[0][s]);
}

/* The counters of a stack, in this thread's shard: two blocks allocated,
 * the newest freed before anything else (a temporary). */
static void counters(void)
{
    uint32_t id = intern_stack(&self, 4, 6);
    char a, b;
    _tag_stats_alloc(&self, id, 100, &a);
    _tag_stats_alloc(&self, id, 50, &b);
    _tag_stats_free(&self, id, 50, &b);
    struct libtag_stack_shard *s = _tag_shard_of(&self, id, 0, 0);
    CHECK(s != &self.shard_scratch);
    CHECK(s->allocs == 2 && s->live_bytes == 100 && s->temporaries == 1);
    _tag_stats_free(&self, id, 100, &a);  /* not the newest: no temporary */
    CHECK(s->live_bytes == 0 && s->temporaries == 1);
    /* another stack: another entry */
    uint32_t other = intern_stack(&self, 5, 6);
    _tag_stats_alloc(&self, other, 7, &a);
    CHECK(_tag_shard_of(&self, other, 0, 0) != s);
    CHECK(_tag_shard_of(&self, other, 0, 0)->allocs == 1);
}

/* A table of 1024 nodes (its own process): past the ordinary nodes a
 * stack's next frame is a TAG_FRAME_LOST marker under the frames the table
 * holds, the same marker each time, and frames further out stay on it. */
static void full_table(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        _tag_stack_table_init(1024);
        struct tag_thread_state *t = calloc(1, sizeof *t);
        CHECK(t != NULL);
        uint32_t id = 0, last = 0;
        for (uint32_t d = 0; d < 2000; d++) {
            uint32_t next = _tag_intern(t, id, TAG_FRAME_CALL, pc_of(7, d));
            if (node(next)->kind != TAG_FRAME_LOST)
                last = next;
            id = next;
        }
        CHECK(node(id)->kind == TAG_FRAME_LOST && node(id)->parent == last);
        CHECK(_tag_ctl.stack_count <= 1024 && _tag_ctl.stack_full > 0);
        CHECK(intern_stack(t, 7, 2000) == id);
        memset(t->cache, 0, sizeof t->cache);
        CHECK(intern_stack(t, 7, 2000) == id);
        /* the ordinary nodes held the outer frames, outermost first */
        uint32_t walk = last, n = 0;
        while (walk) {
            n++;
            walk = node(walk)->parent;
        }
        CHECK(n == 1024 - 16 - 1);  /* the ordinary nodes, the root aside */
        exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    full_table();
    _tag_opt.stack_stats = 1;
    _tag_stack_table_init(1u << 20);
    CHECK(_tag_ctl.stack_count == 1 && node(0)->parent == 0);
    same_stack_same_id();
    distinct_stacks_distinct_ids();
    index_grows();
    threads_agree();
    counters();
    printf("test_stack_table: %d checks passed\n", checks);
    return 0;
}
