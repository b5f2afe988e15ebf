"""The things forensics talks about, and the one place they become SPEC §5 JSON.

Every verb's ``--json`` builds its frames and blocks with frame_json and
block_json, so the shapes never drift between verbs.  Addresses are printed as
"0x..." strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


def hexaddr(addr: int | None) -> str | None:
    """An address as SPEC's "0x..." string (None stays None)."""
    return None if addr is None else f"{addr:#x}"


@dataclass(frozen=True)
class Frame:
    """One symbolised stack frame."""

    address: int
    function: str | None = None
    file: str | None = None
    line: int | None = None
    module: str | None = None


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
        import signal as _signal

        try:
            return _signal.Signals(self.signal).name
        except ValueError:
            return f"SIG{self.signal}"


RawFrame = tuple[int, int]  # (pc, frame kind: abi.TAG_FRAME_CALL / TAG_FRAME_ENTRY)


@dataclass(frozen=True)
class ThreadState:
    """A thread record of libtag: who, counters, registers, its shadow stack now."""

    tid: int
    flags: int
    regs: dict[str, int] | None  # at the last snapshot (TAG_THREAD_REGS), else None
    shadow: list[RawFrame] = field(default_factory=list)  # innermost first
    shadow_depth: int = 0  # frames entered (may exceed the stored 256)
    stack_hi: int = 0  # top of its stack, 0 = unknown
    allocs: int = 0
    frees: int = 0
    alloc_bytes: int = 0
    free_bytes: int = 0

    @property
    def exited(self) -> bool:
        return bool(self.flags & 1)  # TAG_THREAD_EXITED


# ---------------------------------------------------------------------- JSON --


def frame_json(frame: Frame) -> dict[str, Any]:
    """SPEC §5 frame."""
    return {
        "address": hexaddr(frame.address),
        "function": frame.function,
        "file": frame.file,
        "line": frame.line,
        "module": frame.module,
    }


def frames_json(frames: Sequence[Frame]) -> list[dict[str, Any]]:
    return [frame_json(f) for f in frames]


def block_json(
    block: Block,
    frames_fn: Callable[[int], Sequence[Frame]],
    offset: int | None = None,
) -> dict[str, Any]:
    """SPEC §5 block.  frames_fn(stack_id) gives the symbolised frames of a
    stack id; offset is ADDR - start where an address was asked (else 0)."""
    freed = block.state == "freed"
    return {
        "start": hexaddr(block.start),
        "size": block.size,
        "offset": 0 if offset is None else offset,
        "state": block.state,
        "thread": block.thread,
        "alloc_stack": frames_json(frames_fn(block.alloc_stack)),
        "free_stack": (
            frames_json(frames_fn(block.free_stack)) if freed and block.free_stack is not None else None
        ),
        "free_thread": block.free_thread if freed else None,
        "alloc_kind": block.alloc_kind,
    }


def iso_time(ns: int) -> str:
    """A wall-clock time (ns since the epoch) as ISO-8601 UTC with milliseconds."""
    from datetime import datetime, timezone

    t = datetime.fromtimestamp(ns // 1_000_000 / 1000, timezone.utc)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


__all__ = [
    "Anomaly",
    "Block",
    "Crash",
    "Frame",
    "RawFrame",
    "ThreadState",
    "block_json",
    "frame_json",
    "frames_json",
    "hexaddr",
    "iso_time",
]
