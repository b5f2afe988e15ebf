"""A running process's memory through /proc/PID/maps and /proc/PID/mem.

LiveMemory(pid) implements forensics.reader.memory.Memory, so heap.py reads tags back
from a process that keeps running.  Reading another process's memory needs
ptrace access to it (same user, and Yama's ptrace_scope permitting: a parent
may always read its child).  The bytes are read as they are at that moment;
nothing stops the process.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from forensics.core.errors import UnmappedError
from forensics.errors import InputError
from forensics.reader.memory import Region

_CHUNK = 1 << 20  # bytes per pread when loading a region
_PAGE = 4096


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
            self._regions = self._read_maps()
        return self._regions

    # -- helpers -----------------------------------------------------------

    def _read_maps(self) -> list[Region]:
        try:
            with open(f"/proc/{self.pid}/maps", encoding="utf-8", errors="surrogateescape") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            raise InputError(f"no such process: {self.pid}") from None
        except PermissionError:
            raise InputError(f"permission denied reading /proc/{self.pid}/maps") from None
        out = []
        for line in lines:
            parts = line.split(None, 5)
            if len(parts) < 5:
                continue
            lo, _, hi = parts[0].partition("-")
            perms = parts[1]
            if not perms.startswith("r"):
                continue
            path = parts[5].strip() if len(parts) > 5 else None
            if path == "[vvar]" or path == "[vsyscall]" or (path and path.startswith("[vvar")):
                continue  # not readable through /proc/PID/mem
            start, end = int(lo, 16), int(hi, 16)
            out.append(
                Region(start, end, perms[1] == "w", path or None,
                       load=(lambda s=start, e=end: self._load(s, e)))
            )
        out.sort(key=lambda r: r.start)
        return out

    def _load(self, start: int, end: int) -> np.ndarray:
        """[start, end) as a uint8 array; unreadable pages read as zeros."""
        buf = np.zeros(end - start, dtype=np.uint8)
        view = memoryview(buf)
        cur = start
        while cur < end:
            n = min(_CHUNK, end - cur)
            try:
                got = os.preadv(self._fd, [view[cur - start : cur - start + n]], cur)
            except OSError:
                got = 0
            if got <= 0:
                cur += _PAGE if n >= _PAGE else n  # skip a page we cannot read
                continue
            cur += got
        return buf

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


__all__ = ["LiveMemory"]
