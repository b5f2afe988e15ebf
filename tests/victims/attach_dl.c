/* Attach against a library's own table of allocator functions and a
 * plugin found through the program's RUNPATH (tests/integration/
 * test_attach.py builds both libraries and links this with -ltbl and
 * RUNPATH $ORIGIN/lib).
 *
 * Prints "ready", then on stdin:
 *   table    a block from malloc, released through libtbl's table (a
 *            pointer to free stored in its data at load: an R_X86_64_64
 *            relocation): prints "released"
 *   plugin   dlopen("libplug.so") by its bare name: "plugin 42" when found
 *            (through $ORIGIN/lib) and called, else "plugin none: ERROR"
 *   quit     exits 0
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tbl_release(void *p);

int main(void)
{
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "table", 5) == 0) {
            void *p = malloc(100);
            memset(p, 't', 100);
            tbl_release(p);
            printf("released\n");
        } else if (strncmp(line, "plugin", 6) == 0) {
            void *h = dlopen("libplug.so", RTLD_NOW);
            int (*answer)(void) = h ? (int (*)(void))dlsym(h, "plug_answer") : NULL;
            if (answer)
                printf("plugin %d\n", answer());
            else
                printf("plugin none: %s\n", dlerror());
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        }
        fflush(stdout);
    }
    return 0;
}
