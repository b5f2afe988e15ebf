"""libtag's heap as a heap source: the tagged blocks of the block index
(forensics/reader/heap.py), each with its allocation and free stacks,
times and threads."""

from __future__ import annotations

from forensics._np import np

from forensics.heaps.base import Place, Totals
from forensics.reader import abi
from forensics.reader.dump import Dump
from forensics.reader.model import Block


class LibtagSource:
    kind = "libtag"
    tagged = True
    without = None
    findings: list = []  # libtag reports what it found as anomalies (reader/control.py)
    # a freed block stays in the quarantine: a pointer still into it dangles
    freed_referrers = True
    skip_root_module = None  # libtag's own data is clipped out by address (Control.own_ranges)

    def __init__(self, dump: Dump) -> None:
        self.dump = dump

    @property
    def heap(self):
        """The block index (forensics.reader.heap.Heap), read at first use."""
        return self.dump.heap

    def block_at(self, addr: int) -> Block | None:
        return self.heap.block_at(addr)

    def near(self, addr: int) -> tuple[Block, int] | None:
        return self.heap.near(addr)

    def blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = self.heap.index
        return idx["start"], idx["size"], idx["state"] == abi.TAG_STATE_LIVE

    def totals(self) -> Totals:
        return self.heap.totals

    def place(self, block: Block, addr: int) -> Place:
        guarded = "guarded " if block.guarded else ""
        note = f"{addr - block.start} bytes into a {block.state} {guarded}block of {block.size} bytes"
        damage = self.heap.freed_damage(block)
        if damage is not None:
            off, written = damage
            note += (f"; written after it was freed, from offset {off}"
                     + (f" (bytes {written.hex()})" if written else "") + ": a use-after-free")
        return Place("heap", note, damage)

    def holds(self, block: Block) -> bool:
        return block.state == "live"

    def is_block(self, block: Block | None) -> bool:
        return block is not None

    def start_of(self, block: Block) -> int:
        return block.start

    def allocator_module(self, module: str | None) -> bool:
        return module == self.dump.libtag_module


__all__ = ["LibtagSource"]
