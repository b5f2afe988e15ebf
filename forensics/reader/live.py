"""A running process's memory through /proc/PID/maps and /proc/PID/mem.

LiveMemory(pid) implements forensics.reader.memory.Memory, so the heap reader reads tags back
from a process that keeps running.  Reading another process's memory needs
ptrace access to it (same user, and Yama's ptrace_scope permitting: a parent
may always read its child).  The bytes are read as they are at that moment;
nothing stops the process.

This module also holds what every reader of a live process shares: the one
/proc/PID/maps parser (read_maps) and the chunked region loader
(load_region), which the gdb adapter uses with gdb's memory reads.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Callable

from forensics._np import np

from forensics.core.errors import UnmappedError
from forensics.errors import InputError
from forensics.reader.memory import Region

_CHUNK = 1 << 20  # bytes per read when loading a region
_PAGE = 4096
# Readable in the maps but not through /proc/PID/mem (or a debugger's reads).
_UNREADABLE = ("[vvar", "[vsyscall]")


# -------------------------------------------------------------- the maps --


@dataclass(frozen=True)
class MapsLine:
    """One line of /proc/PID/maps: ``start-end perms offset dev inode [path]``."""

    start: int
    end: int
    perms: str  # "rw-p"
    offset: int  # file offset of start
    path: str | None  # None: anonymous; "[heap]", "[stack]"...; may end " (deleted)"

    @property
    def readable(self) -> bool:
        return self.perms.startswith("r")

    @property
    def writable(self) -> bool:
        return self.perms[1:2] == "w"


def parse_maps(text: str) -> list[MapsLine]:
    """The lines of a /proc/PID/maps text; a path may hold spaces."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        lo, _, hi = parts[0].partition("-")
        try:
            start, end, offset = int(lo, 16), int(hi, 16), int(parts[2], 16)
        except ValueError:
            continue
        out.append(MapsLine(start, end, parts[1], offset, parts[5] if len(parts) > 5 else None))
    return out


def read_maps(pid: int) -> list[MapsLine]:
    """/proc/PID/maps parsed; raises OSError (FileNotFoundError: no such
    process, PermissionError: not ours) for the caller to word."""
    with open(f"/proc/{int(pid)}/maps", encoding="utf-8", errors="surrogateescape") as f:
        return parse_maps(f.read())


def maps_of(pid: int) -> list[MapsLine]:
    """read_maps(pid), its failures worded for the user (InputError)."""
    try:
        return read_maps(pid)
    except FileNotFoundError:
        raise InputError(f"no such process: {pid}") from None
    except PermissionError:
        raise InputError(f"permission denied reading /proc/{pid}/maps") from None
    except OSError as exc:
        raise InputError(f"cannot read /proc/{pid}/maps: {exc.strerror or exc}") from None


def maps_regions(maps: list[MapsLine], load: Callable[[int, int], np.ndarray]) -> list[Region]:
    """The readable mappings as Regions, sorted by address, whose bytes
    load(start, end) reads on first use."""
    out = [Region(m.start, m.end, m.writable, m.path, load=(lambda s=m.start, e=m.end: load(s, e)))
           for m in maps if m.readable and not (m.path and m.path.startswith(_UNREADABLE))]
    out.sort(key=lambda r: r.start)
    return out


def load_region(start: int, end: int, read_into: Callable[[memoryview, int], int]) -> np.ndarray:
    """[start, end) as a uint8 array.  read_into(view, addr) fills view with
    the bytes at addr and returns how many it read (0 when it cannot); a
    chunk that fails is read again a page at a time, and the pages that
    still cannot be read stay zero."""
    buf = np.zeros(end - start, dtype=np.uint8)
    view = memoryview(buf)
    cur = start
    while cur < end:
        n = min(_CHUNK, end - cur)
        got = read_into(view[cur - start:cur - start + n], cur)
        if got > 0:
            cur += got
            continue
        for page in range(cur, cur + n, _PAGE):
            m = min(_PAGE, cur + n - page)
            read_into(view[page - start:page - start + m], page)
        cur += n
    return buf


# ---------------------------------------------------------- the process --


class LiveMemory:
    """The memory of process pid; close() (or ``with``) releases /proc/PID/mem."""

    def __init__(self, pid: int) -> None:
        self.pid = int(pid)
        self.name = f"process {self.pid}"
        self._fd = -1
        if self.pid <= 0:
            raise InputError(f"no such process: {pid}")
        try:
            self._fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InputError(f"no such process: {self.pid}") from None
        except PermissionError:
            raise InputError(
                f"permission denied reading the memory of process {self.pid}: run as its user "
                f"(or root), and check /proc/sys/kernel/yama/ptrace_scope"
            ) from None
        except OSError as exc:
            raise InputError(f"cannot read process {self.pid}: {exc.strerror or exc}") from None
        self._regions: list[Region] | None = None

    # -- Memory ------------------------------------------------------------

    @property
    def cache_key(self) -> None:
        return None  # a running process changes: never cache its index

    def read(self, addr: int, n: int) -> bytes:
        if n < 0:
            raise ValueError(f"negative read size {n}")
        if addr < 0 or addr + n > 1 << 64:
            raise UnmappedError(addr, f"{addr:#x} is not an address of process {self.pid}")
        try:
            data = os.pread(self._fd, n, addr)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                raise InputError(f"process {self.pid} has exited") from None
            raise UnmappedError(addr, f"{addr:#x} is not readable in process {self.pid}") from None
        if len(data) < n:
            bad = addr + len(data)
            raise UnmappedError(bad, f"{bad:#x} is not readable in process {self.pid}")
        return data

    def regions(self) -> list[Region]:
        """The readable mappings of /proc/PID/maps (read once), sorted by address."""
        if self._regions is None:
            self._regions = maps_regions(self.maps(), self._load)
        return self._regions

    def maps(self) -> list[MapsLine]:
        """/proc/PID/maps as it is now."""
        return maps_of(self.pid)

    # -- helpers -----------------------------------------------------------

    def _read_into(self, view: memoryview, addr: int) -> int:
        try:
            return os.preadv(self._fd, [view], addr)
        except OSError:
            return 0

    def _load(self, start: int, end: int) -> np.ndarray:
        """[start, end) as a uint8 array; unreadable pages read as zeros."""
        return load_region(start, end, self._read_into)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> LiveMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


__all__ = ["LiveMemory", "MapsLine", "load_region", "maps_of", "maps_regions", "parse_maps", "read_maps"]
