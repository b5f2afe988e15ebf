/* damage.h - a tag that does not validate (damage.c): what damaged it,
 * reported, and repaired where it can be. */
#ifndef LIBTAG_DAMAGE_H
#define LIBTAG_DAMAGE_H

#include <stdint.h>
#include "base/base.h"

enum tag_damage {
    TAG_DAMAGE_NONE     = 0,  /* nothing explains it; nothing reported */
    TAG_DAMAGE_KNOWN    = 1,  /* explained and reported; the tag stays
                                 damaged (size unknown): leak the chunk */
    TAG_DAMAGE_REPAIRED = 2,  /* reported; the tag is restored, marked
                                 TAG_FLAG_REPORTED, in its state (live or
                                 freed): go on with it */
};
/* Undo damage to the last bytes of a tag (an underflow of up to 4 bytes hits
 * only pad, which is 0 or an alignment minus 32): on success *t is the
 * original tag and 1 is returned; otherwise *t is unchanged. */
TAG_COLD int _tag_recover(uint64_t tag_addr, struct libtag_tag *t);
/* A pointer whose tag does not validate reached free(), realloc(), or the
 * end of the quarantine: find what damaged the tag and report it - an
 * overflow of the block before (once: not again if it was reported), or an
 * underflow of this one - or say nothing explains it.  rec: its free record
 * when it is known to be a quarantined block, else NULL.  Reports, never
 * leaks: the caller keeps the chunk from glibc.  Rare path. */
TAG_COLD enum tag_damage _tag_damaged(void *user, const struct libtag_free_rec *rec,
                                      void *ret, void *frame);
/* Count a chunk deliberately never handed back to the real allocator. */
TAG_COLD void _tag_leak_damaged(uint64_t bytes);

#endif /* LIBTAG_DAMAGE_H */
