"""What grew between two snapshots: per allocation stack, and block by block.

    doc = diff_doc(old_dump, new_dump, filters=["leak_*"], min_bytes=1)  # docs/json.md
    d = diff(old_snap, new_snap, filters=["leak_*"], min_bytes=1)       # by allocation stack

Blocks are matched by identity, not by address: a live block of NEW is the
same block as one of OLD when its start, allocation time, allocating thread and
allocation stack are all equal.  An address that was freed and handed out
again between the snapshots is a gone block plus a new block, never a
survivor (two allocations at one address by one thread from one stack in the
same millisecond tick would be indistinguishable; libtag's clock resolution
is the kernel tick, so that is the limit of "identity").

Two snapshots of the same process (same pid and libtag start time) share the
stack table - it only ever grows - so stacks are compared by id.  Snapshots of
different processes (two runs of a program) are compared by symbolised frames
(function, file, line, module - not addresses, which ASLR moves), and no block
can survive between them.

Severity: stacks are ranked by bytes grown, then blocks grown, then the share
of the new blocks that have the most common size (a leak repeats one
allocation; churn varies).

A heap whose blocks have no allocation stacks (glibc's, without libtag) is
compared by size class instead (``size_diff_doc``).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from forensics._np import np

from forensics.answers.documents import (Counts, DiffDoc, DiffEntry, SizeClassChange, SizeDiffDoc,
                                         SizeDiffSide, SnapshotRef, WithoutLibtag)
from forensics.answers.shapes import frames_doc, hexaddr
from forensics.errors import InputError
from forensics.heaps import heap_of
from forensics.reader import abi
from forensics.reader.dump import Dump
from forensics.reader.model import Frame

MAX_ADDRESSES = 8


@dataclass
class StackGrowth:
    key: Hashable
    old_stack: int  # stack id in OLD (0: none there)
    new_stack: int  # stack id in NEW (0: none there)
    old_blocks: int = 0
    old_bytes: int = 0
    new_blocks: int = 0
    new_bytes: int = 0
    survived: int = 0  # blocks live in both (same identity)
    added: int = 0  # blocks live in NEW only
    added_bytes: int = 0
    gone: int = 0  # blocks live in OLD only
    gone_bytes: int = 0
    same_size_share: float = 0.0  # of the added blocks, the share with the most common size
    common_size: int | None = None
    addresses: list[int] = field(default_factory=list)  # added blocks, lowest first

    @property
    def blocks(self) -> int:
        return self.new_blocks - self.old_blocks

    @property
    def bytes(self) -> int:
        return self.new_bytes - self.old_bytes

    def severity(self) -> tuple:
        return (self.bytes, self.blocks, self.same_size_share)


@dataclass
class Diff:
    same_process: bool
    stacks: list[StackGrowth]  # every stack with a change, most severe first
    new_blocks: int
    gone_blocks: int
    survived_blocks: int
    new_bytes: int
    gone_bytes: int


def same_process(a: Dump, b: Dump) -> bool:
    """Do the two snapshots come from one process (one libtag lifetime)?"""
    ca, cb = a.control.fields, b.control.fields
    return a.pid == b.pid and int(ca.start_realtime_ns) == int(cb.start_realtime_ns)


def frame_key(frames: Sequence[Frame]) -> tuple:
    """A stack's identity across processes: what each frame names, not where
    (an unnamed frame: its module_offset, the same in every process)."""
    return tuple((f.function, f.file, f.line, os.path.basename(f.module or "") or None,
                  None if f.function or f.file else _place(f)) for f in frames)


def _place(f: Frame) -> int:
    off = getattr(f, "module_offset", None)
    return off if off is not None else f.address


def _live(dump: Dump) -> dict[str, np.ndarray]:
    idx = dump.heap.index
    m = idx["state"] == abi.TAG_STATE_LIVE
    return {k: idx[k][m] for k in ("start", "size", "tid", "alloc_time", "alloc_stack")}


def match(old: dict[str, np.ndarray], new: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(survived mask over old, survived mask over new): same start, time, thread, stack."""
    so, sn = old["start"], new["start"]
    keep_old = np.zeros(len(so), bool)
    if not len(so) or not len(sn):
        return keep_old, np.zeros(len(sn), bool)
    j = np.searchsorted(so, sn)
    jj = np.minimum(j, len(so) - 1)
    same = (j < len(so)) & (so[jj] == sn)
    for k in ("alloc_time", "tid", "alloc_stack"):
        same &= old[k][jj] == new[k]
    keep_old[jj[same]] = True
    return keep_old, same


def _matches(patterns: Sequence[str], frames: Sequence[Frame]) -> bool:
    for f in frames:
        names = [f.function or "", os.path.basename(f.module or "")]
        for p in patterns:
            glob = any(c in p for c in "*?[")
            for n in names:
                if n and (fnmatch.fnmatchcase(n, p) if glob else p in n):
                    return True
    return False


def diff(old: Dump, new: Dump, *, filters: Sequence[str] = (),
         excludes: Sequence[str] = (), min_bytes: int = 0) -> Diff:
    """Per-stack growth from old to new (see the module docstring).  filters /
    excludes are patterns on frame function or module names (globs with * ? [],
    else substrings): keep stacks with a frame matching a filter, drop those with
    a frame matching an exclude.  min_bytes keeps stacks whose bytes changed by
    at least that much (either way)."""
    sp = same_process(old, new)
    lo, ln = _live(old), _live(new)
    if sp:
        surv_old, surv_new = match(lo, ln)
    else:
        surv_old, surv_new = np.zeros(len(lo["start"]), bool), np.zeros(len(ln["start"]), bool)

    # stack id -> key
    if sp:
        def keys_of(dump, ids):
            return {int(s): int(s) for s in ids}
    else:
        def keys_of(dump, ids):
            ids = [int(s) for s in ids]
            dump.prefetch(ids)
            return {s: frame_key(dump.stack(s)) for s in ids}
    ko = keys_of(old, np.unique(lo["alloc_stack"]))
    kn = keys_of(new, np.unique(ln["alloc_stack"]))

    out: dict[Hashable, StackGrowth] = {}

    def agg(d, mask):
        ids, inv = np.unique(d["alloc_stack"][mask], return_inverse=True)
        cnt = np.bincount(inv, minlength=len(ids))
        nb = np.bincount(inv, weights=d["size"][mask].astype(np.float64), minlength=len(ids))
        return ids, inv, cnt, nb

    def get(key, old_id=0, new_id=0) -> StackGrowth:
        g = out.get(key)
        if g is None:
            g = out[key] = StackGrowth(key, old_id, new_id)
        if old_id and not g.old_stack:
            g.old_stack = old_id
        if new_id and not g.new_stack:
            g.new_stack = new_id
        return g

    all_o = np.ones(len(lo["start"]), bool)
    all_n = np.ones(len(ln["start"]), bool)
    for d, mask, kmap, side in ((lo, all_o, ko, "old"), (ln, all_n, kn, "new")):
        ids, _, cnt, nb = agg(d, mask)
        for s, c, b in zip(ids.tolist(), cnt.tolist(), nb.tolist()):
            g = get(kmap[s], s if side == "old" else 0, s if side == "new" else 0)
            if side == "old":
                g.old_blocks += c
                g.old_bytes += int(b)
            else:
                g.new_blocks += c
                g.new_bytes += int(b)
    ids, _, cnt, _ = agg(ln, surv_new)
    for s, c in zip(ids.tolist(), cnt.tolist()):
        out[kn[s]].survived += c
    ids, _, cnt, nb = agg(lo, ~surv_old)
    for s, c, b in zip(ids.tolist(), cnt.tolist(), nb.tolist()):
        g = out[ko[s]]
        g.gone += c
        g.gone_bytes += int(b)
    # added blocks: counts, bytes, the most common size, a few addresses
    add = ~surv_new
    a_stack, a_size, a_start = ln["alloc_stack"][add], ln["size"][add], ln["start"][add]
    if len(a_stack):
        order = np.lexsort((a_start, a_size, a_stack))
        a_stack, a_size, a_start = a_stack[order], a_size[order], a_start[order]
        ids, first, cnt = np.unique(a_stack, return_index=True, return_counts=True)
        for s, f, c in zip(ids.tolist(), first.tolist(), cnt.tolist()):
            g = out[kn[s]]
            sizes = a_size[f:f + c]
            vals, vc = np.unique(sizes, return_counts=True)
            top = int(np.argmax(vc))
            g.added += c
            g.added_bytes += int(sizes.sum())
            g.same_size_share = float(vc[top]) / c
            g.common_size = int(vals[top])
            g.addresses = sorted(a_start[f:f + c].tolist())[:MAX_ADDRESSES]

    changed = [g for g in out.values() if g.added or g.gone or g.blocks or g.bytes]
    if filters or excludes:
        new.prefetch([g.new_stack for g in changed if g.new_stack])
        old.prefetch([g.old_stack for g in changed if g.old_stack and not g.new_stack])
        kept = []
        for g in changed:
            frames = new.stack(g.new_stack) if g.new_stack else old.stack(g.old_stack)
            if filters and not _matches(filters, frames):
                continue
            if excludes and _matches(excludes, frames):
                continue
            kept.append(g)
        changed = kept
    if min_bytes:
        changed = [g for g in changed if abs(g.bytes) >= min_bytes]
    changed.sort(key=lambda g: g.severity(), reverse=True)
    return Diff(
        same_process=sp,
        stacks=changed,
        new_blocks=int((~surv_new).sum()),
        gone_blocks=int((~surv_old).sum()),
        survived_blocks=int(surv_new.sum()),
        new_bytes=int(ln["size"][~surv_new].sum()),
        gone_bytes=int(lo["size"][~surv_old].sum()),
    )


def snapshot_ref(dump: Dump) -> SnapshotRef:
    """A core as diff and trend list it (docs/json.md, "snapshot")."""
    c = dump.control.fields
    t = dump.heap.totals
    return SnapshotRef(core=dump.core.path if dump.core is not None else dump.mem.name,
                       pid=dump.pid, snapshot_seq=int(c.snapshot_seq),
                       time_ms=int(c.snapshot_time_ms), reason=dump.control.reason,
                       live_blocks=t.live_blocks, live_bytes=t.live_bytes)


def _entry(old: Dump, new: Dump, g: StackGrowth) -> DiffEntry:
    frames = new.stack(g.new_stack) if g.new_stack else old.stack(g.old_stack)
    return DiffEntry(
        stack=frames_doc(frames),
        blocks=g.blocks,
        bytes=g.bytes,
        stack_id=g.new_stack or g.old_stack,
        old=Counts(blocks=g.old_blocks, bytes=g.old_bytes),
        new=Counts(blocks=g.new_blocks, bytes=g.new_bytes),
        survived=g.survived,
        added=g.added,
        added_bytes=g.added_bytes,
        gone=g.gone,
        gone_bytes=g.gone_bytes,
        same_size_share=round(g.same_size_share, 4),
        common_size=g.common_size,
        addresses=[hexaddr(a) for a in g.addresses],
    )


def stack_diff_doc(old: Dump, new: Dump, d: Diff) -> DiffDoc:
    """The diff document (docs/json.md, "diff"): "growth" (stacks that grew, most severe first),
    "new_blocks", "gone_blocks"; plus "no_growth" (stacks that changed without
    growing: churn, or shrinking), "survived_blocks" and both snapshots."""
    new.prefetch([g.new_stack for g in d.stacks if g.new_stack])
    old.prefetch([g.old_stack for g in d.stacks if g.old_stack and not g.new_stack])
    grew = [g for g in d.stacks if g.bytes > 0 or g.blocks > 0]
    rest = [g for g in d.stacks if not (g.bytes > 0 or g.blocks > 0)]
    rest.sort(key=lambda g: (g.bytes, g.blocks))
    return DiffDoc(
        old=snapshot_ref(old),
        new=snapshot_ref(new),
        same_process=d.same_process,
        growth=[_entry(old, new, g) for g in grew],
        no_growth=[_entry(old, new, g) for g in rest],
        new_blocks=d.new_blocks,
        gone_blocks=d.gone_blocks,
        survived_blocks=d.survived_blocks,
        new_bytes=d.new_bytes,
        gone_bytes=d.gone_bytes,
        warnings=_order_warnings(old, new, d.same_process),
    )


def _taken_ms(dump: Dump) -> int | None:
    """When the snapshot was taken, ms since the epoch; None if unknown."""
    c = dump.control.fields
    if not int(c.start_realtime_ns) or not int(c.snapshot_time_ms):
        return None
    return int(c.start_realtime_ns) // 1_000_000 + int(c.snapshot_time_ms)


def _order_warnings(old: Dump, new: Dump, same_process: bool) -> list[str]:
    """A warning when OLD was taken after NEW: the growth would read as shrinkage."""
    co, cn = old.control.fields, new.control.fields
    if same_process and int(co.snapshot_seq) and int(cn.snapshot_seq):
        later = int(co.snapshot_seq) > int(cn.snapshot_seq)
        what = f"snapshot {int(co.snapshot_seq)} of pid {old.pid} after snapshot {int(cn.snapshot_seq)}"
    else:
        to, tn = _taken_ms(old), _taken_ms(new)
        if to is None or tn is None:
            return []
        later = to > tn
        what = f"{(to - tn) / 1000:.1f} s after"
    if not later:
        return []
    return [f"OLD was taken after NEW ({what}): diff takes the earlier core first "
            f"(forensics diff OLD NEW), so here growth and shrinkage are swapped"]


def diff_doc(old: Dump, new: Dump, *, filters: Sequence[str] = (), excludes: Sequence[str] = (),
             min_bytes: int = 0, names: tuple[str, str] = ("OLD", "NEW")) -> DiffDoc | SizeDiffDoc:
    """diff's document (docs/json.md, "diff"): by allocation stack when the
    heaps have stacks, by size class when they have none.  names: what the
    user called the two cores, for the errors (two heaps of different kinds,
    a stack filter on heaps without stacks)."""
    oh, nh = heap_of(old), heap_of(new)
    if oh.tagged != nh.tagged:
        plain = names[0] if not oh.tagged else names[1]
        raise InputError(f"diff: {plain} is a core without libtag and the other is not: "
                         f"give two of one kind")
    if oh.tagged:
        return stack_diff_doc(old, new, diff(old, new, filters=filters, excludes=excludes,
                                        min_bytes=min_bytes))
    if filters or excludes:
        raise InputError("diff: --filter and --exclude match allocation stacks, and cores "
                         "without libtag have none (their diff is by chunk size)")
    return size_diff_doc(old, new, min_bytes=min_bytes)


def size_diff_doc(old: Dump, new: Dump, *, min_bytes: int = 0) -> SizeDiffDoc:
    """diff's document for two heaps without allocation stacks (docs/json.md,
    "diff" without libtag): growth by size class - the usable size of the
    blocks the program holds (glibc's chunks in use in an arena, or
    mmapped) - in place of by allocation stack.  In one process (same pid),
    a block at the same address with the same usable size in both counts as
    kept; the others are new or gone.  min_bytes keeps the classes whose
    bytes changed by at least that much (either way)."""
    oh, nh = heap_of(old), heap_of(new)
    (os_, ou, _), (ns, nu, _) = oh.blocks(), nh.blocks()
    same = old.pid == new.pid and old.pid != 0
    if same:
        kept_old, kept_new = _kept(os_, ou, ns, nu), _kept(ns, nu, os_, ou)
    else:
        kept_old, kept_new = np.zeros(len(os_), bool), np.zeros(len(ns), bool)
    # per usable size, in one pass each: chunks before and after, and the
    # kept, added and gone among them
    sizes = np.union1d(ou, nu)
    io, inn = np.searchsorted(sizes, ou), np.searchsorted(sizes, nu)

    def count(idx, mask=None):
        return np.bincount(idx if mask is None else idx[mask], minlength=len(sizes)).tolist()

    old_n, new_n = count(io), count(inn)
    kept, added, gone = count(inn, kept_new), count(inn, ~kept_new), count(io, ~kept_old)
    rows = []
    for k, s in enumerate(sizes.tolist()):
        oc, nc = old_n[k], new_n[k]
        row = SizeClassChange(usable_size=s, old_chunks=oc, new_chunks=nc,
                              old_bytes=oc * s, new_bytes=nc * s,
                              chunks=nc - oc, bytes=(nc - oc) * s,
                              kept=kept[k], added=added[k], gone=gone[k])
        if (row.chunks or row.added or row.gone) and abs(row.bytes) >= min_bytes:
            rows.append(row)
    rows.sort(key=lambda r: (r.bytes, r.chunks, r.added), reverse=True)

    def side(d: Dump, us) -> SizeDiffSide:
        return SizeDiffSide(core=d.mem.name.removeprefix("core "), pid=d.pid,
                            chunks=int(len(us)), bytes=int(us.sum()))

    return SizeDiffDoc(
        libtag=False,
        without_libtag=WithoutLibtag.of(nh.without),
        old=side(old, ou),
        new=side(new, nu),
        same_process=same,
        new_chunks=int((~kept_new).sum()),
        gone_chunks=int((~kept_old).sum()),
        kept_chunks=int(kept_new.sum()),
        size_classes=rows,
        warnings=old.warnings + [w for w in new.warnings if w not in old.warnings],
    )


def _kept(starts, sizes, other_starts, other_sizes):
    """Which chunks (sorted starts, usable sizes) the other core has at the
    same address with the same usable size."""
    if not len(other_starts) or not len(starts):
        return np.zeros(len(starts), bool)
    pos = np.minimum(np.searchsorted(other_starts, starts), len(other_starts) - 1)
    return (other_starts[pos] == starts) & (other_sizes[pos] == sizes)


__all__ = ["Diff", "StackGrowth", "diff", "diff_doc", "stack_diff_doc", "frame_key", "match", "same_process",
           "size_diff_doc", "snapshot_ref"]
