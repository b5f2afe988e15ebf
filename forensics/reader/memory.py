"""The one interface every reader of a process's memory offers.

The heap reader and the answers read memory only through ``Memory``:

    read(addr, n) -> bytes        n bytes at a virtual address, or a
                                  forensics.core.CoreReadError (UnmappedError ...)
    regions() -> list[Region]     the mappings, sorted by address
    name: str                     what the memory is, for messages ("core /x/core")
    cache_key: tuple | None       identity of a file behind it (size, mtime_ns),
                                  None when there is nothing stable to key a cache on

Adapters: CoreMemory (a forensics.core.Core: zero-copy views of the mmap'ed
file), forensics.reader.live.LiveMemory (a running process through /proc/PID/mem),
and later a gdb-backed one.  Keep this module free of libtag knowledge.
"""

from __future__ import annotations

import os
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from forensics.core import Core
from forensics.core.elf import PF_R


class Region:
    """One mapping: [start, end), its flags, the file behind it, and its bytes.

    ``array`` is a uint8 numpy array of the readable bytes from ``start``; it may
    be shorter than end - start (a core that left the tail out).  It is built on
    first use (zero-copy for a core, read once for a live process) and kept.
    """

    __slots__ = ("start", "end", "writable", "path", "_array", "_load")

    def __init__(
        self,
        start: int,
        end: int,
        writable: bool,
        path: str | None,
        array: np.ndarray | None = None,
        load: Callable[[], np.ndarray] | None = None,
    ) -> None:
        self.start = start
        self.end = end
        self.writable = writable
        self.path = path
        self._array = array
        self._load = load

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = self._load() if self._load is not None else np.empty(0, np.uint8)
        return self._array

    @property
    def size(self) -> int:
        return self.end - self.start

    def __contains__(self, addr: int) -> bool:
        return self.start <= addr < self.end

    def __repr__(self) -> str:
        w = "rw" if self.writable else "r-"
        return f"<Region {self.start:#x}-{self.end:#x} {w} {self.path or 'anonymous'}>"


@runtime_checkable
class Memory(Protocol):
    name: str

    def read(self, addr: int, n: int) -> bytes: ...

    def regions(self) -> list[Region]: ...

    @property
    def cache_key(self) -> tuple[int, int] | None: ...


class CoreMemory:
    """Memory of a forensics.core.Core; region arrays are views of its mmap."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.name = f"core {core.path}"
        self._regions: list[Region] | None = None

    def read(self, addr: int, n: int) -> bytes:
        return self.core.read(addr, n)

    def regions(self) -> list[Region]:
        if self._regions is None:
            core = self.core
            self._regions = [
                Region(
                    seg.vaddr,
                    seg.end,
                    seg.writable,
                    seg.path,
                    load=(lambda s=seg: core.segment_array(s)),
                )
                for seg in core.segments
                if seg.flags & PF_R
            ]
        return self._regions

    @property
    def cache_key(self) -> tuple[int, int] | None:
        """(size, mtime_ns) of the core file."""
        try:
            st = os.stat(self.core.path)
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns)


def clip_regions(regions: list[Region], exclude: list[tuple[int, int]]) -> list[Region]:
    """The parts of regions outside the [start, end) ranges in exclude, as
    Regions whose arrays are views of the originals (no copy)."""
    exclude = sorted((s, e) for s, e in exclude if e > s)
    out: list[Region] = []
    for r in regions:
        pieces = [(r.start, r.end)]
        for s, e in exclude:
            nxt = []
            for a, b in pieces:
                if e <= a or s >= b:
                    nxt.append((a, b))
                    continue
                if a < s:
                    nxt.append((a, s))
                if e < b:
                    nxt.append((e, b))
            pieces = nxt
        if pieces == [(r.start, r.end)]:
            out.append(r)
            continue
        for a, b in pieces:
            out.append(Region(a, b, r.writable, r.path,
                              load=(lambda r=r, a=a, b=b: r.array[a - r.start:b - r.start])))
    return out


__all__ = ["CoreMemory", "Memory", "Region", "clip_regions"]
