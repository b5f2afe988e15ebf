/* modules.h - the loaded modules' executable segments and their CFI
 * (modules.c), kept for the walks and the CFI interpreter. */
#ifndef LIBTAG_MODULES_H
#define LIBTAG_MODULES_H

#include <stdint.h>
#include "base/base.h"

struct tag_module {
    uintptr_t lo, hi;            /* one executable segment [lo, hi) */
    uintptr_t eh_hdr;            /* its object's .eh_frame_hdr; 0 = none */
    uintptr_t data_lo, data_hi;  /* the PT_LOAD holding it: bounds CFI reads */
};

void _tag_modules_init(void);    /* constructor: the first scan */
void _tag_modules_allow(void);   /* start-up: scans from now on */
void _tag_modules_atfork_child(void);
/* Copy the module holding pc to *out; 0 if none.  may_rescan (normal
 * context only): rescan with dl_iterate_phdr when pc is in no known one. */
int _tag_module_find(uintptr_t pc, struct tag_module *out, int may_rescan);
/* Bracket reads of module memory (code bytes, CFI) so that dlclose() waits
 * for them; 0 = a dlclose is under way, read nothing. */
int _tag_modules_enter(void);
void _tag_modules_leave(void);
extern uint32_t _tag_code_gen;   /* bumped whenever the module list changes */

#endif /* LIBTAG_MODULES_H */
