"""The heaps a process's memory holds, behind one interface (``HeapSource``,
forensics/heaps/base.py) that every answer reads:

    heap = heap_of(dump)            # the source the answers read
    heap.block_at(addr)             # the block (or glibc chunk) holding addr
    heap.blocks()                   # (starts, sizes, live) of every block, sorted
    heap.totals()                   # live and freed blocks and bytes
    heap.findings                   # what is inconsistent in the allocator's records
    heap.place(block, addr)         # what that block is, in a sentence

Two sources implement it: libtag's tagged blocks (forensics/heaps/libtag.py,
over the block index of forensics/reader/heap.py) and glibc's chunks
(forensics/heaps/glibc.py, over the walk of forensics/reader/glibc_walk.py
with the layout of forensics/reader/glibc_layout.py).  A dump lists the
sources it holds (``sources``): one today; a process libtag was attached
to mid-life holds both, glibc's for the blocks from before and libtag's for
the ones after, and each answers for its own blocks.

The walks stay in the reader because the Dump derives its pointer edges
and caches from their arrays; this layer is what the answers see of them.
"""

from __future__ import annotations

from forensics.heaps.base import HeapSource, Place, Totals
from forensics.heaps.glibc import GlibcSource
from forensics.heaps.libtag import LibtagSource
from forensics.reader.dump import Dump

def sources(dump: Dump) -> tuple[HeapSource, ...]:
    """The heaps dump holds, each once per dump: libtag's when its control
    block is there, else glibc's.  Kept on the dump itself: a table keyed
    by dumps whose values (the sources) hold their dumps would keep every
    dump, and its core's open file and mapping, for the life of the
    process (the fuzz tests, which run the verbs in one process, ran out
    of descriptors)."""
    found = dump.__dict__.get("_heap_sources")
    if found is None:
        found = dump.__dict__["_heap_sources"] = (
            (LibtagSource(dump),) if dump.libtag else (GlibcSource(dump),))
    return found


def heap_of(dump: Dump) -> HeapSource:
    """The heap the answers read in dump (its only one today)."""
    return sources(dump)[0]


__all__ = ["GlibcSource", "HeapSource", "LibtagSource", "Place", "Totals", "heap_of", "sources"]
