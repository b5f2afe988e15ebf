/* uw_plugin.c - a shared library the uw_dlopen victim loads with dlopen()
 * after libtag has scanned the loaded modules: built -O2 -fPIC -shared
 * without frame pointers, so its frames can only be walked with its CFI.
 *
 * plugin_alloc(n): plugin_outer -> plugin_inner -> malloc.
 * plugin_call(fn, n): calls fn(n) back from two plugin frames down.
 */
#include <stdlib.h>

#define KEEP() __asm__ volatile("" ::: "memory")

__attribute__((noipa)) static void *plugin_inner(size_t n)
{
    void *p = malloc(n);
    KEEP();
    return p;
}

__attribute__((noipa)) static void *plugin_outer(size_t n)
{
    void *p = plugin_inner(n + 1);
    KEEP();
    return p;
}

__attribute__((noipa)) void *plugin_alloc(size_t n)
{
    void *p = plugin_outer(n + 1);
    KEEP();
    return p;
}

__attribute__((noipa)) static void *plugin_relay(void *(*fn)(size_t), size_t n)
{
    void *p = fn(n);
    KEEP();
    return p;
}

__attribute__((noipa)) void *plugin_call(void *(*fn)(size_t), size_t n)
{
    void *p = plugin_relay(fn, n);
    KEEP();
    return p;
}
