/* uw_dlopen.c - allocations through a module loaded with dlopen() after
 * libtag started (its unwinder must rescan the module list to find it),
 * then through the same module unloaded and loaded again.  Same protocol
 * as uw_stacks.c: `marker` around each marked allocation, then
 * "stack <marker> <pc>..." lines.  argv[1]: the plugin (uw_plugin.c).
 *
 *   1  plugin_alloc: the plugin's own chain, then main
 *   2  plugin_call: the plugin calls back into the victim, which allocates
 *   3  plugin_alloc again after dlclose() and a second dlopen()
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "lt_reader.c"

#define MARKERS 4
#define KEEP() __asm__ volatile("" ::: "memory")
volatile int marker;
static void *blocks[MARKERS];

__attribute__((noipa)) static void *callback(size_t n)
{
    void *p = malloc(n);
    KEEP();
    return p;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!lt_ctl() || argc < 2) {
        printf("no-libtag\n");
        return 0;
    }
    free(malloc(1));  /* captures before the plugin exists */
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    void *(*alloc)(size_t) = (void *(*)(size_t))dlsym(h, "plugin_alloc");
    void *(*call)(void *(*)(size_t), size_t) =
        (void *(*)(void *(*)(size_t), size_t))dlsym(h, "plugin_call");
    marker = 1;
    blocks[1] = alloc(100);
    marker = 2;
    blocks[2] = call(callback, 200);
    marker = 0;
    dlclose(h);
    h = dlopen(argv[1], RTLD_NOW);
    alloc = (void *(*)(size_t))dlsym(h, "plugin_alloc");
    marker = 3;
    blocks[3] = alloc(300);
    marker = 0;
    for (int m = 1; m < MARKERS; m++)
        lt_print_marked_stack(m, blocks[m]);
    return 0;
}
