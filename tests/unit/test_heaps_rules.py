"""The heap interface's rules: every source answers the whole interface, and
a libtag dump is read through libtag's source.

GIVEN the two heap sources (forensics/heaps/: libtag's and glibc's) and a fake
libtag process (tests/fakes.py) with one live and one freed block
WHEN the answers ask a dump for its heap (forensics.heaps.heap_of)
THEN each source has every member HeapSource names, and the libtag dump's
source says the blocks, totals and places its block index holds.
"""

from __future__ import annotations

import forensics_test_fakes as F

from forensics import heaps
from forensics.heaps.base import HeapSource
from forensics.heaps.glibc import GlibcSource
from forensics.heaps.libtag import LibtagSource


def members() -> set[str]:
    names = set(HeapSource.__annotations__)
    names |= {n for n, v in vars(HeapSource).items() if callable(v) and not n.startswith("_")}
    return names


def test_every_source_has_every_member_of_the_interface():
    want = {"kind", "tagged", "without", "findings", "freed_referrers", "skip_root_module",
            "block_at", "near", "blocks", "totals", "place", "holds", "is_block", "start_of",
            "allocator_module"}
    assert members() == want
    for source in (LibtagSource, GlibcSource):
        missing = sorted(n for n in want if not hasattr(source, n))
        assert missing == [], source.__name__


def test_a_libtag_dump_is_read_through_libtags_source():
    proc = F.FakeProcess()
    live = proc.block(0x40, size=24, time=5)
    freed = proc.block(0x100, size=48, freed=(0, 7, 50))
    dump = F.dump(proc)
    heap = heaps.heap_of(dump)
    assert (heap.kind, heap.tagged, heap.without) == ("libtag", True, None)
    assert heaps.sources(dump) == (heap,)
    assert heap.totals() == heaps.Totals(live_blocks=1, live_bytes=24, freed_blocks=1, freed_bytes=48)
    starts, sizes, live_mask = heap.blocks()
    assert (starts.tolist(), sizes.tolist(), live_mask.tolist()) == ([live, freed], [24, 48], [True, False])
    block = heap.block_at(live + 4)
    assert (heap.start_of(block), heap.holds(block), heap.is_block(block)) == (live, True, True)
    assert heap.place(block, live + 4) == heaps.Place("heap", "4 bytes into a live block of 24 bytes")
    assert heap.holds(heap.block_at(freed)) is False
