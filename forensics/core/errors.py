"""Errors raised while opening a core or reading memory out of it.

Every failure names the path, file offset or virtual address it is about, so
the one line ``forensics: error: ...`` is enough to act on.  construct's own
exceptions never escape this package: they are wrapped into CoreParseError
with the offset that failed.

Hierarchy::

    ForensicsError > InputError
      CoreParseError        the file is not a readable x86_64 ELF core
      CoreReadError         an address cannot be read out of an opened core
        UnmappedError       ... it is in no PT_LOAD segment
        NotDumpedError      ... it is in a segment, but its bytes are not in the file
          TruncatedError    ... because the core file stops short (cut copy, full disk)
"""

from __future__ import annotations

# ForensicsError is the package-wide base (forensics.cli.main turns it into
# an exit code); CoreParseError is defined beside InputError for the whole
# package and re-exported here.
from forensics.errors import CoreParseError, ForensicsError, InputError


class CoreReadError(InputError):
    """Memory at an address cannot be read from the core."""

    def __init__(self, message: str, addr: int) -> None:
        super().__init__(message)
        self.addr = addr


class UnmappedError(CoreReadError):
    """The address is in no PT_LOAD segment of the core."""

    def __init__(self, addr: int, message: str | None = None) -> None:
        super().__init__(message or f"{addr:#x} is not in any segment of the core", addr)


class NotDumpedError(CoreReadError):
    """The address is in a segment, but the kernel or gdb left its bytes out.

    The kernel dumps only the first page or none of read-only file-backed
    mappings (see core(5), /proc/PID/coredump_filter): p_filesz < p_memsz.
    Pass ``zero_fill=True`` to Core.read to get zeros for these bytes instead.
    """


class TruncatedError(NotDumpedError):
    """The segment's bytes should be in the file, but the file ends first.

    Never zero-filled: the bytes existed, the copy of the core lost them.
    """


__all__ = [
    "ForensicsError",
    "CoreParseError",
    "CoreReadError",
    "UnmappedError",
    "NotDumpedError",
    "TruncatedError",
]
