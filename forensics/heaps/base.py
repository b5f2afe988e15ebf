"""What every heap source gives the answers (forensics/heaps/__init__.py).

A block is what the allocator handed the program: a tagged block
(forensics.reader.model.Block) or a glibc chunk
(forensics.reader.glibc_walk.Chunk).  A source says which blocks there are
and where, what each one is, the totals, and the inconsistencies it found
in its allocator's records; what it cannot know (who allocated a block,
when) it says in ``without``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from forensics._np import np

from forensics.reader.heap import Totals


@dataclass(frozen=True)
class Place:
    """What a block holding an address is: the name of the region it is in
    (``heap``, ``mmapped chunk``...), a sentence for people, and for a freed
    block written after it was freed, (offset, bytes written)."""

    region_name: str
    note: str
    damage: tuple[int, bytes | None] | None = None


class HeapSource(Protocol):
    kind: str  # "libtag" | "glibc": whose records the blocks come from
    tagged: bool  # its blocks carry allocation and free stacks, times and threads
    without: dict | None  # what this heap cannot say, and how to have it (docs/json.md)
    findings: list  # inconsistencies found in the allocator's records
    freed_referrers: bool  # whether who points into a freed block is asked (a dangling pointer)
    # a module whose data is no root of the leak scan and retention (glibc's
    # own libc), or None
    skip_root_module: Callable[[str], bool] | None

    def block_at(self, addr: int) -> Any | None:
        """The block whose bytes hold addr, or None."""

    def near(self, addr: int) -> tuple[Any, int] | None:
        """(block, n) when addr is n bytes past the end of a block."""

    def blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, sizes, live mask) of every block, sorted by start: the
        targets of the pointer edges and the leak scan's blocks."""

    def totals(self) -> Totals:
        """The live blocks and bytes, and the freed (free) ones."""

    def place(self, block: Any, addr: int) -> Place:
        """What block is, as seen from addr inside it."""

    def holds(self, block: Any) -> bool:
        """Whether block is one the program holds (live, in use): its
        referrers and retainers are asked for."""

    def is_block(self, block: Any | None) -> bool:
        """Whether block (block_at's answer) is one the program had: not
        glibc's top chunk, which was never handed out."""

    def start_of(self, block: Any) -> int:
        """The pointer the program was given for block (a chunk's user bytes)."""

    def allocator_module(self, module: str | None) -> bool:
        """Whether a word in module's data is the allocator's own (libtag's
        tables, glibc's arenas), not a reference of the program's."""


__all__ = ["HeapSource", "Place", "Totals"]
