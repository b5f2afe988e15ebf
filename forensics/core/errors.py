"""Errors raised while opening a core or reading memory out of it.

Every failure names the path, file offset or virtual address it is about, so
the one line ``forensics: error: ...`` is enough to act on.  construct's own
exceptions never escape this package: they are wrapped into CoreParseError
with the offset that failed.

Hierarchy::

    ForensicsError
      CoreParseError        the file is not a readable x86_64 ELF core
      CoreReadError         an address cannot be read out of an opened core
        UnmappedError       ... it is in no PT_LOAD segment
        NotDumpedError      ... it is in a segment, but its bytes are not in the file
          TruncatedError    ... because the core file stops short (cut copy, full disk)
"""

from __future__ import annotations

try:  # The package-wide base; forensics.cli.main turns it into an exit code.
    from forensics.errors import ForensicsError
except ImportError:  # pragma: no cover - only while forensics/errors.py is absent

    class ForensicsError(Exception):  # type: ignore[no-redef]
        """Fallback base: an expected failure with an exit code."""

        exit_code: int = 2

try:  # "An input ... address is missing or unusable" (forensics/errors.py).
    from forensics.errors import InputError as _InputBase
except ImportError:  # pragma: no cover
    _InputBase = ForensicsError  # type: ignore[misc,assignment]

try:  # One class for the whole package, if forensics/errors.py defines it.
    from forensics.errors import CoreParseError
except ImportError:  # pragma: no cover

    class CoreParseError(_InputBase):  # type: ignore[no-redef]
        """A core (or something in it) does not parse; says where it failed."""


class CoreReadError(_InputBase):
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
