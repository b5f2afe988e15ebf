"""The JSON shapes every verb shares: an address, a frame, a block.

Every verb's ``--json`` builds its frames and blocks here, so the shapes never
drift between verbs; docs/json.md describes each field.  Addresses are
"0x..." strings.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from forensics.reader.model import Block, Frame


def hexaddr(addr: int | None) -> str | None:
    """An address as its "0x..." string (None stays None)."""
    return None if addr is None else f"{addr:#x}"


def frame_json(frame: Frame) -> dict[str, Any]:
    """A frame (docs/json.md, "frame")."""
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
    """A block (docs/json.md, "block").  frames_fn(stack_id) gives the
    symbolised frames of a stack id; offset is ADDR - start where an address
    was asked (else 0)."""
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
        "guarded": block.guarded,
    }


def iso_time(ns: int) -> str:
    """A wall-clock time (ns since the epoch) as ISO-8601 UTC with milliseconds."""
    from datetime import datetime, timezone

    t = datetime.fromtimestamp(ns // 1_000_000 / 1000, timezone.utc)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


__all__ = ["block_json", "frame_json", "frames_json", "hexaddr", "iso_time"]
