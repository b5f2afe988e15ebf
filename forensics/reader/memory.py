"""The one interface every reader of a process's memory offers.

The heap reader and the answers read memory only through ``Memory``:

    read(addr, n) -> bytes        n bytes at a virtual address, or a
                                  forensics.core.CoreReadError (UnmappedError ...)
    regions() -> list[Region]     the mappings, sorted by address
    name: str                     what the memory is, for messages ("core /x/core")
    cache_key: tuple | None       identity of a file behind it (size, mtime_ns),
                                  None when there is nothing stable to key a cache on

Adapters: CoreMemory (a forensics.core.Core: zero-copy views of the mmap'ed
file), forensics.reader.live.LiveMemory (a running process through /proc/PID/mem)
and forensics.gdb.commands.GdbMemory (the inferior gdb holds, through
Inferior.read_memory).  Keep this module free of libtag knowledge.
"""

from __future__ import annotations

import os
import re
from typing import Callable, NamedTuple, Protocol, runtime_checkable

from forensics._np import np

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


# ------------------------------------------------------- naming mappings --

_DELETED = " (deleted)"
_SYSV = re.compile(r"^/SYSV([0-9a-fA-F]{8})$")

# What a mapping is (Mapping.kind), and the one name every answer gives it:
#   "module"       globals of NAME        a module's .data or .bss
#   "heap"         heap                   the brk heap, or a mapping holding
#                                         tagged blocks (libtag's heap)
#   "sysv-shm"     SysV shared memory (key 0xKEY)   shmget + shmat
#   "posix-shm"    POSIX shared memory /NAME        shm_open + mmap
#   "memfd"        memfd:NAME             memfd_create + mmap
#   "shared-anon"  shared anonymous mapping   mmap MAP_SHARED|MAP_ANONYMOUS,
#                                         or of /dev/zero
#   "file"         the file's path        any other file mapped
#   "special"      [vdso], [vvar], [stack] ...  the kernel's own names
#   "anonymous"    anonymous mapping      mmap MAP_PRIVATE|MAP_ANONYMOUS
# A thread's stack ("stack of thread N") and libtag's guard pool ("libtag's
# guard pool") are known only from the threads and libtag's control block:
# the answers name them (forensics.answers.owners).


class Mapping(NamedTuple):
    kind: str
    name: str
    module: str | None = None  # for "module": the module's path


def _shared_memory(path: str) -> Mapping | None:
    """The shared-memory kinds, by the name the kernel gives the mapping."""
    bare = path[:-len(_DELETED)] if path.endswith(_DELETED) else path
    m = _SYSV.match(bare)
    if m:
        return Mapping("sysv-shm", f"SysV shared memory (key {int(m.group(1), 16):#x})")
    if bare.startswith("/memfd:"):
        return Mapping("memfd", bare[1:])
    if bare.startswith("/dev/shm/"):
        return Mapping("posix-shm", f"POSIX shared memory {bare[len('/dev/shm'):]}")
    if bare == "/dev/zero":
        return Mapping("shared-anon", "shared anonymous mapping")
    return None


def _is_module_file(regions: list[Region], path: str) -> bool:
    """A file mapped writable is a module's data when it is an ELF file the
    process also maps read-only (its headers, code, read-only data) - not
    shared memory, not a data file mapped for writing."""
    if path.startswith("[") or _shared_memory(path) is not None:
        return False
    return any(r.path == path and not r.writable for r in regions)


def module_of_data(regions: list[Region], region: Region) -> str | None:
    """The module whose .data (a writable mapping of its file) or .bss (the
    anonymous writable mapping right after the module's last file mapping)
    region is; None for any other mapping."""
    if region.path:
        return region.path if _is_module_file(regions, region.path) else None
    i = regions.index(region)
    if i > 0:
        prev = regions[i - 1]
        if prev.end == region.start and prev.path and _is_module_file(regions, prev.path):
            return prev.path
    return None


def name_mapping(regions: list[Region], region: Region, *, holds_blocks: bool = False) -> Mapping:
    """What region is and its name (the kinds above).  holds_blocks: the
    heap reader found tagged blocks in it (libtag's heap)."""
    path = region.path
    if path == "[heap]" or holds_blocks:
        return Mapping("heap", "heap")
    if path:
        shared = _shared_memory(path)
        if shared is not None:
            return shared
    if region.writable:
        module = module_of_data(regions, region)
        if module is not None:
            return Mapping("module", f"globals of {os.path.basename(module)}", module)
    if not path:
        return Mapping("anonymous", "anonymous mapping")
    if path.startswith("["):
        return Mapping("special", path)
    return Mapping("file", path)


__all__ = ["CoreMemory", "Mapping", "Memory", "Region", "clip_regions", "module_of_data",
           "name_mapping"]
