"""glibc's heap as a heap source, for a process that never ran libtag: its
chunks (forensics/reader/glibc_walk.py), each with its state, bin and
arena, and the inconsistencies the walk found.  Who allocated or freed a
block, when and from which stack is unknown (``without``), with how to
have it: ``forensics run``."""

from __future__ import annotations

import os

from forensics._np import np

from forensics.heaps.base import Place, Totals
from forensics.reader.dump import Dump
from forensics.reader.glibc_walk import Chunk, Finding, GlibcHeap, S

UNKNOWN_WITHOUT_LIBTAG = ("no libtag: allocation and free stacks, times and threads are unknown - "
                          "run the program under `forensics run` for them")

# What a heap without tags cannot say (docs/json.md, "Without libtag").
WITHOUT_LIBTAG = {
    "unknown": ["allocation stacks", "free stacks", "allocation and free times",
                "allocating and freeing threads"],
    "hint": "run the program under `forensics run` (libtag) to have them",
    "summary": UNKNOWN_WITHOUT_LIBTAG,
}

# The states of a free chunk that is on one of glibc's lists: the blocks
# counted as free (a "free" chunk on no list is not counted).
LISTED_FREE = ("tcache", "fastbin", "unsorted", "smallbin", "largebin")

_STATE_WORDS = {"inuse": "a block in use", "tcache": "a free block in a tcache",
                "fastbin": "a free block in a fastbin", "unsorted": "a free block in the unsorted bin",
                "smallbin": "a free block in a small bin", "largebin": "a free block in a large bin",
                "top": "the top chunk (never allocated)", "mmapped": "an mmapped block in use",
                "free": "a free chunk on no list", "damaged": "a chunk whose header is damaged"}


def is_libc(module: str) -> bool:
    """glibc's own module: its state (arenas, mp_) holds pointers into chunks
    (the top chunk, bins) that are not the program's references."""
    return os.path.basename(module).startswith(("libc.so", "libc-"))


class GlibcSource:
    kind = "glibc"
    tagged = False
    without = WITHOUT_LIBTAG
    # a free chunk's words are glibc's list links, not the program's pointers
    freed_referrers = False
    skip_root_module = staticmethod(is_libc)

    def __init__(self, dump: Dump) -> None:
        self.dump = dump

    @property
    def heap(self) -> GlibcHeap:
        """glibc's heap, walked at first use (a GlibcError when it cannot be)."""
        return self.dump.glibc

    @property
    def findings(self) -> list[Finding]:
        return self.heap.findings

    def block_at(self, addr: int) -> Chunk | None:
        return self.heap.chunk_at(addr)

    def near(self, addr: int) -> None:
        return None  # a chunk's neighbour is a chunk: there is no gap to be near

    def blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        starts, sizes = self.dump.glibc_blocks
        return starts, sizes, np.ones(len(starts), bool)

    def free_mask(self) -> np.ndarray:
        """The chunks free on one of glibc's lists."""
        return np.isin(self.heap.state, [S[s] for s in LISTED_FREE])

    def totals(self) -> Totals:
        heap = self.heap
        live = (heap.state == S["inuse"]) | (heap.state == S["mmapped"])
        free = self.free_mask()
        return Totals(live_blocks=int(live.sum()), live_bytes=int(heap.usable(live).sum()),
                      freed_blocks=int(free.sum()), freed_bytes=int(heap.usable(free).sum()))

    def place(self, chunk: Chunk, addr: int) -> Place:
        arena = chunk.arena
        name = "heap" if arena is None or arena.main else f"heap of thread arena {arena.address:#x}"
        if chunk.state == "mmapped":
            name = "mmapped chunk"
        return Place(name, chunk_note(chunk, addr))

    def holds(self, chunk: Chunk) -> bool:
        return chunk.state in ("inuse", "mmapped")

    def is_block(self, chunk: Chunk | None) -> bool:
        """A chunk that is (or was) a block the program had: not the top."""
        return chunk is not None and chunk.state != "top"

    def start_of(self, chunk: Chunk) -> int:
        return chunk.user

    def allocator_module(self, module: str | None) -> bool:
        return module is not None and is_libc(module)


def chunk_note(c: Chunk, addr: int) -> str:
    """What an address in chunk c is, for whoowns."""
    off = addr - c.user
    where = (f"{off} bytes into" if off >= 0 else f"{-off} bytes before the user bytes of")
    return (f"{where} {_STATE_WORDS[c.state]} of {c.usable} usable bytes "
            f"(glibc chunk {c.start:#x}, {c.size} bytes)")


__all__ = ["LISTED_FREE", "UNKNOWN_WITHOUT_LIBTAG", "WITHOUT_LIBTAG", "GlibcSource", "chunk_note", "is_libc"]
