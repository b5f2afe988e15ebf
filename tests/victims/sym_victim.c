/* sym_victim.c - addresses with known names, files and lines, for
 * tests/integration/test_symbols.py.
 *
 * Prints, one "key value..." per line, then "ready", then waits for EOF on
 * stdin (so the test can read /proc/PID/maps or take a core while it runs):
 *
 *   pid PID
 *   fn NAME ADDR        entry address of sym_outer, sym_inner, main
 *   ret ADDR LINE       a return address inside sym_outer; LINE is the line
 *                       of the call that returns there
 *   libc NAME ADDR      address of a libc function (via dlsym, so a -no-pie
 *                       build does not hand us its own PLT stub)
 *
 * Built -O1 by the tests: noinline and the empty asm keep each function a
 * real, separate function with a real call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

static void *captured_ret;
static int captured_line;

__attribute__((noinline)) void sym_inner(void)
{
    captured_ret = __builtin_return_address(0);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void sym_outer(void)
{
    captured_line = __LINE__ + 1;
    sym_inner();
    __asm__ volatile("" ::: "memory"); /* the call above is not a tail call */
}

int main(void)
{
    char buf[64];

    sym_outer();
    printf("pid %d\n", (int)getpid());
    printf("fn sym_outer %#lx\n", (unsigned long)(uintptr_t)&sym_outer);
    printf("fn sym_inner %#lx\n", (unsigned long)(uintptr_t)&sym_inner);
    printf("fn main %#lx\n", (unsigned long)(uintptr_t)&main);
    printf("ret %#lx %d\n", (unsigned long)(uintptr_t)captured_ret, captured_line);
    printf("libc qsort %#lx\n", (unsigned long)(uintptr_t)dlsym(RTLD_DEFAULT, "qsort"));
    printf("libc getpid %#lx\n", (unsigned long)(uintptr_t)dlsym(RTLD_DEFAULT, "getpid"));
    printf("ready\n");
    fflush(stdout);
    while (read(0, buf, sizeof buf) > 0)
        ;
    return 0;
}
