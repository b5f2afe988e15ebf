"""Both heaps of a process libtag was attached to mid-life (forensics
attach): the blocks glibc handed out before the attach are glibc's chunks,
the ones after are libtag's tagged blocks.  One source over both, so every
answer sees one heap: an address is looked up in libtag's blocks, then in
glibc's chunks; the blocks, the pointer edges and the leak scan are both
kinds together (forensics.reader.dump.Dump.targets, ordered by address);
each block is answered by the source it came from.

libtag's heap region and tables lie in mappings of their own and glibc's
in its arenas and its chunks' own mappings, so a block is one source's or
the other's, never both.
"""

from __future__ import annotations

from forensics._np import np

from forensics.heaps.base import Place, Totals
from forensics.heaps.glibc import GlibcSource
from forensics.heaps.libtag import LibtagSource
from forensics.reader.dump import Dump
from forensics.reader.glibc_walk import Chunk

# What a chunk from before the attach cannot say (the "without_libtag"
# object of docs/json.md, for such a chunk).
BEFORE_ATTACH = {
    "unknown": ["allocation stacks", "free stacks", "allocation and free times",
                "allocating and freeing threads"],
    "hint": "the block was allocated before libtag was attached (forensics attach): "
            "only blocks allocated after the attach have them",
    "summary": "a block from before libtag was attached: its allocation and free stacks, "
               "times and threads are unknown",
}


class BothSource:
    kind = "libtag+glibc"
    tagged = True  # libtag's blocks carry stacks; a chunk says it has none (``without_of``)
    without = None
    # a freed libtag block stays in the quarantine: a pointer still into it
    # dangles; a free chunk's words are glibc's links (not asked: holds())
    freed_referrers = True
    # as libtag's: libtag's tables are clipped out by address; glibc's
    # arenas point only at chunks that are free or the top, none of them a
    # block the program holds
    skip_root_module = None

    def __init__(self, dump: Dump, libtag: LibtagSource, glibc: GlibcSource) -> None:
        self.dump = dump
        self.libtag = libtag
        self.glibc = glibc

    def _of(self, block) -> LibtagSource | GlibcSource:
        return self.glibc if isinstance(block, Chunk) else self.libtag

    @property
    def findings(self) -> list:
        return self.glibc.findings  # libtag's own are anomalies (reader/control.py)

    def block_at(self, addr: int):
        block = self.libtag.block_at(addr)
        return block if block is not None else self.glibc.block_at(addr)

    def near(self, addr: int):
        return self.libtag.near(addr)

    def blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        starts, sizes, live, _ = self.dump.targets
        return starts, sizes, live

    def tagged_mask(self) -> np.ndarray:
        """Which of blocks() are libtag's (the rest: glibc's chunks)."""
        return self.dump.targets[3]

    def totals(self) -> Totals:
        """The live blocks of both kinds (a chunk in use by its usable
        bytes); the freed ones of libtag's quarantine - glibc's free chunks
        are its cache of memory, not blocks the program freed lately (they
        are in glibc's own map: inspect's ``glibc``)."""
        a, b = self.libtag.totals(), self.glibc.totals()
        return Totals(live_blocks=a.live_blocks + b.live_blocks, live_bytes=a.live_bytes + b.live_bytes,
                      freed_blocks=a.freed_blocks, freed_bytes=a.freed_bytes)

    def place(self, block, addr: int) -> Place:
        place = self._of(block).place(block, addr)
        if isinstance(block, Chunk):
            return Place(place.region_name, place.note + ", from before libtag was attached",
                         place.damage)
        return place

    def holds(self, block) -> bool:
        return self._of(block).holds(block)

    def is_block(self, block) -> bool:
        return block is not None and self._of(block).is_block(block)

    def start_of(self, block) -> int:
        return self._of(block).start_of(block)

    def allocator_module(self, module: str | None) -> bool:
        return self.libtag.allocator_module(module) or self.glibc.allocator_module(module)

    def without_of(self, block) -> dict | None:
        """What this block cannot say: a chunk from before the attach has
        no stacks, times or threads."""
        return BEFORE_ATTACH if isinstance(block, Chunk) else None


__all__ = ["BEFORE_ATTACH", "BothSource"]
