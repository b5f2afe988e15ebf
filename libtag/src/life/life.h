/* life.h - libtag's life in a process (this folder, the top layer): its
 * start (control.c), its threads' ends and the program's forks
 * (threads.c), and its attach to a process already running (attach.c).
 * These call into every folder below; nothing below calls them but
 * through the declarations base/control.h keeps for the start. */
#ifndef LIBTAG_LIFE_H
#define LIBTAG_LIFE_H

#include "base/base.h"

/* Once libc is up (libtag's constructor): the key whose destructor ends a
 * thread's life, and the fork handlers. */
TAG_COLD void _tag_threads_late_init(void);

#endif /* LIBTAG_LIFE_H */
