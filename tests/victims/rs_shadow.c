/* rs_shadow.c - a thread whose stack an unwinder cannot walk to its end:
 * it parks in read() under park_nocfi, assembly with no CFI whose rbp holds
 * the bytes "key" instead of a frame pointer.  Built with
 * -finstrument-functions, so libtag's shadow stack knows the instrumented
 * callers above it (shadow_b, shadow_a, worker).  Prints "thread <tid>",
 * then main takes a snapshot (libtag_snapshot) and exits.
 *
 * Its stack, innermost first: read (libc), park_read, park_nocfi,
 * shadow_b, shadow_a, worker, start_thread, clone3.  The CFI walk ends at
 * park_nocfi; the shadow stack gives shadow_b (its entry: the call inside
 * it went through park_nocfi, whose return address no hook saw), then
 * shadow_a and worker, with the lines of their calls.
 */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "rs_park.h"

extern int libtag_snapshot(void) __attribute__((weak));

static int fds[2];
static volatile pid_t tid;

void park_read(void)
{
    char c;
    tid = rs_gettid();
    while (read(fds[0], &c, 1) < 0)
        ;
}

/* park_nocfi: no CFI, rbp = "key" while it calls park_read */
void park_nocfi(void);
__asm__(".text\n"
        ".globl park_nocfi\n"
        ".type park_nocfi, @function\n"
        "park_nocfi:\n"
        "  push %rbp\n"
        "  mov $0x79656b, %rbp\n"
        "  call park_read\n"
        "  pop %rbp\n"
        "  ret\n"
        ".size park_nocfi, .-park_nocfi\n");

__attribute__((noinline)) void shadow_b(void)
{
    park_nocfi();
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void shadow_a(void)
{
    shadow_b();
    __asm__ volatile("" ::: "memory");
}

void *worker(void *arg)
{
    shadow_a();
    return arg;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (pipe(fds) != 0)
        return 1;
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    while (!tid)
        rs_nap();
    rs_wait_in_read(tid);
    printf("thread %d\n", (int)tid);
    if (libtag_snapshot)
        libtag_snapshot();
    if (write(fds[1], "x", 1) != 1)
        return 1;
    pthread_join(th, NULL);
    return 0;
}
