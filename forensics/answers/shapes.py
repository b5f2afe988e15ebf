"""The shapes every verb's document shares: an address, a frame, a block
(libtag's tagged block, or glibc's chunk and the inconsistencies found among
them), as the types of forensics.answers.documents.

Every verb builds its frames and blocks here, so the shapes never drift
between verbs; docs/json.md describes each field.  Addresses are "0x..."
strings.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from forensics.answers.documents import BlockDoc, ChunkDoc, FindingDoc, FrameDoc
from forensics.reader.glibc_layout import CHUNK_HDR
from forensics.reader.glibc_walk import Chunk, Finding
from forensics.reader.model import Block, Frame


def hexaddr(addr: int | None) -> str | None:
    """An address as its "0x..." string (None stays None)."""
    return None if addr is None else f"{addr:#x}"


def frame_doc(frame: Frame) -> FrameDoc:
    """A frame (docs/json.md, "frame")."""
    return FrameDoc(
        address=hexaddr(frame.address),
        function=frame.function,
        file=frame.file,
        line=frame.line,
        module=frame.module,
        inlined=frame.inlined,
        libtag=frame.libtag,
        # the address as the module's own file sees it (nm, addr2line -e):
        # what a frame that could not be named still says for certain
        module_offset=hexaddr(getattr(frame, "module_offset", None)),
    )


def frames_doc(frames: Sequence[Frame]) -> list[FrameDoc]:
    return [frame_doc(f) for f in frames]


def frame_label(f: FrameDoc) -> str:
    """What a frame is called wherever a person reads it:
    its function; without one, module+0xOFFSET (the module's file name and
    the address as that file sees it, the same in every process of the
    build); in no module, its address."""
    if f.function:
        return f.function
    if f.module and f.module_offset:
        return f"{os.path.basename(f.module)}+{f.module_offset}"
    return f.address or "??"


def block_doc(
    block: Block,
    frames_fn: Callable[[int], Sequence[Frame]] | Any,
    offset: int | None = None,
) -> BlockDoc:
    """A block (docs/json.md, "block").  frames_fn: the Dump the block is
    from (its stacks and its clock: the times), or a function giving the
    symbolised frames of a stack id (then the times are null); offset is
    ADDR - start where an address was asked (else 0)."""
    freed = block.state == "freed"
    dump = frames_fn if hasattr(frames_fn, "stack") else None
    frames = dump.stack if dump is not None else frames_fn
    clock = _clock(dump)
    free_ms = block.free_time_ms if freed else None
    return BlockDoc(
        start=hexaddr(block.start),
        size=block.size,
        offset=0 if offset is None else offset,
        state=block.state,
        thread=block.thread,
        alloc_stack=frames_doc(frames(block.alloc_stack)),
        free_stack=frames_doc(frames(block.free_stack)) if freed and block.free_stack is not None else None,
        free_thread=block.free_thread if freed else None,
        alloc_kind=block.alloc_kind,
        alloc_time=clock.iso(block.alloc_time_ms) if clock else None,
        free_time=clock.iso(free_ms) if clock and free_ms is not None else None,
        age_s=clock.age_s(block.alloc_time_ms) if clock else None,
        guarded=block.guarded,
    )


def chunk_doc(c: Chunk, offset: int | None = None) -> ChunkDoc:
    """A glibc chunk (docs/json.md, "chunk"); offset is ADDR - its user
    pointer where an address was asked (else 0)."""
    arena = c.arena
    return ChunkDoc(
        start=hexaddr(c.start),
        user=hexaddr(c.user),
        size=c.size,
        usable=c.usable,
        offset=0 if offset is None else offset,
        state=c.state,
        bin=c.bin_name,
        bin_index=c.bin,
        tcache_thread=c.thread,
        arena=hexaddr(arena.address) if arena is not None else None,
        arena_kind=("main" if arena.main else "thread") if arena is not None else None,
        arena_threads=list(arena.threads) if arena is not None else [],
        size_field=hexaddr(c.raw_size) if c.raw_size is not None else None,
    )


def finding_doc(f: Finding) -> FindingDoc:
    """An inconsistency in glibc's heap (docs/json.md, "Without libtag")."""
    return FindingDoc(kind=f.kind, chunk=hexaddr(f.chunk),
                      user=hexaddr(f.chunk + CHUNK_HDR) if f.chunk is not None else None,
                      arena=hexaddr(f.arena), value=hexaddr(f.value), message=f.message)


class _Clock:
    """A process's clock: libtag's ms (since control.start_mono_ns) as wall
    time (control.start_realtime_ns + ms) and as ages at the core's time."""

    def __init__(self, start_ns: int, now_ms: int | None) -> None:
        self.start_ns, self.now_ms = start_ns, now_ms

    def iso(self, ms: int) -> str:
        return iso_time(self.start_ns + ms * 1_000_000)

    def age_s(self, ms: int) -> float | None:
        return None if self.now_ms is None else round(max(0, self.now_ms - ms) / 1000, 3)


def _clock(dump: Any) -> _Clock | None:
    if dump is None:
        return None
    c = dump.control.fields
    start = int(c.start_realtime_ns)
    if not start:
        return None
    return _Clock(start, dump.taken_ms)


def iso_time(ns: int) -> str:
    """A wall-clock time (ns since the epoch) as ISO-8601 UTC with milliseconds."""
    t = datetime.fromtimestamp(ns // 1_000_000 / 1000, timezone.utc)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


__all__ = ["block_doc", "chunk_doc", "finding_doc", "frame_doc", "frame_label", "frames_doc", "hexaddr", "iso_time"]
