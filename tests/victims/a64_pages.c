/* a64_pages.c - libtag's guard pool on the system's page size
 * (tests/integration/test_aarch64_shadow.py runs it under qemu with 4 and
 * 64 KiB pages, every block guarded: LIBTAG_GUARD_RATE=1,
 * LIBTAG_ON_ANOMALY=ignore).
 *
 * It reads libtag's control block from inside (lt_reader.c) and prints:
 *   page P / control S      sysconf's page size, control.page_size
 *   slot N                  control.guard_slot_size
 *   first A / third B       the offsets from the guard pool's start of
 *                           the first and third of three blocks of 40
 *                           bytes: right-aligned in slots 0 and 2, each
 *                           slot a guard page, a slot and a guard page
 *                           after the one before
 *   uaf K T V               a read of the third block after free, caught
 *                           at the instruction: the anomaly's kind and
 *                           access, and the byte read (libtag's free
 *                           pattern, once it opened the slot)
 *   overflow K T            a write one byte past the first block (in the
 *                           guard page after its slot): kind and access
 *   survived
 */
#include <stdlib.h>
#include <unistd.h>

#include "lt_reader.c"

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct libtag_control *c = lt_ctl();
    if (!c) {
        printf("no-libtag\n");
        return 0;
    }
    /* the second keeps the slots apart: a slot whose fault libtag handled
     * stays open, with the guard pages beside it */
    char *volatile first = malloc(40), *volatile second = malloc(40), *volatile third = malloc(40);
    printf("page %ld\ncontrol %u\nslot %u\n", sysconf(_SC_PAGESIZE), c->page_size, c->guard_slot_size);
    printf("first %llu\nthird %llu\n", (unsigned long long)((uintptr_t)first - c->guard_pool),
           (unsigned long long)((uintptr_t)third - c->guard_pool));
    free(third);
    int value = ((volatile unsigned char *)third)[0];  /* after free */
    __asm__ volatile("" ::: "memory");  /* the anomaly is read after the fault */
    printf("uaf %u %u %d\n", c->anomaly.kind, c->anomaly.access, value);
    ((volatile char *)first)[48] = 1;  /* past the slot's end: its guard page */
    __asm__ volatile("" ::: "memory");
    printf("overflow %u %u\n", c->anomaly.kind, c->anomaly.access);
    free(second);
    printf("survived\n");
    return 0;
}
