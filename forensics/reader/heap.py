"""The block index of a libtag process: every tagged heap block, found in bulk.

    control = Control(CoreMemory(core))          # reader/control.py
    heap = Heap(control, cache_path=core.path + ".fxidx")
    block = heap.block_at(0x55d0c0a012a0)        # Block | None, binary search
    frames = control.raw_stack(block.alloc_stack)  # [(pc, kind)], innermost first

How the blocks are found: by walking libtag's heap, as its header and slice
table (Control.heap_layout) describe it - no scan of memory.  Every small
span's carved slots start with a tag or a forward record: the spans are
grouped by the memory region that holds them, each slot's two tag words
are gathered with one fancy index per region, forward records are followed
to their block's tag, and every check value is computed at once.  A large
span's block is one read, its size the span's large_size when the tag says
TAG_SIZE_BIG.  Guarded blocks come from the guard pool's slot records.  A
slot whose tag does not validate (its check, or a state other than live or
freed) holds no block.  Who freed a block comes from the free records
libtag holds (Control.free_records).

The index is a set of sorted numpy arrays; it is cached beside the core
(forensics.reader.cachefile: mapped, not read), keyed by the core's size and mtime,
so the next command skips the walk.

What cannot be read is a warning in ``heap.warnings`` - the Control's own
list, so both say what they found in the order they found it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator

from forensics._np import np

from forensics.reader import abi, cachefile
from forensics.core.errors import CoreReadError
from forensics.reader.control import Control
from forensics.reader.model import Block

CACHE_VERSION = 7  # 2: the smashed-canary answer is cached too; 3: forensics.reader.cachefile; 4: ABI 2;
#                   5: guarded blocks; 6: ABI 4, the heap walk; 7: the damaged slots too
NEAR_WINDOW = 64  # bytes past a block's end still reported as "near" it

_INDEX_FIELDS = {  # name -> dtype of the index arrays (and of the cache)
    "start": np.uint64,  # user pointer
    "size": np.uint64,
    "state": np.uint8,  # abi.TAG_STATE_*
    "tid": np.uint32,
    "alloc_time": np.uint32,
    "alloc_stack": np.uint32,
    "free_stack": np.uint32,
    "free_tid": np.uint32,
    "free_time": np.uint32,
    "free_ok": np.bool_,  # a free record (from a quarantine ring) validated
    "alloc_kind": np.uint8,  # abi.TAG_ALLOC_*
    "guarded": np.bool_,  # in a slot of the guard pool (found from its slot record)
}


@dataclass(frozen=True)
class Totals:
    live_blocks: int
    live_bytes: int
    freed_blocks: int
    freed_bytes: int


Progress = Callable[[int, int], None]


class Heap:
    """The tagged blocks of one memory (a core, or a running process), as
    libtag's control block there (a Control) describes its tags."""

    def __init__(self, control: Control, *, progress: Progress | None = None,
                 cache_path: str | os.PathLike[str] | None = None) -> None:
        self.control = control
        self.mem = control.mem
        self.warnings = control.warnings  # one list: see the module docstring
        self.from_cache = False
        index = None
        cache_key = getattr(self.mem, "cache_key", None)
        cache_path = os.fspath(cache_path) if cache_path is not None else None
        if cache_path and cache_key:
            index = self._load_cache(cache_path, cache_key)
            self.from_cache = index is not None
        if index is None:
            index = self._scan(progress)
            self._index = index
            # the canary check touches a page per live block: do it once per
            # core and keep its answer in the cache with the index
            index["smashed"] = self._smashed_canaries()
            if cache_path and cache_key:
                self._write_cache(cache_path, cache_key, index)
        smashed = index.pop("smashed")
        damaged = index.pop("damaged")
        self._index = index
        self._end = index["start"] + np.maximum(index["size"], 1)  # malloc(0) owns its start
        self._warn_smashed(smashed)
        self._warn_damaged(damaged)

    # ----------------------------------------------------------------- walk --

    def _scan(self, progress: Progress | None) -> dict[str, np.ndarray]:
        """The index, from a walk of libtag's heap (the spans its slice table
        describes) and of the guard pool's slot records: no scan of memory.
        Beside the blocks, "damaged": the slots whose tag the walk could not
        take (see _warn_damaged)."""
        self._damaged: list[np.ndarray] = []  # filled by _slots and _large_blocks
        small, large = self._spans()
        total = sum(s[1] * s[2] for s in small) + len(large) * abi.TAG_HEAP_SLICE
        if progress:
            progress(0, total)
        parts = [self._small_blocks(small, progress, total), self._large_blocks(large),
                 self._guard_blocks()]
        if progress:
            progress(total, total)
        index = {k: np.concatenate([p[k] for p in parts]).astype(dt, copy=False)
                 for k, dt in _INDEX_FIELDS.items()}
        st = index["start"]
        if len(st) > 1 and np.any(st[1:] <= st[:-1]):
            order = np.argsort(st, kind="stable")
            index = {k: v[order] for k, v in index.items()}
            st = index["start"]
            dup = np.flatnonzero(st[1:] == st[:-1]) + 1  # the same block twice: a corrupt table
            if len(dup):
                keep = np.ones(len(st), np.bool_)
                keep[dup] = False
                index = {k: v[keep] for k, v in index.items()}
        self._attach_free_records(index)
        index["damaged"] = np.concatenate(self._damaged) if self._damaged else np.empty(0, np.uint64)
        return index

    def _spans(self) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
        """The heap's small spans [(start, block_size, carved, bytes)] and large ones
        [(start, block_off, large_size, bytes)], walked from slice 0: an
        entry with first_off 0 starts a span of `slices` slices."""
        layout = self.control.heap_layout()
        if layout is None:
            return [], []
        base, meta = layout
        first_off = meta["first_off"].tolist()
        nslices, kind = meta["slices"].tolist(), meta["kind"].tolist()
        bsize, carved, cap = meta["block_size"].tolist(), meta["carved"].tolist(), meta["capacity"].tolist()
        block_off, large_size = meta["block_off"].tolist(), meta["large_size"].tolist()
        small, large, bad = [], [], []
        i, n = 0, len(first_off)
        while i < n:
            step = 1
            if first_off[i] == 0:
                step = max(nslices[i], 1)
                start, span_bytes = base + i * abi.TAG_HEAP_SLICE, step * abi.TAG_HEAP_SLICE
                if kind[i] == abi.TAG_SPAN_SMALL:
                    bs, k = bsize[i], min(carved[i], cap[i])
                    if bs < 2 * abi.TAG_SIZE or bs % 16 or k * bs > span_bytes:
                        bad.append(start)
                    elif k:
                        small.append((start, bs, k, span_bytes))
                elif kind[i] == abi.TAG_SPAN_LARGE:
                    if block_off[i] % 16 or block_off[i] + 2 * abi.TAG_SIZE > span_bytes:
                        bad.append(start)
                    else:
                        large.append((start, block_off[i], large_size[i], span_bytes))
            i += step
        if bad:
            self.warnings.append(
                f"libtag's heap: {len(bad)} span entries make no sense (slot size, count or offset "
                f"beyond the span), their blocks are not read: {_addrs(bad)}")
        return small, large

    def _small_blocks(self, spans: list[tuple[int, int, int, int]], progress: Progress | None,
                      total: int) -> dict[str, np.ndarray]:
        """The blocks of the small spans, in bulk: the spans are grouped by
        the memory region that holds them, and every slot's two tag words
        are gathered with one fancy index per region."""
        if not spans:
            return _empty()
        sp = np.array(spans, dtype=np.uint64).reshape(-1, 4)
        regions = self.mem.regions()
        rstart = np.array([r.start for r in regions], dtype=np.uint64)
        which = np.searchsorted(rstart, sp[:, 0], "right").astype(np.int64) - 1
        parts, unreadable, done = [], [], 0
        for k in np.unique(which).tolist():
            group = sp[which == k]
            if k < 0:
                unreadable += group[:, 0].tolist()
                continue
            region = regions[k]
            try:
                arr = region.array
            except CoreReadError:
                unreadable += group[:, 0].tolist()
                continue
            ends = group[:, 0] + group[:, 1] * group[:, 2]
            fits = ends <= np.uint64(region.start + len(arr))
            unreadable += group[~fits, 0].tolist()
            group = group[fits]
            if len(group):
                parts.append(self._slots(region.start, arr, group))
            done += int((group[:, 1] * group[:, 2]).sum()) if len(group) else 0
            if progress:
                progress(done, total)
        if unreadable:
            self.warnings.append(
                f"libtag's heap: {len(unreadable)} spans are not readable in {self._where()}, their "
                f"blocks are not read: {_addrs(unreadable)}")
        if not parts:
            return _empty()
        return {key: np.concatenate([p[key] for p in parts]) for key in _INDEX_FIELDS}

    def _slots(self, rbase: int, arr: np.ndarray, group: np.ndarray) -> dict[str, np.ndarray]:
        """The blocks of the spans in group (rows start, block_size, carved,
        bytes), which lie in the readable bytes arr of a region at rbase."""
        words = arr[: len(arr) // 8 * 8].view("<u8")
        counts = group[:, 2].astype(np.int64)
        first = np.cumsum(counts) - counts  # each span's first slot in the flat list
        span_of = np.repeat(np.arange(len(group)), counts)
        local = np.arange(int(counts.sum()), dtype=np.uint64) - first[span_of].astype(np.uint64)
        slot = group[span_of, 0] + local * group[span_of, 1]
        w = ((slot - np.uint64(rbase)) >> np.uint64(3)).astype(np.int64)
        bits = words[w + 1]
        used = np.flatnonzero((bits >> np.uint64(abi.TAG_STATE_SHIFT)) & np.uint64(abi.TAG_STATE_MASK))
        slot, w, bits = slot[used], w[used], bits[used]
        span_end = group[span_of[used], 0] + group[span_of[used], 3]
        tag, stack_time, bits, _pad = self._resolve(slot, words[w], bits, words, rbase)
        size = (bits >> np.uint64(abi.TAG_SIZE_SHIFT)) & np.uint64(abi.TAG_SIZE_FIELD)
        ok = _tag_ok(tag, stack_time, bits, self.control.secret)
        # a small block's size is exact, and the block lies in its span
        ok &= (size != np.uint64(abi.TAG_SIZE_BIG)) & (
            tag + np.uint64(abi.TAG_SIZE) + np.maximum(size, np.uint64(abi.TAG_MIN_PAYLOAD)) <= span_end)
        if not ok.all():
            self._damaged.append(slot[~ok])
        return _entries(tag[ok], stack_time[ok], bits[ok], size[ok], np.zeros(int(ok.sum()), np.bool_))

    def _resolve(self, slot: np.ndarray, stack_time: np.ndarray, bits: np.ndarray, words: np.ndarray,
                 rbase: int) -> tuple[np.ndarray, ...]:
        """(tag address, word 0, bits, pad) of each slot's block: a forward
        record (state FORWARD) whose check validates is replaced by the tag
        pad bytes on, in the same region (words: its u64 view from rbase),
        which the caller checks; one that does not validate gives bits 0
        (no block)."""
        state = (bits >> np.uint64(abi.TAG_STATE_SHIFT)) & np.uint64(abi.TAG_STATE_MASK)
        pad = np.zeros(len(slot), np.uint64)
        fwd = np.flatnonzero(state == abi.TAG_STATE_FORWARD)
        if not len(fwd):
            return slot, stack_time, bits, pad
        stack_time, bits = stack_time.copy(), bits.copy()
        fpad = stack_time[fwd] & np.uint64(0xFFFFFFFF)
        fslot = slot[fwd]
        good = (fpad >= np.uint64(abi.TAG_SIZE)) & (fpad % np.uint64(16) == 0) & _check_ok(
            fslot, stack_time[fwd], bits[fwd], self.control.secret)
        # bounded by the region; the caller drops a block beyond its span
        wi = ((fslot + fpad - np.uint64(rbase)) >> np.uint64(3)).astype(np.int64)
        good &= wi + 1 < len(words)
        wi = np.where(good, wi, 0)
        stack_time[fwd] = np.where(good, words[wi], 0)
        bits[fwd] = np.where(good, words[wi + 1], 0)  # not forwarded: state NONE, not a block
        pad[fwd] = np.where(good, fpad, 0)
        return slot + pad, stack_time, bits, pad

    def _large_blocks(self, spans: list[tuple[int, int, int, int]]) -> dict[str, np.ndarray]:
        """The block of each large span (one read each), its size the span's
        large_size when the tag's size field says TAG_SIZE_BIG."""
        rows, unreadable, damaged = [], [], []
        for start, off, large_size, span_bytes in spans:
            try:
                raw = self.mem.read(start + off, abi.TAG_SIZE)
                t = np.frombuffer(raw, "<u8")
                tag, st, bits, pad = start + off, int(t[0]), int(t[1]), 0
                if (bits >> abi.TAG_STATE_SHIFT) & abi.TAG_STATE_MASK == abi.TAG_STATE_FORWARD:
                    pad = st & 0xFFFFFFFF
                    if not (_tag_ok1(tag, st, bits, self.control.secret, (abi.TAG_STATE_FORWARD,))
                            and pad >= abi.TAG_SIZE
                            and pad % 16 == 0 and off + pad + 2 * abi.TAG_SIZE <= span_bytes):
                        damaged.append(start + off)
                        continue
                    t = np.frombuffer(self.mem.read(start + off + pad, abi.TAG_SIZE), "<u8")
                    tag, st, bits = tag + pad, int(t[0]), int(t[1])
            except CoreReadError:
                unreadable.append(start)
                continue
            size = (bits >> abi.TAG_SIZE_SHIFT) & abi.TAG_SIZE_FIELD
            if size == abi.TAG_SIZE_BIG:
                size = large_size
            if _tag_ok1(tag, st, bits, self.control.secret) and \
                    off + pad + abi.TAG_SIZE + max(size, abi.TAG_MIN_PAYLOAD) <= span_bytes:
                rows.append((tag, st, bits, size))
            elif (bits >> abi.TAG_STATE_SHIFT) & abi.TAG_STATE_MASK:
                damaged.append(start + off)
        if unreadable:
            self.warnings.append(
                f"libtag's heap: {len(unreadable)} large spans are not readable in {self._where()}, "
                f"their blocks are not read: {_addrs(unreadable)}")
        if damaged:
            self._damaged.append(np.array(damaged, np.uint64))
        if not rows:
            return _empty()
        a = np.array(rows, dtype=np.uint64).reshape(-1, 4)
        return _entries(a[:, 0], a[:, 1], a[:, 2], a[:, 3], np.zeros(len(a), np.bool_))

    def _guard_blocks(self) -> dict[str, np.ndarray]:
        """The guarded blocks, from the guard pool's slot records: each
        block's tag at user - 16 where the memory is readable and the tag
        validates, else libtag's copy in the record (a freed slot is
        unreadable in a core the kernel wrote)."""
        slots = self.control.guard_slot_records()
        if not len(slots):
            return _empty()
        c = self.control.fields
        lo, hi = int(c.guard_pool), int(c.guard_pool) + int(c.guard_pool_bytes)
        page = self.control.page_size
        step = int(c.guard_slot_size) + page
        rows = []
        for rec in slots:
            user = int(rec["user"])
            if int(rec["state"]) not in (abi.TAG_GUARD_LIVE, abi.TAG_GUARD_FREED, abi.TAG_GUARD_BUSY) or \
                    not lo + page + abi.TAG_SIZE <= user < hi:
                continue
            tag = user - abi.TAG_SIZE
            copy = rec["tag"]
            found = [(int(copy["alloc_stack"]) | int(copy["alloc_time"]) << 32, int(copy["bits"]))]
            try:
                t = np.frombuffer(self.mem.read(tag, abi.TAG_SIZE), "<u8")
                found.insert(0, (int(t[0]), int(t[1])))
            except CoreReadError:
                pass
            for st, bits in found:
                if _tag_ok1(tag, st, bits, self.control.secret):
                    size = (bits >> abi.TAG_SIZE_SHIFT) & abi.TAG_SIZE_FIELD
                    if size == abi.TAG_SIZE_BIG:  # right-aligned: at most to the slot's end
                        slot_end = lo + page + ((user - lo - page) // step + 1) * step - page
                        size = slot_end - user
                    rows.append((tag, st, bits, size))
                    break
        if not rows:
            return _empty()
        a = np.array(rows, dtype=np.uint64).reshape(-1, 4)
        return _entries(a[:, 0], a[:, 1], a[:, 2], a[:, 3], np.ones(len(a), np.bool_))

    def _where(self) -> str:
        return getattr(self.mem, "name", "memory")

    def _attach_free_records(self, index: dict[str, np.ndarray]) -> None:
        """Fill the free_* fields of the freed blocks from the rings' entries
        whose record validates for that block (libtag keeps a free record
        outside the block, so no write into the freed payload can erase it)."""
        e = self.control.free_records()
        if not len(e) or not len(index["start"]):
            return
        user = e["user"]
        stack_tid = (e["free_tid"].astype(np.uint64) << np.uint64(32)) | e["free_stack"].astype(np.uint64)
        ok = e["check"] == abi.np_free_rec_check(user - np.uint64(abi.TAG_SIZE), self.control.secret, stack_tid,
                                                 e["free_time"])
        e = e[ok]
        i = np.searchsorted(index["start"], e["user"])
        hit = i < len(index["start"])
        hit[hit] &= index["start"][i[hit]] == e["user"][hit]
        i, e = i[hit], e[hit]
        freed = index["state"][i] == abi.TAG_STATE_FREED
        i, e = i[freed], e[freed]
        index["free_stack"][i] = e["free_stack"]
        index["free_tid"][i] = e["free_tid"]
        index["free_time"][i] = e["free_time"]
        index["free_ok"][i] = True

    def _smashed_canaries(self) -> np.ndarray:
        """Indexes of the live blocks whose canary is smashed.

        An overflow past a live block smashes its canary - and maybe the tag
        of the block after it, which then no longer validates and drops out
        of every answer - so it must be said even when libtag did not catch
        it.  Every live block's canary is checked in bulk (vectorised per
        region, in chunks); the smashed ones become a warning naming the
        overflowing blocks."""
        x = self._index
        # a guarded block has no canary: its slack is checked by libtag
        live = np.flatnonzero((x["state"] == abi.TAG_STATE_LIVE) & ~x["guarded"])
        if not len(live):
            return np.zeros(0, np.int64)
        at = x["start"][live] + x["size"][live]  # canary addresses, sorted (blocks do not overlap)
        smashed: list[int] = []
        for region in self.mem.regions():
            if not region.writable:
                continue
            try:
                arr = region.array
            except CoreReadError:
                continue
            if len(arr) < abi.TAG_CANARY_SIZE:
                continue
            lo = int(np.searchsorted(at, np.uint64(region.start), "left"))
            last = np.uint64(region.start + len(arr) - abi.TAG_CANARY_SIZE)
            hi = int(np.searchsorted(at, last, "right"))
            # every byte offset as an (unaligned, overlapping) u64: one
            # gather reads all canaries, 8 bytes each, with no copy first
            words = np.ndarray((len(arr) - abi.TAG_CANARY_SIZE + 1,), dtype="<u8",
                               buffer=arr, offset=0, strides=(1,))
            for c in range(lo, hi, 1 << 20):
                sel = live[c:min(hi, c + (1 << 20))]
                off = (at[c:c + len(sel)] - np.uint64(region.start)).astype(np.int64)
                got = words[off]
                want = abi.np_tag_canary(x["start"][sel] - np.uint64(abi.TAG_SIZE), self.control.secret)
                smashed.extend(sel[got != want].tolist())
        return np.array(smashed, dtype=np.int64)

    def _warn_damaged(self, damaged: np.ndarray) -> None:
        """Slots libtag marked used whose tag (or forward record) no longer
        validates, or says a block past its span: written over after libtag
        wrote it - an overflow of the block below, a write through a stale
        pointer.  Their blocks cannot be named.  The anomaly's own block,
        when libtag recorded one, has its own warning (control.py)."""
        a = self.control.fields.anomaly
        if a.kind != abi.TAG_ANOMALY_NONE and int(a.block):
            damaged = damaged[damaged != np.uint64(int(a.block) - abi.TAG_SIZE)]
        if len(damaged):
            self.warnings.append(
                f"libtag's heap: {len(damaged)} slots hold a tag that does not validate or does not fit "
                f"its slot (written over), their blocks are not read: {_addrs(np.sort(damaged).tolist())}")

    def _warn_smashed(self, smashed: np.ndarray) -> None:
        x = self._index
        smashed = smashed.tolist()
        if smashed:
            shown = ", ".join(f"{int(x['start'][i]):#x} ({int(x['size'][i])} bytes)" for i in smashed[:5])
            more = f" and {len(smashed) - 5} more" if len(smashed) > 5 else ""
            self.warnings.append(
                f"heap overflow: the canary after {len(smashed)} live block(s) is smashed - "
                f"written past their end: {shown}{more}; a block right after one may have lost "
                f"its tag and be missing from the answers")

    # ---------------------------------------------------------------- cache --

    def _load_cache(self, path: str, key: tuple[int, int]) -> dict[str, np.ndarray] | None:
        """The cached index (mapped, not read: see forensics.reader.cachefile), or
        None when it is absent, foreign, stale or does not parse."""
        meta = [CACHE_VERSION, key[0], key[1], self.control.addr, self.control.secret]
        z = cachefile.load(path, meta)
        if z is None:
            return None
        index = {}
        for name, dt in _INDEX_FIELDS.items():
            a = z.get(name)
            if a is None or a.dtype != np.dtype(dt) or a.ndim != 1:
                return None
            index[name] = a
        smashed = z.get("smashed")
        n = len(index["start"])
        if any(len(a) != n for a in index.values()) or smashed is None:
            return None
        if n > 1 and np.any(index["start"][1:] <= index["start"][:-1]):
            return None
        if smashed.dtype != np.int64 or smashed.ndim != 1 or (
                len(smashed) and (smashed.min() < 0 or smashed.max() >= n)):
            return None
        damaged = z.get("damaged")
        if damaged is None or damaged.dtype != np.uint64 or damaged.ndim != 1:
            return None
        index["smashed"] = smashed
        index["damaged"] = damaged
        return index

    def _write_cache(self, path: str, key: tuple[int, int], index: dict[str, np.ndarray]) -> None:
        meta = [CACHE_VERSION, key[0], key[1], self.control.addr, self.control.secret]
        err = cachefile.save(path, meta, index)
        if err:
            self.warnings.append(f"index cache not written to {path}: {err}")

    # -------------------------------------------------------------- answers --

    def __len__(self) -> int:
        return len(self._index["start"])

    @property
    def index(self) -> dict[str, np.ndarray]:
        """The sorted index arrays (read-only use): start, size, state, tid,
        alloc_time, alloc_stack, free_stack, free_tid, free_time, free_ok,
        alloc_kind, guarded."""
        return self._index

    def block(self, i: int) -> Block:
        """The i-th block of the index (sorted by start)."""
        x = self._index
        freed = int(x["state"][i]) == abi.TAG_STATE_FREED
        fok = freed and bool(x["free_ok"][i])
        start = int(x["start"][i])
        return Block(
            start=start,
            size=int(x["size"][i]),
            state="freed" if freed else "live",
            thread=int(x["tid"][i]),
            alloc_time_ms=int(x["alloc_time"][i]),
            alloc_stack=int(x["alloc_stack"][i]),
            free_thread=int(x["free_tid"][i]) if fok else None,
            free_time_ms=int(x["free_time"][i]) if fok else None,
            free_stack=int(x["free_stack"][i]) if fok else None,
            tag_addr=start - abi.TAG_SIZE,
            alloc_kind=abi.ALLOC_KIND_NAMES.get(int(x["alloc_kind"][i]), "unknown"),
            guarded=bool(x["guarded"][i]),
        )

    def blocks(self, state: str | None = None) -> Iterator[Block]:
        """Every block (or those of one state, "live"/"freed"), by address."""
        st = self._index["state"]
        if state is None:
            idx = range(len(st))
        else:
            code = abi.TAG_STATE_LIVE if state == "live" else abi.TAG_STATE_FREED
            idx = np.flatnonzero(st == code).tolist()
        for i in idx:
            yield self.block(i)

    def freed_damage(self, block: Block) -> tuple[int, bytes | None] | None:
        """A freed block's payload written after its free: (offset of the
        first byte that no longer holds libtag's pattern, the bytes found
        from there, as the anomaly's ``written``), or None when its pattern
        is whole - or cannot be checked (payloads omitted, not in memory).
        libtag fills min(size, control.quarantine_fill) bytes from offset 0."""
        if block.state != "freed" or self.control.payload_omitted:
            return None
        n = min(block.size, int(self.control.fields.quarantine_fill))
        if n <= 0:
            return None
        region = self.control.region_of(block.start)
        if region is None or block.start + n > region.end:
            return None
        arr = region.array
        lo = block.start - region.start
        if lo + n > len(arr):
            return None  # the region's bytes are not all in this memory
        if block.guarded and not self._tag_in_memory(arr, lo - abi.TAG_SIZE, block.start - abi.TAG_SIZE):
            # a freed guarded block whose slot libtag gave back (out of the
            # window: its pages read as zeros) holds no pattern to check;
            # only its slot record knows it
            return None
        bad = np.flatnonzero(arr[lo:lo + n] != abi.TAG_FREE_PATTERN)
        if not len(bad):
            return None
        off = int(bad[0])
        return off, self.control.written("use-after-free", block.start + off, block, None)

    def _tag_in_memory(self, arr: np.ndarray, lo: int, tag: int) -> bool:
        """Does a valid tag sit at offset lo of arr (the tag address tag)?"""
        if lo < 0 or lo + abi.TAG_SIZE > len(arr):
            return False
        st, bits = (int(w) for w in arr[lo:lo + abi.TAG_SIZE].view("<u8"))
        return _tag_ok1(tag, st, bits, self.control.secret)

    def latent_uaf(self) -> list[tuple[Block, int, bytes | None]]:
        """Every freed block written after its free, by address, with what
        freed_damage says of it: the writes libtag has not reported yet
        (it checks a block when it leaves the quarantine)."""
        out = []
        for block in self.blocks("freed"):
            found = self.freed_damage(block)
            if found is not None:
                out.append((block, *found))
        return out

    def _find(self, addr: int) -> int:
        if addr < 0 or addr >= 1 << 64:
            return -1
        return int(np.searchsorted(self._index["start"], np.uint64(addr), side="right")) - 1

    def block_at(self, addr: int) -> Block | None:
        """The block whose payload [start, start+size) holds addr, or None."""
        i = self._find(addr)
        if i >= 0 and addr < int(self._end[i]):
            return self.block(i)
        return None

    def near(self, addr: int, window: int = NEAR_WINDOW) -> tuple[Block, int] | None:
        """(block, n) when addr is n bytes past the end of a block (0 = the first
        byte after it), within window bytes and not inside any block."""
        i = self._find(addr)
        if i < 0:
            return None
        end = int(self._end[i])
        if end <= addr < end + window:
            return self.block(i), addr - end
        return None

    @property
    def totals(self) -> Totals:
        st, size = self._index["state"], self._index["size"]
        live = st == abi.TAG_STATE_LIVE
        freed = st == abi.TAG_STATE_FREED
        return Totals(
            live_blocks=int(live.sum()),
            live_bytes=int(size[live].sum()),
            freed_blocks=int(freed.sum()),
            freed_bytes=int(size[freed].sum()),
        )


    def by_stack(self, state: str = "live") -> list[tuple[int, int, int]]:
        """[(alloc stack id, blocks, bytes)] of the blocks in state, most bytes first."""
        code = abi.TAG_STATE_LIVE if state == "live" else abi.TAG_STATE_FREED
        sel = self._index["state"] == code
        # Stack ids are dense indexes into the stack table: count by id
        # directly (O(n)), no sort of a million ids (np.unique was 0.2 s).
        stacks = self._index["alloc_stack"][sel]
        counts = np.bincount(stacks)
        nbytes = np.bincount(stacks, weights=self._index["size"][sel].astype(np.float64))
        ids = np.flatnonzero(counts)
        order = np.lexsort((ids, -nbytes[ids]))
        return [(int(ids[j]), int(counts[ids[j]]), int(nbytes[ids[j]])) for j in order]


def _empty() -> dict[str, np.ndarray]:
    return {k: np.empty(0, dt) for k, dt in _INDEX_FIELDS.items()}


def _check_ok(tag: np.ndarray, stack_time: np.ndarray, bits: np.ndarray, secret: int) -> np.ndarray:
    """Which tags' (or forward records') check validates over their address."""
    check = (bits & np.uint64(abi.TAG_CHECK_MASK)).astype(np.uint16)
    return check == abi.np_tag_check(tag, secret, bits, stack_time)


def _tag_ok(tag: np.ndarray, stack_time: np.ndarray, bits: np.ndarray, secret: int) -> np.ndarray:
    """Which tags validate: their check over their address, and state live or freed."""
    state = (bits >> np.uint64(abi.TAG_STATE_SHIFT)) & np.uint64(abi.TAG_STATE_MASK)
    return _check_ok(tag, stack_time, bits, secret) & (
        (state == abi.TAG_STATE_LIVE) | (state == abi.TAG_STATE_FREED))


_BLOCK_STATES = (abi.TAG_STATE_LIVE, abi.TAG_STATE_FREED)


def _tag_ok1(tag: int, stack_time: int, bits: int, secret: int, states: tuple[int, ...] = _BLOCK_STATES) -> bool:
    """One tag (or forward record: states (FORWARD,)) validates: its state, its check."""
    state = (bits >> abi.TAG_STATE_SHIFT) & abi.TAG_STATE_MASK
    want = abi.tag_check_fields(tag, secret, bits & ~abi.TAG_CHECK_MASK, stack_time & 0xFFFFFFFF, stack_time >> 32)
    return state in states and bits & abi.TAG_CHECK_MASK == want


def _entries(tag: np.ndarray, stack_time: np.ndarray, bits: np.ndarray, size: np.ndarray,
             guarded: np.ndarray) -> dict[str, np.ndarray]:
    """Index entries of validated tags (free records are attached later)."""
    n = len(tag)
    zero32 = np.zeros(n, np.uint32)
    return {
        "start": tag + np.uint64(abi.TAG_SIZE),
        "size": size.astype(np.uint64),
        "state": ((bits >> np.uint64(abi.TAG_STATE_SHIFT)) & np.uint64(abi.TAG_STATE_MASK)).astype(np.uint8),
        "tid": ((bits >> np.uint64(abi.TAG_TID_SHIFT)) & np.uint64(abi.TAG_TID_MASK)).astype(np.uint32),
        "alloc_time": (stack_time >> np.uint64(32)).astype(np.uint32),
        "alloc_stack": (stack_time & np.uint64(0xFFFFFFFF)).astype(np.uint32),
        "free_stack": zero32,
        "free_tid": zero32.copy(),
        "free_time": zero32.copy(),
        "free_ok": np.zeros(n, np.bool_),
        "alloc_kind": ((bits >> np.uint64(abi.TAG_ALLOC_SHIFT)) & np.uint64(abi.TAG_ALLOC_MASK)).astype(np.uint8),
        "guarded": guarded,
    }


def _addrs(addrs: list[int]) -> str:
    shown = ", ".join(f"{a:#x}" for a in addrs[:5])
    return shown + (f" and {len(addrs) - 5} more" if len(addrs) > 5 else "")


__all__ = ["CACHE_VERSION", "Heap", "Progress", "Totals"]