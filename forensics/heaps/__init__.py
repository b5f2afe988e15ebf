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
sources it holds (``sources``); a process libtag was attached to mid-life
holds both, glibc's for the blocks from before and libtag's for the ones
after, and ``heap_of`` gives them as one (forensics/heaps/both.py) in which
each block is answered by its own source.

The walks stay in the reader because the Dump derives its pointer edges
and caches from their arrays; this layer is what the answers see of them.
"""

from __future__ import annotations

from forensics.heaps.base import HeapSource, Place, Totals
from forensics.heaps.both import BothSource
from forensics.heaps.glibc import GlibcSource
from forensics.heaps.libtag import LibtagSource
from forensics.reader.dump import Dump

def sources(dump: Dump) -> tuple[HeapSource, ...]:
    """The heaps dump holds, each once per dump: libtag's when its control
    block is there, and glibc's beside it when glibc holds chunks in use
    (libtag was attached mid-life: Dump.glibc); else glibc's alone.  Kept
    on the dump itself: a table keyed
    by dumps whose values (the sources) hold their dumps would keep every
    dump, and its core's open file and mapping, for the life of the
    process (the fuzz tests, which run the verbs in one process, ran out
    of descriptors)."""
    found = dump.__dict__.get("_heap_sources")
    if found is None:
        if not dump.libtag:
            found = (GlibcSource(dump),)
        elif dump.glibc is not None:
            found = (LibtagSource(dump), GlibcSource(dump))
        else:
            found = (LibtagSource(dump),)
        dump.__dict__["_heap_sources"] = found
    return found


def heap_of(dump: Dump) -> HeapSource:
    """The heap the answers read in dump: its one source, or both as one
    (forensics/heaps/both.py)."""
    found = dump.__dict__.get("_heap_of")
    if found is None:
        srcs = sources(dump)
        found = dump.__dict__["_heap_of"] = srcs[0] if len(srcs) == 1 else BothSource(dump, *srcs)
    return found


__all__ = ["BothSource", "GlibcSource", "HeapSource", "LibtagSource", "Place", "Totals", "heap_of", "sources"]
