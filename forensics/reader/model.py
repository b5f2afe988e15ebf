"""The things the reader finds in a libtag process: blocks, frames, threads,
the anomaly and the crash - plain dataclasses.

Their JSON forms are built in one place, forensics.answers.shapes
(docs/json.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forensics.core.notes import signal_name
from forensics.reader import abi
from forensics.reader.memory import Region


@dataclass(frozen=True)
class Frame:
    """One symbolised stack frame."""

    address: int
    function: str | None = None
    file: str | None = None
    line: int | None = None
    module: str | None = None
    inlined: bool = False  # a call inlined into the next (outer) frame, which has the same address
    libtag: bool = False  # libtag's own code (an entry point, a hook, the unwinder)


@dataclass(frozen=True)
class Block:
    """One tagged heap block, as its tag (and free record) describe it."""

    start: int  # the user pointer
    size: int  # requested bytes
    state: str  # "live" | "freed"
    thread: int  # allocating kernel tid
    alloc_time_ms: int  # ms since libtag started in the process
    alloc_stack: int  # stack table id, 0 = none
    free_thread: int | None = None
    free_time_ms: int | None = None
    free_stack: int | None = None
    tag_addr: int = 0
    alloc_kind: str = "malloc"  # "malloc" | "new" | "new[]" | "new-aligned" | "new[]-aligned"
    guarded: bool = False  # in a slot of the guard pool (LIBTAG_GUARD_RATE)

    @property
    def end(self) -> int:
        return self.start + self.size

    def __contains__(self, addr: int) -> bool:
        return self.start <= addr < self.start + self.size


@dataclass(frozen=True)
class Anomaly:
    """The anomaly recorded in the control block."""

    kind: str  # "double-free" | "invalid-free" | "heap-overflow" | "use-after-free"
    #            | "heap-underflow" | "alloc-dealloc-mismatch"
    address: int  # the pointer concerned, or the first damaged byte (see docs/format.md)
    thread: int  # detecting thread (for a bad release: the releasing one)
    stack: int  # stack id of the detecting stack
    time_ms: int
    block: Block | None = None  # from the tag copy libtag took, None if none or unknown
    block_address: int | None = None  # the block libtag named, even when its tag is unknown
    written: bytes | None = None  # what was written at address, where known
    dealloc: str | None = None  # mismatch: how it was released ("free", "delete", ...)
    access: str | None = None  # "read" | "write" for a fault on a guarded block
    pc: int | None = None  # faulting instruction
    time_ns: int = 0  # wall clock (CLOCK_REALTIME ns) when libtag detected it


@dataclass(frozen=True)
class Crash:
    """The fatal signal recorded in the control block."""

    signal: int
    address: int  # si_addr
    thread: int
    code: int  # si_code
    stack: int  # stack id of the faulting thread (0 = none)
    time_ms: int

    @property
    def signal_name(self) -> str:
        return signal_name(self.signal)


RawFrame = tuple[int, int]  # (pc, frame kind: abi.TAG_FRAME_CALL / TAG_FRAME_ENTRY)


@dataclass(frozen=True)
class Thread:
    """One thread of the process.  Dump.threads gives every thread: the
    registers that are the program's (Dump.saved_registers_first says
    whose), its stack pointer and stack mapping, and - for a thread libtag
    has a record of (``recorded``) - the record's fields.  Control.threads
    gives the records alone: regs, sp and stack_region None there."""

    tid: int
    regs: dict[str, int] | None = None  # the program's registers at the dump, as Dump.threads chose them
    sp: int | None = None
    stack_region: Region | None = None  # the mapping that holds its stack
    recorded: bool = False  # libtag has a record of this thread: the fields below are that record's
    flags: int = 0  # abi.TAG_THREAD_*
    saved_regs: dict[str, int] | None = None  # libtag's, saved at the last snapshot (TAG_THREAD_REGS)
    shadow: list[RawFrame] = field(default_factory=list)  # innermost first
    shadow_depth: int = 0  # frames entered (may exceed the stored 256)
    shadow_sp: list[int] = field(default_factory=list)  # key of each CALL frame of shadow, in its order: the end of its return address slot (x86_64: the CFA)
    shadow_fn: list[int] = field(default_factory=list)  # the function each of those returns from
    stack_hi: int = 0  # top of its stack, 0 = unknown
    allocs: int = 0
    frees: int = 0
    alloc_bytes: int = 0
    free_bytes: int = 0

    @property
    def exited(self) -> bool:
        return bool(self.flags & abi.TAG_THREAD_EXITED)

    @property
    def live_stack(self) -> tuple[int, int] | None:
        """[sp, end of its stack mapping): the words of its live frames
        (the whole mapping when sp is not in it); None without a mapping."""
        r = self.stack_region
        if r is None:
            return None
        return (self.sp if self.sp and self.sp in r else r.start, r.end)


__all__ = ["Anomaly", "Block", "Crash", "Frame", "RawFrame", "Thread"]
