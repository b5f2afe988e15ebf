"""The heap of a libtag process: its blocks, stacks, threads and why it was dumped.

    heap = Heap(CoreMemory(core), cache_path=core.path + ".fxidx")
    block = heap.block_at(0x55d0c0a012a0)       # Block | None, binary search
    frames = heap.raw_stack(block.alloc_stack)  # [(pc, kind)], innermost first

How the blocks are found: every writable region but libtag's own
tables is scanned for tags in bulk with numpy.  A tag is 16-aligned (the user
pointer is, and the tag is the 32 bytes before it), so each region is viewed as
uint32 at a 16-byte stride, the magic's hits are gathered as 64-bit words, and
the check values are computed for all of them at once.  Overlaps are resolved
after: a tag inside an accepted block's extent is stale (recycled memory) and
dropped.  A live tag always wins over a freed one - libtag marks every block
freed before the real allocator gets it back, so a stale tag is always a freed
one - and between two freed ones the newer (free time, then alloc time) wins.

The index is a set of sorted numpy arrays; it is cached beside the core
(forensics.reader.cachefile: mapped, not read), keyed by the core's size and mtime,
so the next command skips the scan.

Everything read out of the process is bounded: a corrupt count, a wild pointer
or a truncated table becomes a warning in ``heap.warnings`` and a partial
answer, or a HeapFormatError when nothing sensible can be said.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from forensics.reader import abi, cachefile
from forensics.core.errors import CoreReadError
from forensics.core.notes import REG_NAMES
from forensics.errors import InputError
from forensics.reader.memory import Memory, Region, clip_regions
from forensics.reader.model import Anomaly, Block, Crash, RawFrame, ThreadState

CACHE_VERSION = 5  # 2: the smashed-canary answer is cached too; 3: forensics.reader.cachefile; 4: ABI 2;
#                   5: guarded blocks
MAX_STACK_NODES = 1 << 28  # options.c's bound on LIBTAG_STACK_NODES
MAX_THREADS = 1 << 16  # far above thread.c's THREAD_CAPACITY (16384)
NEAR_WINDOW = 64  # bytes past a block's end still reported as "near" it
_MAGIC_SLOTS = 1 << 18  # 16-byte slots compared for the magic at once (4 MiB: stays in cache)
_GATHER_SLOTS = 1 << 22  # slots whose candidates are gathered and validated at once (64 MiB)

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
    "guarded": np.bool_,  # abi.TAG_FLAG_GUARDED: in a slot of the guard pool
}


class HeapFormatError(InputError):
    """libtag's structures in this memory are corrupt beyond a partial answer."""


@dataclass(frozen=True)
class Totals:
    live_blocks: int
    live_bytes: int
    freed_blocks: int
    freed_bytes: int


Progress = Callable[[int, int], None]


class Heap:
    """The libtag view of one memory (a core, or a running process)."""

    def __init__(self, mem: Memory, *, progress: Progress | None = None,
                 cache_path: str | os.PathLike[str] | None = None, control=None) -> None:
        """control: what abi.find_control(mem) gave - (address, Control), or
        the NoLibtagError it raised - when the caller has looked already
        (Dump.open); None: look here."""
        self.mem = mem
        self.warnings: list[str] = []
        # A core cut short (full disk, interrupted copy) is read as far as it
        # goes, and the answer says which blocks it cannot see.
        cut = _truncation(mem)
        try:
            if control is None:
                control = abi.find_control(mem)
            if isinstance(control, abi.NoLibtagError):
                raise control
            self.control_addr, self.control = control
        except abi.NoLibtagError as exc:
            if cut:  # the control block may be in the part that is missing
                raise abi.NoLibtagError(f"{exc.message} - or it is in the missing part: {cut}") from None
            raise
        if cut:
            self.warnings.append(f"{cut}: blocks, stacks and threads there are not read")
        self._check_control()
        self.secret = int(self.control.secret)
        self._read_stack_table()
        self._threads: list[ThreadState] | None = None
        self.from_cache = False
        index = None
        cache_key = getattr(mem, "cache_key", None)
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
        self._index = index
        self._end = index["start"] + np.maximum(index["size"], 1)  # malloc(0) owns its start
        self._warn_smashed(smashed)

    # ------------------------------------------------------------- control --

    def _where(self) -> str:
        return getattr(self.mem, "name", "memory")

    def _check_control(self) -> None:
        c = self.control
        want = (abi.TAG_SIZE, abi.FREE_REC_SIZE, abi.TAG_CANARY_SIZE)
        have = (c.tag_size, c.free_rec_size, c.canary_size)
        if have != want:
            raise HeapFormatError(
                f"corrupt libtag control block at {self.control_addr:#x} in {self._where()}: "
                f"tag/free record/canary sizes {have}, expected {want}"
            )

    @property
    def reason(self) -> str:
        """Why this memory was dumped: "on-demand", "exit", an anomaly kind, "crash", or "none"."""
        return abi.reason_name(self.control.reason, self.control.anomaly.kind)

    @property
    def pid(self) -> int:
        return int(self.control.pid)

    @property
    def payload_omitted(self) -> bool:
        """The snapshot was taken with LIBTAG_PAYLOAD=omit: block contents are
        blank in this memory (tags, stacks and threads are all there)."""
        return bool(int(self.control.options) & abi.TAG_OPTION_NO_PAYLOAD)

    @property
    def anomaly(self) -> Anomaly | None:
        """The anomaly recorded in the control block, None if there is none."""
        a = self.control.anomaly
        if a.kind == abi.TAG_ANOMALY_NONE:
            return None
        kind = abi.ANOMALY_NAMES.get(a.kind, f"anomaly-{a.kind}")
        block = None
        if a.tag.magic == abi.TAG_MAGIC and a.block:
            block = self._block_from_copy(int(a.block), a.tag, a.free_rec, kind)
        c = self.control
        return Anomaly(
            kind=kind,
            address=int(a.address),
            thread=int(a.tid),
            stack=int(a.stack),
            time_ms=int(a.time),
            block=block,
            block_address=int(a.block) or None,
            # a fault is recorded before the access runs: nothing written yet
            written=None if a.access else self._written(kind, int(a.address), block, a.tag),
            dealloc=abi.DEALLOC_NAMES.get(int(a.dealloc)) if a.kind == abi.TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH
            else None,
            access=abi.ACCESS_NAMES.get(int(a.access)),
            pc=int(a.pc) or None,
            time_ns=int(c.start_realtime_ns) + int(a.time) * 1_000_000,
        )

    _WRITTEN_MAX = 16  # bytes of a damaged run shown

    def _written(self, kind: str, address: int, block: Block | None, tag: Any) -> bytes | None:
        """The bytes the program wrote where it must not, from the first
        damaged byte (address) on, as this memory holds them: through the last
        byte that differs from what libtag left there (the free pattern, the
        tag as it was) or, for an overflow, the rest of the canary; up to
        _WRITTEN_MAX bytes.  None when unknown (payload omitted, the memory
        not in the core, the original not known)."""
        if block is None or self.payload_omitted and kind == "use-after-free":
            return None
        if kind == "use-after-free":
            lo = block.start
            want = bytes([abi.TAG_FREE_PATTERN]) * min(block.size, int(self.control.quarantine_fill))
        elif kind == "heap-overflow":
            lo = block.end
            want = abi.tag_canary_value(block.tag_addr, self.secret).to_bytes(8, "little")
        elif kind == "heap-underflow":
            lo = block.tag_addr
            want = abi.Tag.build(tag)
        else:
            return None
        off = address - lo
        if not 0 <= off < len(want):
            return None
        try:
            have = self.mem.read(lo, len(want))
        except InputError:
            return None
        window = min(len(want), off + self._WRITTEN_MAX)
        if kind == "heap-overflow":
            # the whole canary from the first damaged byte: a written byte
            # that happens to equal the canary's is still one the program wrote
            end = window
        else:
            # through the last byte that differs: an equal byte inside the run
            # was written too (with the value that was there)
            end = max((i + 1 for i in range(off, window) if have[i] != want[i]), default=off)
        return have[off:end] or None

    def _block_from_copy(self, user: int, tag: Any, rec: Any, kind: str) -> Block | None:
        """The block an anomaly's tag copy describes; None (with a warning)
        when the copy does not validate - libtag found the tag damaged beyond
        repair, and its size, stacks and thread are unknown."""
        tag_addr = user - abi.TAG_SIZE
        if abi.tag_check_value(tag_addr, self.secret, tag) != tag.check:
            self.warnings.append(
                f"{kind} at {user:#x}: the block's tag was damaged beyond repair; "
                f"its size, stacks and thread are unknown")
            return None
        state = (tag.size_state >> abi.TAG_STATE_SHIFT) & 0xFF
        freed = state == abi.TAG_STATE_FREED
        rec_ok = freed and abi.free_rec_check_value(tag_addr, self.secret, rec) == rec.check
        return Block(
            start=user,
            size=int(tag.size_state & abi.TAG_SIZE_MASK),
            state="freed" if freed else "live",
            thread=int(tag.alloc_tid),
            alloc_time_ms=int(tag.alloc_time),
            alloc_stack=int(tag.alloc_stack),
            free_thread=int(rec.free_tid) if rec_ok else None,
            free_time_ms=int(rec.free_time) if rec_ok else None,
            free_stack=int(rec.free_stack) if rec_ok else None,
            tag_addr=tag_addr,
            alloc_kind=abi.ALLOC_KIND_NAMES.get(
                (tag.size_state >> abi.TAG_ALLOC_SHIFT) & abi.TAG_ALLOC_MASK, "unknown"),
            guarded=bool(tag.size_state & abi.TAG_FLAG_GUARDED),
        )

    @property
    def crash(self) -> Crash | None:
        c = self.control.crash
        if not c.signal:
            return None
        return Crash(signal=int(c.signal), address=int(c.address), thread=int(c.tid),
                     code=int(c.code), stack=int(c.stack), time_ms=int(c.time))

    @property
    def taken_ms(self) -> int | None:
        """When this memory was dumped, in libtag's ms: the snapshot's time,
        else the crash's; None when libtag recorded neither."""
        reason = self.reason
        if reason == "crash":
            return self.crash.time_ms if self.crash is not None else None
        if reason == "none" or reason.startswith("reason-"):
            return None  # not dumped by libtag (gcore ...): when is unknown
        return int(self.control.snapshot_time_ms)

    @property
    def counters(self) -> dict[str, int]:
        """Process counters: sums over the thread records, and the control block's."""
        ts = self.threads
        c = self.control
        return {
            "allocs": sum(t.allocs for t in ts),
            "frees": sum(t.frees for t in ts),
            "alloc_bytes": sum(t.alloc_bytes for t in ts),
            "free_bytes": sum(t.free_bytes for t in ts),
            "threads": len(ts),
            "anomalies": int(c.anomaly_count),
            "stack_nodes": len(self._nodes),
            "stack_full": int(c.stack_full),
            "shadow_overflows": int(c.shadow_overflows),
            "snapshot_seq": int(c.snapshot_seq),
            "latent_uaf": int(c.latent_uaf),
            "damaged_leaked": int(c.damaged_leaked),
            "damaged_bytes": int(c.damaged_bytes),
            "guard_rate": int(c.guard_rate),
            "guard_slots_used": int(c.guard_used),
            "guard_faults": int(c.guard_faults),
        }

    # -------------------------------------------------------------- reading --

    def _region_of(self, addr: int) -> Region | None:
        for r in self.mem.regions():
            if addr in r:
                return r
        return None

    def _read_array(self, addr: int, count: int, itemsize: int, what: str) -> bytes:
        """Up to count items at addr, in one read; fewer (with a warning) if the
        memory ends first."""
        if count <= 0 or not addr:
            return b""
        region = self._region_of(addr)
        if region is None:
            self.warnings.append(f"{what} at {addr:#x} is not in {self._where()}")
            return b""
        fit = min(count, (region.end - addr) // itemsize)
        if fit < count:
            self.warnings.append(
                f"{what} at {addr:#x} claims {count} entries but its mapping holds {fit}"
            )
        while fit > 0:
            try:
                return self.mem.read(addr, fit * itemsize)
            except CoreReadError as exc:
                # e.g. a truncated core: keep what lies before the failure
                got = (exc.addr - addr) // itemsize if addr < exc.addr < addr + fit * itemsize else 0
                self.warnings.append(f"{what} at {addr:#x}: only {got} of {count} entries readable")
                fit = got
        return b""

    def _read_stack_table(self) -> None:
        c = self.control
        count = int(c.stack_count)
        bound = min(int(c.stack_capacity), MAX_STACK_NODES)
        if count > bound:
            self.warnings.append(
                f"stack table count {count} exceeds its capacity {c.stack_capacity}: read {bound}"
            )
            count = bound
        raw = self._read_array(int(c.stack_nodes), count, abi.STACK_NODE_SIZE, "the stack table")
        self._nodes = np.frombuffer(raw, dtype=abi.STACK_NODE_DTYPE)

    @property
    def stack_count(self) -> int:
        return len(self._nodes)

    def raw_stack(self, stack_id: int) -> list[RawFrame]:
        """The frames of stack stack_id as (pc, kind), innermost first.

        Follows parent links to the root; a parent must have a smaller id (nodes
        are appended after their parent), so a corrupt table ends the walk
        instead of looping.  Unknown ids give [].
        """
        nodes, out = self._nodes, []
        i, n = int(stack_id), len(self._nodes)
        # A lying table is a warning, never a silently short stack, and the
        # walk stops at the first node that cannot be trusted: an id beyond
        # the table, a frame kind the symbolizer does not know, a parent link
        # that does not go down.
        if i >= n and n:
            self._warn_once(f"stack id {i} is beyond the stack table's {n} nodes: its frames are unknown")
        while 0 < i < n:
            node = nodes[i]
            kind = int(node["kind"])
            if kind not in abi.FRAME_KIND_NAMES:
                self._warn_once(f"corrupt stack table: node {i} has unknown frame kind {kind}; "
                                f"stack {stack_id} is cut there")
                break
            out.append((int(node["pc"]), kind))
            parent = int(node["parent"])
            if parent >= i:
                self._warn_once(f"corrupt stack table: node {i}'s parent {parent} is not below it "
                                f"(a cycle or a forward link); stack {stack_id} is cut there")
                break
            i = parent
        return out

    def _warn_once(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    @property
    def threads(self) -> list[ThreadState]:
        """libtag's thread records (tid != 0), with each live thread's shadow stack."""
        if self._threads is None:
            self._threads = self._read_threads()
        return self._threads

    def thread(self, tid: int) -> ThreadState | None:
        return next((t for t in self.threads if t.tid == tid), None)

    @property
    def _quarantines(self) -> list[int]:
        """Addresses of the threads' quarantine rings (0s left out)."""
        recs = self.thread_records()
        return [int(q) for q in recs["quarantine"] if q] if recs is not None else []

    def libtag_tls_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of libtag's per-thread block (control.thread_state_bytes from
        each thread record's shadow address) in every thread that has one."""
        recs = self.thread_records()
        size = int(self.control.thread_state_bytes)
        if recs is None or not size:
            return []
        return [(int(a), int(a) + size) for a, tid in zip(recs["shadow"], recs["tid"]) if a and tid]

    def thread_records(self) -> np.ndarray | None:
        """libtag's thread records as they are (abi.THREAD_RECORD_DTYPE, unused
        slots included), read once; None if they cannot be read."""
        if not hasattr(self, "_recs"):
            c = self.control
            count = min(int(c.thread_count), int(c.thread_capacity), MAX_THREADS)
            try:
                raw = self._read_array(int(c.threads), count, abi.THREAD_RECORD_SIZE,
                                       "the thread records")
                self._recs = np.frombuffer(raw, dtype=abi.THREAD_RECORD_DTYPE)
            except InputError:
                self._recs = None
        return self._recs

    def _read_threads(self) -> list[ThreadState]:
        c = self.control
        count = min(int(c.thread_count), int(c.thread_capacity), MAX_THREADS)
        if count < int(c.thread_count):
            self.warnings.append(f"thread count {c.thread_count} exceeds the records' capacity")
        raw = self._read_array(int(c.threads), count, abi.THREAD_RECORD_SIZE, "the thread records")
        recs = np.frombuffer(raw, dtype=abi.THREAD_RECORD_DTYPE)
        out = []
        for r in recs:
            tid, flags = int(r["tid"]), int(r["flags"])
            if tid == 0:
                continue
            regs = None
            if flags & abi.TAG_THREAD_REGS:
                regs = dict(zip(REG_NAMES, (int(v) for v in r["regs"]), strict=True))
            frames, depth, sps, fns = [], 0, [], []
            if r["shadow"] and not flags & abi.TAG_THREAD_EXITED:
                frames, depth, sps, fns = self._read_shadow(int(r["shadow"]), tid)
            out.append(ThreadState(
                tid=tid, flags=flags, regs=regs, shadow=frames, shadow_depth=depth, shadow_sp=sps,
                shadow_fn=fns,
                stack_hi=int(r["stack_hi"]), allocs=int(r["allocs"]), frees=int(r["frees"]),
                alloc_bytes=int(r["alloc_bytes"]), free_bytes=int(r["free_bytes"]),
            ))
        return out

    def _read_shadow(self, addr: int, tid: int) -> tuple[list[RawFrame], int, list[int], list[int]]:
        """A thread's shadow stack as shadow_stack.c's capture_shadow sees it:
        [fn[d-1] (ENTRY), site[d-1], ..., site[0]] innermost first, its depth,
        and for each site, in the same order, sp (the CFA of the frame the
        site returns from; the site is stored at sp - 8; bit 0 set: a lower
        bound only) and fn (the entry of the function of that frame)."""
        at = abi.SHADOW_OFFSETS
        try:
            raw = self.mem.read(addr, at["sp"] + 8 * abi.TAG_SHADOW_MAX)
        except CoreReadError:
            self.warnings.append(f"the shadow stack of thread {tid} at {addr:#x} is not readable")
            return [], 0, [], []
        depth = int.from_bytes(raw[at["depth"]:at["depth"] + 4], "little")
        d = min(depth, abi.TAG_SHADOW_MAX)
        if d == 0:
            return [], depth, [], []
        fn = np.frombuffer(raw, "<u8", abi.TAG_SHADOW_MAX, at["fn"])
        site = np.frombuffer(raw, "<u8", abi.TAG_SHADOW_MAX, at["site"])
        sp = np.frombuffer(raw, "<u8", abi.TAG_SHADOW_MAX, at["sp"])
        frames = [(int(fn[d - 1]), abi.TAG_FRAME_ENTRY)]
        frames += [(int(pc), abi.TAG_FRAME_CALL) for pc in site[:d][::-1]]
        return frames, depth, [int(v) for v in sp[:d][::-1]], [int(v) for v in fn[:d][::-1]]

    # ----------------------------------------------------------------- scan --

    def own_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of libtag's own memory: the stack table, the thread
        records, the control block, every thread's quarantine ring and
        libtag's per-thread TLS block.  They hold ids, counters and pointers
        to freed blocks - never the program's blocks or references - so scans
        (and whoowns' referrers) leave them out, byte-exactly (libtag
        fences them with guard pages, but an older core may have merged VMAs)."""
        c = self.control
        out = [
            (int(c.stack_nodes), int(c.stack_nodes) + abi.STACK_NODE_SIZE * int(c.stack_capacity)),
            (int(c.threads), int(c.threads) + abi.THREAD_RECORD_SIZE * int(c.thread_capacity)),
            (self.control_addr, self.control_addr + abi.CONTROL_SIZE),
        ]
        if int(c.stack_stats):
            out.append((int(c.stack_stats),
                        int(c.stack_stats) + abi.STACK_STATS_SIZE * int(c.stack_capacity)))
        for q in self._quarantines:
            out.append((q, q + abi.TAG_QUARANTINE_BYTES))
        out += self.libtag_tls_ranges()
        if int(c.guard_slots):
            out.append((int(c.guard_slots),
                        int(c.guard_slots) + abi.GUARD_SLOT_SIZE * int(c.guard_capacity)))
        # Each table lies in its own mapping, so a range never extends past
        # the region its start is in: a corrupt capacity (0xffffffff) must not
        # make the scans skip the program's heap and stacks after it.
        clipped = []
        for a, b in out:
            region = self._region_of(a) if a else None
            if region is not None:
                clipped.append((a, min(b, region.end)))
        return clipped

    def _in_guard_pool(self, r: Region) -> bool:
        """Does r lie in the guard pool?  Its freed slots are inaccessible in
        the process (read-only or unreadable in a core the kernel wrote), and
        hold blocks all the same."""
        lo = int(self.control.guard_pool)
        return lo <= r.start and r.end <= lo + int(self.control.guard_pool_bytes)

    def _scan_regions(self) -> list[Region]:
        return clip_regions([r for r in self.mem.regions() if r.writable or self._in_guard_pool(r)],
                            self.own_ranges())

    def _scan(self, progress: Progress | None) -> dict[str, np.ndarray]:
        regions = self._scan_regions()
        total = sum(r.size for r in regions)
        done = 0
        if progress:
            progress(0, total)
        parts = []
        for region in regions:
            try:
                part = self._scan_region(region)
            except CoreReadError as exc:
                self.warnings.append(f"region {region.start:#x}-{region.end:#x} not scanned: {exc}")
                part = None
            if part is not None:
                parts.append(part)
            done += region.size
            if progress:
                progress(done, total)
        if not parts:
            return {k: np.empty(0, dt) for k, dt in _INDEX_FIELDS.items()}
        index = {k: np.concatenate([p[k] for p in parts]) for k in _INDEX_FIELDS}
        st = index["start"]
        if len(st) > 1 and np.any(st[1:] <= st[:-1]):  # regions come sorted; be sure
            order = np.argsort(st, kind="stable")
            index = {k: v[order] for k, v in index.items()}
        return index

    def _ring_entries(self) -> np.ndarray:
        """Every current entry of every thread's quarantine ring (abi.QENTRY_DTYPE):
        the freed blocks libtag still holds and who freed each."""
        out = []
        for q in self._quarantines:
            raw = self._read_array(q, 1, abi.TAG_QUARANTINE_BYTES, "a quarantine ring")
            if len(raw) < abi.TAG_QUARANTINE_BYTES:
                continue
            head, count = int.from_bytes(raw[0:4], "little"), int.from_bytes(raw[4:8], "little")
            if head >= abi.TAG_QUARANTINE_SLOTS or count > abi.TAG_QUARANTINE_SLOTS:
                self._warn_once(f"corrupt quarantine ring at {q:#x} (head {head}, count {count}): "
                                f"the free records it holds are not read")
                continue
            e = np.frombuffer(raw, abi.QENTRY_DTYPE, abi.TAG_QUARANTINE_SLOTS, 16)
            out.append(e[(head + np.arange(count)) % abi.TAG_QUARANTINE_SLOTS])
        out.append(self._guard_entries())
        return np.concatenate(out)

    def _guard_entries(self) -> np.ndarray:
        """The free records of the freed guarded blocks, from the guard
        pool's slot records, as ring entries (abi.QENTRY_DTYPE)."""
        c = self.control
        count = min(int(c.guard_used), int(c.guard_capacity))
        raw = self._read_array(int(c.guard_slots), count, abi.GUARD_SLOT_SIZE, "the guard slot records")
        slots = np.frombuffer(raw, abi.GUARD_SLOT_DTYPE)
        slots = slots[slots["state"] == abi.TAG_GUARD_FREED]
        e = np.zeros(len(slots), abi.QENTRY_DTYPE)
        e["user"] = slots["user"]
        for name in ("free_stack", "free_tid", "free_time", "check"):
            e[name] = slots["rec"][name]
        return e

    def _attach_free_records(self, index: dict[str, np.ndarray]) -> None:
        """Fill the free_* fields of the freed blocks from the rings' entries
        whose record validates for that block (libtag keeps a free record
        outside the block, so no write into the freed payload can erase it)."""
        if not hasattr(self, "_ring"):
            self._ring = self._ring_entries()
        e = self._ring
        if not len(e) or not len(index["start"]):
            return
        user = e["user"]
        stack_tid = (e["free_tid"].astype(np.uint64) << np.uint64(32)) | e["free_stack"].astype(np.uint64)
        ok = e["check"] == abi.np_free_rec_check(user - np.uint64(abi.TAG_SIZE), self.secret, stack_tid,
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

    def _scan_region(self, region: Region) -> dict[str, np.ndarray] | None:
        arr = region.array
        n16 = len(arr) // 16
        if n16 < 3:
            return None
        u64 = arr[: n16 * 16].view("<u8")
        words32 = u64.view("<u4")
        # rows[k] = the 32 bytes of a tag at slot k.  Overlapping rows: one
        # fancy index gathers every candidate at once.
        rows = np.lib.stride_tricks.as_strided(u64, shape=(n16 - 1, 4), strides=(16, 8), writeable=False)
        parts = []
        for lo in range(0, n16 - 1, _GATHER_SLOTS):
            hi = min(lo + _GATHER_SLOTS, n16 - 1)
            ks = [
                np.flatnonzero(words32[c * 4 : min(c + _MAGIC_SLOTS, hi) * 4 : 4] == abi.TAG_MAGIC) + c
                for c in range(lo, hi, _MAGIC_SLOTS)
            ]
            k = np.concatenate(ks)
            if len(k):
                part = self._validate(region.start, len(u64) * 8, k, rows[k])
                if part is not None:
                    parts.append(part)
        if not parts:
            return None
        index = {key: np.concatenate([p[key] for p in parts]) for key in _INDEX_FIELDS}
        self._attach_free_records(index)  # before overlaps: the newer freed tag wins
        keep = _resolve_overlaps(index)
        if keep is not None:
            index = {key: v[keep] for key, v in index.items()}
        return index

    def _validate(self, base: int, length: int, k: np.ndarray, g: np.ndarray) -> dict[str, np.ndarray] | None:
        """The index entries of the candidates at 16-byte slots k of a region at
        base (length bytes), whose tags are g (m x 4 words).  Free records
        are filled in later, from the quarantine rings."""
        off = k.astype(np.uint64) << np.uint64(4)
        tag_addr = off + np.uint64(base)
        g32 = g.view("<u4")  # m x 8: magic, check, size_state (2), stack, tid, time, pad
        size_state = g[:, 1]
        ok = g32[:, 1] == abi.np_tag_check(tag_addr, self.secret, size_state, g[:, 2], g[:, 3])
        # bits 48..55 the state; 56..60 flags and the alloc kind; 61..63 must be 0
        state64 = (size_state & ~np.uint64(abi.TAG_FLAG_BITS)) >> np.uint64(abi.TAG_STATE_SHIFT)
        ok &= (state64 == abi.TAG_STATE_LIVE) | (state64 == abi.TAG_STATE_FREED)
        size = size_state & np.uint64(abi.TAG_SIZE_MASK)
        room = np.uint64(length - abi.TAG_SIZE) - off  # payload bytes left in the region
        ok &= np.maximum(size, np.uint64(abi.TAG_MIN_PAYLOAD)) <= room
        sel = np.flatnonzero(ok)
        if not len(sel):
            return None
        if len(sel) < len(ok):  # usually every candidate is a tag: no second copy then
            g32, tag_addr, size, state64, size_state = (
                g32[sel], tag_addr[sel], size[sel], state64[sel], size_state[sel])
        n = len(size)
        zero32 = np.zeros(n, np.uint32)
        return {
            "start": tag_addr + np.uint64(abi.TAG_SIZE),
            "size": size,
            "state": state64.astype(np.uint8),
            "tid": g32[:, 5].copy(),
            "alloc_time": g32[:, 6].copy(),
            "alloc_stack": g32[:, 4].copy(),
            "free_stack": zero32,
            "free_tid": zero32.copy(),
            "free_time": zero32.copy(),
            "free_ok": np.zeros(n, np.bool_),
            "alloc_kind": ((size_state >> np.uint64(abi.TAG_ALLOC_SHIFT)) & np.uint64(abi.TAG_ALLOC_MASK)
                           ).astype(np.uint8),
            "guarded": (size_state & np.uint64(abi.TAG_FLAG_GUARDED)) != 0,
        }

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
                want = abi.np_tag_canary(x["start"][sel] - np.uint64(abi.TAG_SIZE), self.secret)
                smashed.extend(sel[got != want].tolist())
        return np.array(smashed, dtype=np.int64)

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
        meta = [CACHE_VERSION, key[0], key[1], self.control_addr, self.secret]
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
        index["smashed"] = smashed
        return index

    def _write_cache(self, path: str, key: tuple[int, int], index: dict[str, np.ndarray]) -> None:
        meta = [CACHE_VERSION, key[0], key[1], self.control_addr, self.secret]
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
        if block.state != "freed" or self.payload_omitted:
            return None
        n = min(block.size, int(self.control.quarantine_fill))
        if n <= 0:
            return None
        region = self._region_of(block.start)
        if region is None or block.start + n > region.end:
            return None
        arr = region.array
        lo = block.start - region.start
        if lo + n > len(arr):
            return None  # the region's bytes are not all in this memory
        bad = np.flatnonzero(arr[lo:lo + n] != abi.TAG_FREE_PATTERN)
        if not len(bad):
            return None
        off = int(bad[0])
        return off, self._written("use-after-free", block.start + off, block, None)

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

    def stack_stats(self) -> np.ndarray | None:
        """libtag's per-stack counters (abi.STACK_STATS_DTYPE: live_bytes,
        peak_bytes, temporaries, allocs), indexed by stack id, one per stack
        in the table; None when libtag did not record them (control
        stack_stats 0) or they cannot be read."""
        if not hasattr(self, "_stack_stats"):
            c = self.control
            self._stack_stats = None
            if int(c.stack_stats):
                count = min(int(c.stack_count), int(c.stack_capacity))
                raw = self._read_array(int(c.stack_stats), count, abi.STACK_STATS_SIZE,
                                       "the per-stack counters")
                if raw:
                    self._stack_stats = np.frombuffer(raw, dtype=abi.STACK_STATS_DTYPE)
        return self._stack_stats

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


def _truncation(mem: Memory) -> str | None:
    """What a core cut short lost ("truncated core: ..."), None if it is whole
    (or mem is not a core)."""
    core = getattr(mem, "core", None)
    cut = [s for s in getattr(core, "segments", ()) if s.truncated]
    if not cut:
        return None
    lost = sum(min(s.filesz, s.memsz) - s.dumped for s in cut)
    return (f"truncated core: {core.path} is {core.file_size} bytes and lacks {lost} bytes "
            f"of {len(cut)} segments from {cut[0].vaddr:#x} on")


def _resolve_overlaps(index: dict[str, np.ndarray]) -> np.ndarray | None:
    """Keep-mask after dropping stale tags (None when nothing overlaps).

    Candidates are sorted by address.  Only clusters of candidates whose tags
    fall inside an earlier candidate's extent are resolved one by one, so the
    per-candidate Python work is limited to the (rare) overlaps.
    """
    start = index["start"].view(np.int64)  # user addresses are < 2^63
    n = len(start)
    if n < 2:
        return None
    tag = start - abi.TAG_SIZE
    size = index["size"].view(np.int64)
    end = start + np.maximum(size + abi.TAG_CANARY_SIZE, abi.TAG_MIN_PAYLOAD)
    conflict = np.zeros(n, dtype=bool)
    conflict[1:] = tag[1:] < np.maximum.accumulate(end)[:-1]
    if not conflict.any():
        return None
    keep = np.ones(n, dtype=bool)
    cluster_starts = np.flatnonzero(~conflict)
    bounds = np.append(cluster_starts, n)
    first_of = np.unique(cluster_starts[np.searchsorted(cluster_starts, np.flatnonzero(conflict), "right") - 1])
    state, ftime, atime = index["state"], index["free_time"], index["alloc_time"]
    for s in first_of.tolist():
        e = int(bounds[np.searchsorted(bounds, s, "right")])
        accepted: list[int] = []
        for i in range(s, e):
            if accepted and tag[i] < end[accepted[-1]]:
                j = accepted[-1]
                if _newer(i, j, state, ftime, atime):
                    keep[j] = False
                    accepted[-1] = i
                else:
                    keep[i] = False
            else:
                accepted.append(i)
    return keep


def _newer(i: int, j: int, state: np.ndarray, ftime: np.ndarray, atime: np.ndarray) -> bool:
    """Does candidate i (inside j's extent) replace j?  A live tag is never
    stale; between two freed tags the later-freed (then later-allocated) is
    the current one; two live tags cannot overlap, keep the outer one."""
    li, lj = state[i] == abi.TAG_STATE_LIVE, state[j] == abi.TAG_STATE_LIVE
    if li != lj:
        return bool(li)
    if li:
        return False
    return (int(ftime[i]), int(atime[i])) > (int(ftime[j]), int(atime[j]))


__all__ = ["CACHE_VERSION", "Heap", "HeapFormatError", "Progress", "Totals"]
