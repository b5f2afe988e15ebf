/* lt_tags.c - every allocation function hands out a tagged block, and free
 * turns the tag to "freed" with a free record naming this thread.
 *
 * Prints "no-libtag" and exits 0 when libtag is absent (the weak control
 * symbol is NULL).  Otherwise one "<fn> tag ..." line per function (see
 * lt_print_tag), "<fn> freed ..." after freeing it, and the counters.
 */
#include <malloc.h>
#include <stdlib.h>

#include "lt_reader.c"

static void after_free(const char *label, void *p)
{
    const struct libtag_tag *t = lt_tag(p);
    const struct libtag_free_rec *f = lt_free_rec(p);
    printf("%s freed tag_ok=%d state=%u free_rec_ok=%d free_tid_self=%d free_stack_set=%d\n",
           label, t != NULL, t ? lt_state(t) : 0, f != NULL,
           f ? f->free_tid == lt_gettid() : 0, f ? f->free_stack != 0 : 0);
}

static void check(const char *label, void *p, size_t align)
{
    lt_print_tag(label, p);
    const struct libtag_tag *t = lt_tag(p);
    printf("%s aligned=%d pad=%ld usable=%zu\n", label, (uintptr_t)p % align == 0,
           t ? lt_pad(t) : 0, malloc_usable_size(p));
    free(p);
    /* The block waits in the quarantine (1 MiB per thread by default), so
     * its tag and free record are still there to read. */
    after_free(label, p);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct libtag_control *c = lt_ctl();
    if (!c) {
        printf("no-libtag\n");
        return 0;
    }
    printf("control magic=%.16s self_ok=%d abi=%u tag_size=%u pid_ok=%d\n", c->magic,
           c->self == (uint64_t)(uintptr_t)c, c->abi_version, c->tag_size,
           c->pid == (uint32_t)getpid());
    struct libtag_stats s0, s1;
    libtag_stats(&s0);

    void *p;
    check("malloc", malloc(100), 16);
    check("malloc0", malloc(0), 16);
    check("calloc", calloc(10, 30), 16);
    p = malloc(40);
    check("realloc", realloc(p, 1000), 16);
    p = malloc(40);
    check("reallocarray", reallocarray(p, 7, 9), 16);
    check("memalign", memalign(64, 100), 64);
    check("aligned_alloc", aligned_alloc(256, 512), 256);
    p = NULL;
    int rc = posix_memalign(&p, 128, 300);
    printf("posix_memalign rc=%d\n", rc);
    check("posix_memalign", p, 128);
    check("valloc", valloc(123), 4096);
    check("pvalloc", pvalloc(123), 4096);

    libtag_stats(&s1);
    /* 11 blocks checked + 2 realloc'd away; the printf buffer (line
     * buffered stdout) was allocated before s0. */
    printf("stats allocs=%llu frees=%llu live_blocks=%llu live_bytes=%lld anomalies=%u\n",
           (unsigned long long)(s1.allocs - s0.allocs),
           (unsigned long long)(s1.frees - s0.frees),
           (unsigned long long)s1.live_blocks - (unsigned long long)s0.live_blocks,
           (long long)(s1.live_bytes - s0.live_bytes), s1.anomalies);
    const struct libtag_thread *r = lt_record(lt_gettid());
    printf("record found=%d shadow_set=%d\n", r != NULL, r ? r->shadow != 0 : 0);
    return 0;
}
