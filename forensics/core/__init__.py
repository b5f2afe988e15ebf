"""Reading x86_64 ELF core files: segments, notes, threads and memory.

    from forensics.core import Core
    with Core.open("core.1234") as core:
        for t in core.threads:
            print(t.tid, hex(t.pc))
        word = core.read_u64(core.threads[0].sp)

Layers: elf (ELF container structs) -> notes (note layouts and decoding) ->
core (the Core object: address mapping and mmap'ed memory reads).
"""

from .core import Core, Segment
from .errors import (
    CoreParseError,
    CoreReadError,
    NotDumpedError,
    TruncatedError,
    UnmappedError,
)
from .notes import (
    AT_BASE,
    AT_ENTRY,
    AT_EXECFN,
    AT_PHDR,
    REG_NAMES,
    Auxv,
    Mapping,
    PrPsInfo,
    PrStatus,
    RawNote,
    SigInfo,
)

__all__ = [
    "AT_BASE",
    "AT_ENTRY",
    "AT_EXECFN",
    "AT_PHDR",
    "REG_NAMES",
    "Auxv",
    "Core",
    "CoreParseError",
    "CoreReadError",
    "Mapping",
    "NotDumpedError",
    "PrPsInfo",
    "PrStatus",
    "RawNote",
    "Segment",
    "SigInfo",
    "TruncatedError",
    "UnmappedError",
]
