"""What libtag holds in one memory: its control block and everything that
hangs off it - why the memory was dumped, the anomaly and crash records, the
counters, the stack table, the thread records with their shadow stacks, the
quarantine rings and the guard pool's slot records.

    control = Control(CoreMemory(core))
    control.reason                             # "on-demand", "crash", ...
    frames = control.raw_stack(stack_id)       # [(pc, kind)], innermost first
    heap = Heap(control)                       # the block index (reader/heap.py)

The blocks themselves are not here: forensics.reader.heap.Heap walks
libtag's heap from what this object reads of it (the heap's header and
slice table, the guard pool's slot records, the secret, the free records
libtag holds).

Everything read out of the process is bounded: a corrupt count, a wild pointer
or a truncated table becomes a warning in ``control.warnings`` and a partial
answer, or a HeapFormatError when nothing sensible can be said.
"""

from __future__ import annotations

from typing import Any

from forensics._np import np

from forensics.core.errors import CoreReadError
from forensics.arch import HOST
from forensics.errors import InputError
from forensics.reader import abi
from forensics.reader.memory import Memory, Region
from forensics.reader.model import Anomaly, Block, Crash, RawFrame, Thread

MAX_STACK_NODES = 1 << 28  # options.c's bound on LIBTAG_STACK_NODES
MAX_THREADS = 1 << 16  # far above thread.c's THREAD_CAPACITY (16384)
MAX_SLICES = 1 << 26  # 4 TiB of 64 KiB slices: a bound on a corrupt heap.used


class HeapFormatError(InputError):
    """libtag's structures in this memory are corrupt beyond a partial answer."""


class Control:
    """libtag's control block in one memory (a core, or a running process),
    and the tables it points to."""

    def __init__(self, mem: Memory, found=None, arch=None) -> None:
        """found: what abi.find_control(mem) gave - (address, abi.Control
        fields), or the NoLibtagError it raised - when the caller has looked
        already (Dump.open); None: look here.  arch: the machine
        (forensics.arch) whose registers the thread records hold; None: a
        core's own, else this host's."""
        self.mem = mem
        core = getattr(mem, "core", None)
        self.arch = arch or (core.arch if core is not None else HOST)
        # what could not be read or trusted, in the order found; the Heap
        # built from this object adds to the same list
        self.warnings: list[str] = []
        # A core cut short (full disk, interrupted copy) is read as far as it
        # goes, and the answer says which blocks it cannot see.
        cut = truncation(mem)
        try:
            if found is None:
                found = abi.find_control(mem)
            if isinstance(found, abi.NoLibtagError):
                raise found
            self.addr, self.fields = found
        except abi.NoLibtagError as exc:
            if cut:  # the control block may be in the part that is missing
                raise abi.NoLibtagError(f"{exc.message} - or it is in the missing part: {cut}") from None
            raise
        if cut:
            self.warnings.append(f"{cut}: blocks, stacks and threads there are not read")
        self._check_control()
        self.secret = int(self.fields.secret)
        self._read_stack_table()
        self._threads: list[Thread] | None = None

    # -------------------------------------------------- the control block --

    def _where(self) -> str:
        return getattr(self.mem, "name", "memory")

    def _check_control(self) -> None:
        c = self.fields
        want = (abi.TAG_SIZE, abi.FREE_REC_SIZE, abi.TAG_CANARY_SIZE)
        have = (c.tag_size, c.free_rec_size, c.canary_size)
        if have != want:
            raise HeapFormatError(
                f"corrupt libtag control block at {self.addr:#x} in {self._where()}: "
                f"tag/free record/canary sizes {have}, expected {want}"
            )

    @property
    def reason(self) -> str:
        """Why this memory was dumped: "on-demand", "exit", an anomaly kind, "crash", or "none"."""
        return abi.reason_name(self.fields.reason, self.fields.anomaly.kind)

    @property
    def pid(self) -> int:
        return int(self.fields.pid)

    @property
    def payload_omitted(self) -> bool:
        """The snapshot was taken with LIBTAG_PAYLOAD=omit: block contents are
        blank in this memory (tags, stacks and threads are all there)."""
        return bool(int(self.fields.options) & abi.TAG_OPTION_NO_PAYLOAD)

    @property
    def anomaly(self) -> Anomaly | None:
        """The anomaly recorded in the control block, None if there is none."""
        a = self.fields.anomaly
        if a.kind == abi.TAG_ANOMALY_NONE:
            return None
        kind = abi.ANOMALY_NAMES.get(a.kind, f"anomaly-{a.kind}")
        block = None
        # "no tag copy" is an all-zero tag (state NONE)
        if (int(a.tag.bits) or int(a.tag.alloc_stack) or int(a.tag.alloc_time)) and a.block:
            block = self._block_from_copy(int(a.block), a.tag, a.free_rec, kind)
        c = self.fields
        return Anomaly(
            kind=kind,
            address=int(a.address),
            thread=int(a.tid),
            stack=int(a.stack),
            time_ms=int(a.time),
            block=block,
            block_address=int(a.block) or None,
            # a fault is recorded before the access runs: nothing written yet
            written=None if a.access else self.written(kind, int(a.address), block, a.tag),
            dealloc=abi.DEALLOC_NAMES.get(int(a.dealloc)) if a.kind == abi.TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH
            else None,
            access=abi.ACCESS_NAMES.get(int(a.access)),
            pc=int(a.pc) or None,
            time_ns=int(c.start_realtime_ns) + int(a.time) * 1_000_000,
        )

    _WRITTEN_MAX = 16  # bytes of a damaged run shown

    def written(self, kind: str, address: int, block: Block | None, tag: Any) -> bytes | None:
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
            want = bytes([abi.TAG_FREE_PATTERN]) * min(block.size, int(self.fields.quarantine_fill))
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
        if abi.tag_check_value(tag_addr, self.secret, tag) != abi.tag_check_of(tag) or \
                abi.tag_state_of(tag) not in (abi.TAG_STATE_LIVE, abi.TAG_STATE_FREED):
            self._warn_once(
                f"{kind} at {user:#x}: the block's tag was damaged beyond repair; "
                f"its size, stacks and thread are unknown")
            return None
        freed = abi.tag_state_of(tag) == abi.TAG_STATE_FREED
        rec_ok = freed and abi.free_rec_check_value(tag_addr, self.secret, rec) == rec.check
        size = abi.tag_size_field(tag)
        if size == abi.TAG_SIZE_BIG:
            size = self.large_size(tag_addr)
        return Block(
            start=user,
            size=size,
            state="freed" if freed else "live",
            thread=abi.tag_tid_of(tag),
            alloc_time_ms=int(tag.alloc_time),
            alloc_stack=int(tag.alloc_stack),
            free_thread=int(rec.free_tid) if rec_ok else None,
            free_time_ms=int(rec.free_time) if rec_ok else None,
            free_stack=int(rec.free_stack) if rec_ok else None,
            tag_addr=tag_addr,
            alloc_kind=abi.ALLOC_KIND_NAMES.get(abi.tag_kind_of(tag), "unknown"),
            guarded=self.in_guard_pool_addr(user),
        )

    @property
    def crash(self) -> Crash | None:
        c = self.fields.crash
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
        return int(self.fields.snapshot_time_ms)

    @property
    def counters(self) -> dict[str, int]:
        """Process counters: sums over the thread records, and the control block's."""
        ts = self.threads
        c = self.fields
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

    def region_of(self, addr: int) -> Region | None:
        for r in self.mem.regions():
            if addr in r:
                return r
        return None

    def _read_array(self, addr: int, count: int, itemsize: int, what: str) -> bytes:
        """Up to count items at addr, in one read; fewer (with a warning) if the
        memory ends first."""
        if count <= 0 or not addr:
            return b""
        region = self.region_of(addr)
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
        c = self.fields
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
    def threads(self) -> list[Thread]:
        """libtag's thread records (tid != 0), with each live thread's shadow
        stack, as Threads with the record's fields only (regs, sp and
        stack_region are Dump.threads' to decide)."""
        if self._threads is None:
            self._threads = self._read_threads()
        return self._threads

    def thread(self, tid: int) -> Thread | None:
        return next((t for t in self.threads if t.tid == tid), None)

    @property
    def _quarantines(self) -> list[int]:
        """Addresses of the threads' quarantine rings (0s left out)."""
        recs = self.thread_records()
        return [int(q) for q in recs["quarantine"] if q] if recs is not None else []

    def libtag_tls_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of libtag's per-thread block (control.thread_state_bytes from
        each thread record's shadow address) in every thread that has one.
        A record whose block would run past the end of the address space (a
        damaged shadow address) has none: its shadow stack is reported
        unreadable (_read_shadow), and scans exclude nothing for it."""
        recs = self.thread_records()
        size = int(self.fields.thread_state_bytes)
        if recs is None or not size:
            return []
        return [(int(a), int(a) + size) for a, tid in zip(recs["shadow"], recs["tid"])
                if a and tid and int(a) + size <= 1 << 64]

    def thread_records(self) -> np.ndarray | None:
        """libtag's thread records as they are (abi.THREAD_RECORD_DTYPE, unused
        slots included), read once; None if they cannot be read."""
        if not hasattr(self, "_recs"):
            c = self.fields
            count = min(int(c.thread_count), int(c.thread_capacity), MAX_THREADS)
            try:
                raw = self._read_array(int(c.threads), count, abi.THREAD_RECORD_SIZE,
                                       "the thread records")
                self._recs = np.frombuffer(raw, dtype=abi.THREAD_RECORD_DTYPE)
            except InputError:
                self._recs = None
        return self._recs

    def _read_threads(self) -> list[Thread]:
        c = self.fields
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
            saved = None
            if flags & abi.TAG_THREAD_REGS:
                saved = dict(zip(self.arch.record_regs, (int(v) for v in r["regs"]), strict=True))
            frames, depth, sps, fns = [], 0, [], []
            if r["shadow"] and not flags & abi.TAG_THREAD_EXITED:
                frames, depth, sps, fns = self._read_shadow(int(r["shadow"]), tid)
            out.append(Thread(
                tid=tid, recorded=True, flags=flags, saved_regs=saved, shadow=frames, shadow_depth=depth, shadow_sp=sps,
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
        bound only - libtag finds the CFA of an entry at the first capture
        after its enter) and fn (the entry of the function of that frame)."""
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

    # ------------------------------------------------ libtag's own memory --

    def own_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of libtag's own memory: the stack table, the thread
        records, the control block, every thread's quarantine ring and
        libtag's per-thread TLS block.  They hold ids, counters and pointers
        to freed blocks - never the program's blocks or references - so scans
        (and whoowns' referrers) leave them out, byte-exactly (libtag
        fences them with guard pages, but an older core may have merged VMAs)."""
        c = self.fields
        out = [
            (int(c.stack_nodes), int(c.stack_nodes) + abi.STACK_NODE_SIZE * int(c.stack_capacity)),
            (int(c.threads), int(c.threads) + abi.THREAD_RECORD_SIZE * int(c.thread_capacity)),
            (self.addr, self.addr + abi.CONTROL_SIZE),
        ]
        if int(c.stack_stats):
            out.append((int(c.stack_stats), int(c.stack_stats) + abi.STACK_STATS_SIZE
                        * (int(c.stack_capacity) + abi.TAG_SHARD_ENTRIES)))
        if int(c.stack_shards):
            out.append((int(c.stack_shards),
                        int(c.stack_shards) + abi.SHARD_CHUNK_SIZE * int(c.stack_shard_capacity)))
            # the chunks, claimed one after another: adjacent ones merged
            size = abi.STACK_SHARD_SIZE * abi.TAG_SHARD_ENTRIES
            for a in sorted(int(x) for x in self.shard_chunks()["entries"]):
                if out[-1][1] == a:
                    out[-1] = (out[-1][0], a + size)
                else:
                    out.append((a, a + size))
        if int(c.stack_stats_slots):
            out.append((int(c.stack_stats_slots), int(c.stack_stats_slots) + 4 * int(c.stack_capacity)))
        for q in self._quarantines:
            out.append((q, q + abi.TAG_QUARANTINE_BYTES))
        out += self.libtag_tls_ranges()
        if int(c.guard_slots):
            out.append((int(c.guard_slots),
                        int(c.guard_slots) + abi.GUARD_SLOT_SIZE * int(c.guard_capacity)))
        if int(c.heap):  # the heap's header and slice table (free-list links, span pointers)
            out.append((int(c.heap), int(c.heap) + abi.HEAP_SIZE))
            h = self.heap_header()
            if h is not None and int(h.meta):
                out.append((int(h.meta), int(h.meta) + abi.SLICE_SIZE * int(h.slices_max)))
        # Each table lies in its own mapping, so a range never extends past
        # the region its start is in: a corrupt capacity (0xffffffff) must not
        # make the scans skip the program's heap and stacks after it.
        clipped = []
        for a, b in out:
            region = self.region_of(a) if a else None
            if region is not None:
                clipped.append((a, min(b, region.end)))
        return clipped

    def heap_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of every mapping of libtag's own: its heap region
        (every block it hands out, small or large), its guard pool and its
        tables.  None of
        it is glibc's: glibc's walk of an attached process skips them."""
        out = list(self.own_ranges())
        h = self.heap_header()
        if h is not None and int(h.base):
            out.append((int(h.base), int(h.base) + abi.TAG_HEAP_SLICE * int(h.slices_max)))
        c = self.fields
        if int(c.guard_pool):  # guarded blocks: pages of their own
            out.append((int(c.guard_pool), int(c.guard_pool) + int(c.guard_pool_bytes)))
        return out

    def heap_layout(self) -> tuple[int, np.ndarray] | None:
        """(heap.base, the slice table: abi.SLICE_DTYPE[heap.used]) of
        libtag's heap, read once; None (with a warning) when control.heap
        is 0 or its header cannot be read."""
        if not hasattr(self, "_heap_layout"):
            self._heap_layout = self._read_heap_layout()
        return self._heap_layout

    def heap_header(self) -> Any | None:
        addr = int(self.fields.heap)
        if not addr:
            return None
        try:
            return abi.HeapHeader.parse(self.mem.read(addr, abi.HEAP_SIZE))
        except CoreReadError:
            return None

    def _read_heap_layout(self) -> tuple[int, np.ndarray] | None:
        addr = int(self.fields.heap)
        if not addr:
            self.warnings.append("libtag's control block names no heap: no blocks are read")
            return None
        h = self.heap_header()
        if h is None:
            self.warnings.append(f"libtag's heap header at {addr:#x} is not readable in {self._where()}: "
                                 f"no blocks are read")
            return None
        used = int(h.used)
        if used > int(h.slices_max) or used > MAX_SLICES:
            self.warnings.append(f"libtag's heap at {addr:#x} claims {used} slices used of "
                                 f"{int(h.slices_max)}: read {min(used, int(h.slices_max), MAX_SLICES)}")
            used = min(used, int(h.slices_max), MAX_SLICES)
        raw = self._read_array(int(h.meta), used, abi.SLICE_SIZE, "libtag's heap slice table")
        return int(h.base), np.frombuffer(raw, abi.SLICE_DTYPE)

    def large_size(self, tag_addr: int) -> int:
        """The large_size of the large span that holds tag_addr: the exact
        size of a block whose tag says TAG_SIZE_BIG; TAG_SIZE_BIG when it
        cannot be read."""
        layout = self.heap_layout()
        if layout is not None:
            base, meta = layout
            i = (tag_addr - base) // abi.TAG_HEAP_SLICE
            if 0 <= i < len(meta):
                i -= int(meta["first_off"][i])
                if 0 <= i < len(meta) and int(meta["kind"][i]) == abi.TAG_SPAN_LARGE:
                    return int(meta["large_size"][i])
        return abi.TAG_SIZE_BIG

    @property
    def page_size(self) -> int:
        """The page size libtag ran with: a guard page of the guard pool.
        A libtag that left the field reserved (zero) ran on x86_64's 4 KiB
        pages: abi.TAG_GUARD_PAGE."""
        return int(self.fields.page_size) or abi.TAG_GUARD_PAGE

    def guard_slot_records(self) -> np.ndarray:
        """The guard pool's slot records in use (abi.GUARD_SLOT_DTYPE), read once."""
        if not hasattr(self, "_guard_slots"):
            c = self.fields
            count = min(int(c.guard_used), int(c.guard_capacity))
            raw = self._read_array(int(c.guard_slots), count, abi.GUARD_SLOT_SIZE, "the guard slot records")
            self._guard_slots = np.frombuffer(raw, abi.GUARD_SLOT_DTYPE)
        return self._guard_slots

    def in_guard_pool_addr(self, addr: int) -> bool:
        lo = int(self.fields.guard_pool)
        return bool(lo) and lo <= addr < lo + int(self.fields.guard_pool_bytes)

    def in_guard_pool(self, r: Region) -> bool:
        """Does r lie in the guard pool?  Its freed slots are inaccessible in
        the process (read-only or unreadable in a core the kernel wrote), and
        hold blocks all the same."""
        lo = int(self.fields.guard_pool)
        return lo <= r.start and r.end <= lo + int(self.fields.guard_pool_bytes)

    def free_records(self) -> np.ndarray:
        """Every current entry of every thread's quarantine ring, and the free
        records of the freed guarded blocks (abi.QENTRY_DTYPE): the freed
        blocks libtag still holds and who freed each; read once."""
        if not hasattr(self, "_free_records"):
            self._free_records = self._ring_entries()
        return self._free_records

    def _ring_entries(self) -> np.ndarray:
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
        slots = self.guard_slot_records()
        slots = slots[slots["state"] == abi.TAG_GUARD_FREED]
        e = np.zeros(len(slots), abi.QENTRY_DTYPE)
        e["user"] = slots["user"]
        for name in ("free_stack", "free_tid", "free_time", "check"):
            e[name] = slots["rec"][name]
        return e

    def stack_stats(self) -> np.ndarray | None:
        """libtag's per-stack counters (STACK_COUNTERS_DTYPE: live_bytes,
        peak_bytes, temporaries, allocs), indexed by stack id, one per stack
        in the table; None when libtag did not record them (control
        stack_stats 0) or they cannot be read.  Each counter is the sum of
        the stack's entry in every thread's shard, exited threads' too, and
        of its shared entry; peak_bytes is the most of the shards' peaks
        (tag_abi.h, "per-stack counters": exact when one thread alone
        counted the stack, within n x 64 KiB when n threads did)."""
        if not hasattr(self, "_stack_stats"):
            self._stack_stats = self._read_stack_stats()
        return self._stack_stats

    def _read_stack_stats(self) -> np.ndarray | None:
        c = self.fields
        if not (int(c.stack_stats) and int(c.stack_stats_slots)):
            return None
        # only allocation stacks have counters, dense: each stack id's entry
        # number is in stack_stats_slots (0 = none: all zero)
        count = min(int(c.stack_count), int(c.stack_capacity))
        used = min(int(c.stack_stats_used), int(c.stack_capacity) + abi.TAG_SHARD_ENTRIES)
        slots = self._read_array(int(c.stack_stats_slots), count, 4, "the per-stack counters' index")
        raw = self._read_array(int(c.stack_stats), used, abi.STACK_STATS_SIZE,
                               "the per-stack counters") if used else b""
        if not slots or not raw:
            return None
        shared = np.frombuffer(raw, dtype=abi.STACK_STATS_DTYPE)
        n = len(shared)
        out = np.zeros(n, dtype=STACK_COUNTERS_DTYPE)
        out["live_bytes"] = shared["live_bytes"]
        out["allocs"] = shared["allocs"]
        # a stack counted in its shared entry only has no shard's peak: its
        # estimate there (exact when no shard counted it) is the floor
        peak = shared["flushed"].view(np.int64).copy()
        for chunk in self.shard_chunks():
            first, addr = int(chunk["first"]), int(chunk["entries"])
            if first >= n:
                continue
            got = self._read_array(addr, min(abi.TAG_SHARD_ENTRIES, n - first), abi.STACK_SHARD_SIZE,
                                   f"a per-stack counters' shard chunk (thread {int(chunk['tid'])})")
            if not got:
                continue
            sh = np.frombuffer(got, dtype=abi.STACK_SHARD_DTYPE)
            at = slice(first, first + len(sh))
            # sums modulo 2^64: one thread's live bytes go below 0 when it
            # freed blocks another one allocated
            out["live_bytes"][at] += sh["live_bytes"]
            out["temporaries"][at] += sh["temporaries"]
            out["allocs"][at] += sh["allocs"]
            np.maximum(peak[at], sh["peak_bytes"].view(np.int64), out=peak[at])
        out["peak_bytes"] = np.maximum(peak, 0).astype(np.uint64)
        out[0] = 0  # "none": a stack that never allocated
        which = np.frombuffer(slots, dtype="<u4").astype(np.int64)
        which[which >= n] = 0
        return out[which]

    def shard_chunks(self) -> np.ndarray:
        """The chunk records of the per-stack counters' shards that are
        complete (abi.SHARD_CHUNK_DTYPE: entries, first, tid), every thread's,
        exited ones' too; empty when there are none."""
        if not hasattr(self, "_shard_chunks"):
            c = self.fields
            n = min(int(c.stack_shard_count), int(c.stack_shard_capacity))
            raw = self._read_array(int(c.stack_shards), n, abi.SHARD_CHUNK_SIZE,
                                   "the per-stack counters' shard chunks") if n else b""
            recs = np.frombuffer(raw, dtype=abi.SHARD_CHUNK_DTYPE)
            self._shard_chunks = recs[recs["entries"] != 0]
        return self._shard_chunks


# What Control.stack_stats gives a stack: its counters summed over the shards.
STACK_COUNTERS_DTYPE = np.dtype([("live_bytes", "<u8"), ("peak_bytes", "<u8"),
                                 ("temporaries", "<u8"), ("allocs", "<u8")])


def truncation(mem: Memory) -> str | None:
    """What a core cut short lost ("truncated core: ..."), None if it is whole
    (or mem is not a core)."""
    core = getattr(mem, "core", None)
    cut = [s for s in getattr(core, "segments", ()) if s.truncated]
    if not cut:
        return None
    lost = sum(min(s.filesz, s.memsz) - s.dumped for s in cut)
    return (f"truncated core: {core.path} is {core.file_size} bytes and lacks {lost} bytes "
            f"of {len(cut)} segments from {cut[0].vaddr:#x} on")


__all__ = ["Control", "HeapFormatError", "truncation"]
