/* buggy.c - a small program with a real double free, for the demo.
 *
 * A "session" is created, handed to a worker that frees it when done, and then
 * freed again by the cleanup path: the classic ownership mix-up.  Built with
 * -finstrument-functions, libtag records that session_new() allocated the
 * block, worker_finish() freed it, and cleanup() freed it again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct session {
    int id;
    char name[56];
};

static struct session *session_new(int id, const char *name)
{
    struct session *s = malloc(sizeof *s);
    if (!s)
        return NULL;
    s->id = id;
    snprintf(s->name, sizeof s->name, "%s", name);
    return s;
}

static void worker_finish(struct session *s)
{
    printf("worker: session %d (%s) done\n", s->id, s->name);
    free(s); /* the worker thinks it owns the session */
}

static void cleanup(struct session *s)
{
    free(s); /* ... and so does cleanup: double free */
}

int main(void)
{
    struct session *s = session_new(42, "player-one");
    if (!s)
        return 1;
    worker_finish(s);
    cleanup(s);
    puts("buggy: still running after the double free");
    return 0;
}
