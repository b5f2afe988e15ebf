"""Live heap per allocation stack across a series of snapshots.

    t = trend([snap1, snap2, snap3])
    doc = trend_doc(t)                  # a TrendDoc (docs/json.md)

Snapshots of one process are put in the order they were taken (libtag's
snapshot sequence number); snapshots of different processes stay in the order
given, and their stacks are matched by symbolised frames (forensics.answers.diff).  A
stack is flagged ``monotonic`` when its live bytes never fall from one snapshot
to the next and end above where they started - the shape of a leak, as
opposed to a cache that fills and drains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

from forensics._np import np

from forensics.answers.diff import frame_key, same_process, snapshot_ref
from forensics.answers.documents import TrendDoc, TrendStack
from forensics.answers.shapes import frames_doc
from forensics.reader import abi
from forensics.reader.dump import Dump


@dataclass
class StackSeries:
    key: Hashable
    stack_id: int  # in the last snapshot that has it
    snap_index: int  # which snapshot stack_id belongs to
    blocks: list[int]
    bytes: list[int]

    @property
    def monotonic(self) -> bool:
        b = self.bytes
        return len(b) > 1 and all(y >= x for x, y in zip(b, b[1:])) and b[-1] > b[0]

    @property
    def growth_bytes(self) -> int:
        return self.bytes[-1] - self.bytes[0]

    @property
    def growth_blocks(self) -> int:
        return self.blocks[-1] - self.blocks[0]


@dataclass
class Trend:
    dumps: list[Dump]  # in time order
    same_process: bool
    stacks: list[StackSeries]  # monotonic first, then most bytes grown


def order(dumps: Sequence[Dump]) -> tuple[list[Dump], bool]:
    dumps = list(dumps)
    one = all(same_process(dumps[0], s) for s in dumps[1:])
    if one:
        dumps.sort(key=lambda s: (int(s.control.fields.snapshot_seq), int(s.control.fields.snapshot_time_ms)))
    return dumps, one


def trend(dumps: Sequence[Dump]) -> Trend:
    dumps, one = order(dumps)
    n = len(dumps)
    series: dict[Hashable, StackSeries] = {}
    for i, dump in enumerate(dumps):
        idx = dump.heap.index
        m = idx["state"] == abi.TAG_STATE_LIVE
        ids, inv = np.unique(idx["alloc_stack"][m], return_inverse=True)
        cnt = np.bincount(inv, minlength=len(ids))
        nb = np.bincount(inv, weights=idx["size"][m].astype(np.float64), minlength=len(ids))
        if not one:
            dump.prefetch(ids.tolist())
        for s, c, b in zip(ids.tolist(), cnt.tolist(), nb.tolist()):
            key = s if one else frame_key(dump.stack(s))
            ser = series.get(key)
            if ser is None:
                ser = series[key] = StackSeries(key, s, i, [0] * n, [0] * n)
            ser.stack_id, ser.snap_index = s, i
            ser.blocks[i] += c
            ser.bytes[i] += int(b)
    out = sorted(series.values(), key=lambda s: (not s.monotonic, -s.growth_bytes, -s.growth_blocks,
                                                  s.stack_id))
    return Trend(dumps, one, out)


def trend_doc(t: Trend, *, top: int | None = None, growing_only: bool = False) -> TrendDoc:
    """trend's document (docs/json.md, "trend"); stacks_total counts the
    stacks before --top cut them."""
    stacks = [s for s in t.stacks if s.monotonic] if growing_only else list(t.stacks)
    total = len(stacks)
    if top is not None:
        stacks = stacks[:top]
    for i, dump in enumerate(t.dumps):
        dump.prefetch([s.stack_id for s in stacks if s.snap_index == i])
    return TrendDoc(
        snapshots=[snapshot_ref(s) for s in t.dumps],
        same_process=t.same_process,
        stacks=[TrendStack(
            stack=frames_doc(t.dumps[s.snap_index].stack(s.stack_id)),
            stack_id=s.stack_id,
            blocks=s.blocks,
            bytes=s.bytes,
            monotonic=s.monotonic,
            growth_bytes=s.growth_bytes,
            growth_blocks=s.growth_blocks,
        ) for s in stacks],
        monotonic_stacks=sum(1 for s in t.stacks if s.monotonic),
        stacks_total=total,
    )


__all__ = ["StackSeries", "Trend", "order", "trend", "trend_doc"]
