"""Fakes for the unit tests: a Memory over bytes the test lays out, and a
libtag process image built in it with forensics.reader.abi's own Structs.

`import forensics_test_fakes as F` (tests/conftest.py registers this file
under that name).  As memray's reporter tests feed fake records to the real
reporters, these feed fake memory to the real reader: Control, Heap, Dump,
the leak scan and diff run unchanged on it, with no process, core, compiler
or gdb.

    proc = F.FakeProcess()
    a = proc.block(0x40, size=24)                      # a live block, tag + canary
    b = proc.block(0x100, size=16, freed=(0, 7, 50))   # freed: free stack, tid, time
    proc.word(proc.globals_at(0), a)                   # a global pointing at a
    control = F.control(proc)                          # libtag's tables (reader/control.py)
    heap = F.heap(proc)                                # the block index over them (reader/heap.py)
    dump = F.dump(proc)                                # both (dump.control, dump.heap), frames named by a FakeSymbolizer

Only the layout libtag writes is faked; every check value, canary and
control block is computed or built exactly as tag_abi.h says.  The heap is
one small span of libtag's heap (struct libtag_heap and its slice table at
HEAP_META), whose slot size is the largest stride that puts every block's
tag at a slot start: a block larger than a slot runs over the next slots,
which libtag never does, and the reader reads those slots' first bytes (the
block's payload) as tags that do not validate.  guard_block() places a
block in a guard pool, as libtag's LIBTAG_GUARD_RATE does.
"""

from __future__ import annotations

import numpy as np

from forensics.core.errors import UnmappedError
from forensics.reader import abi
from forensics.reader.memory import Region

SECRET = 0x0123456789ABCDEF
PID = 4242
MAIN_TID = 4242

LIBTAG_DATA = 0x7F0000000000  # libtag's .data/.bss: the control block
STACK_TABLE = 0x7F0000100000
THREAD_RECORDS = 0x7F0000200000
QUARANTINE = 0x7F0000300000  # the main thread's quarantine ring
FILL = 256  # control.quarantine_fill: freed payload bytes patterned
HEAP = 0x555500100000  # slice-aligned: slice 0 of libtag's heap
HEAP_META = 0x7F0000400000  # struct libtag_heap, then its slice table at +0x100
GUARD_POOL = 0x7F0000600000  # the guard pool (guard_block), slot records at GUARD_SLOTS
GUARD_SLOTS = 0x7F0000500000
GUARD_SLOT_BYTES = 0x1000  # one page a slot (of 4 KiB pages; FakeProcess.guard_page)
GLOBALS = 0x555500000000  # the program's writable data
STACK = 0x7FFF00000000
PROGRAM = "/fake/program"  # the module whose writable data is GLOBALS
LIBTAG = "/fake/libtag.so"  # the module whose .data holds the control block
PROGRAM_TEXT = 0x555400000000  # read-only mappings of the two: FakeProcess.modules()
LIBTAG_TEXT = 0x7EFF00000000


class FakeMemory:
    """forensics.reader.memory.Memory over (start, bytes, writable, path)
    regions; reads outside them raise UnmappedError, as a core's do."""

    def __init__(self, regions: list[tuple[int, bytes | bytearray, bool, str | None]],
                 name: str = "fake memory") -> None:
        self.name = name
        self._regions = sorted(
            (Region(start, start + len(data), writable, path, array=np.frombuffer(bytes(data), np.uint8))
             for start, data, writable, path in regions),
            key=lambda r: r.start)

    @property
    def cache_key(self) -> None:
        return None

    def regions(self) -> list[Region]:
        return self._regions

    def maps(self) -> list:
        return []  # no module files: nothing to symbolise

    def read(self, addr: int, n: int) -> bytes:
        for r in self._regions:
            if r.start <= addr and addr + n <= r.end:
                return r.array[addr - r.start:addr - r.start + n].tobytes()
        raise UnmappedError(addr)


class FakeProcess:
    """A libtag process image: control block, stack table, thread records,
    a heap, globals and one thread's stack, laid out at fixed addresses."""

    def __init__(self, *, heap_size: int = 0x4000, reason: int = abi.TAG_REASON_ON_DEMAND,
                 start_realtime_ns: int = 1, pid: int = PID, page_size: int = 0,
                 guard_slot_bytes: int = GUARD_SLOT_BYTES) -> None:
        """page_size: control.page_size; 0, as a libtag that left the field
        reserved wrote it, makes the guard pool's pages abi.TAG_GUARD_PAGE.
        guard_slot_bytes: control.guard_slot_size."""
        self.page_size = page_size
        self.guard_page = page_size or abi.TAG_GUARD_PAGE
        self.guard_slot_bytes = guard_slot_bytes
        self.heap = bytearray(heap_size)
        self.globals = bytearray(0x100)
        self.stack = bytearray(0x1000)
        self.libtag = bytearray(0x1000)
        self.nodes: list[tuple[int, int, int]] = [(0, 0, 0)]  # (pc, parent, kind); node 0 is the root
        self.threads: list[dict] = []
        self.reason = reason
        self.start_realtime_ns = start_realtime_ns
        self.pid = pid
        self.anomaly: dict | None = None
        self.ring: list[dict] = []  # the main thread's quarantine entries, oldest first
        self.crash: dict | None = None  # control.crash's fields (signal, tid, address, code, stack, time)
        self.control_fields: dict = {}  # other control block fields (options, snapshot_time_ms, ...)
        self.mappings: list[tuple[int, bytes, bool, str | None]] = []  # more regions: map()
        self.tags: list[int] = []  # heap offsets of the tags (and forward records) placed
        self.guard: list[dict] = []  # guard slot records (guard_block)
        self.guard_readable: list[bool] = []  # is each guard slot in the memory
        # overrides of the heap's tables: "heap" (struct libtag_heap fields), "slice"
        # (the first span's entry), "more_slices" (the entries of slices 1 on)
        self.heap_fields: dict = {}
        self.thread(MAIN_TID)

    # -- the heap --------------------------------------------------------

    def block(self, offset: int, size: int, *, tid: int = MAIN_TID, stack: int = 0, time: int = 0,
              freed: tuple[int, int, int] | None = None, canary: bool = True, kind: int = abi.TAG_ALLOC_MALLOC,
              pad: int = 0) -> int:
        """A block whose slot starts at heap offset `offset` (16-aligned);
        freed = (free_stack, free_tid, free_time) for one in quarantine: its
        payload patterned, its free record in the quarantine ring.  pad: an
        aligned block, its tag pad bytes on, the slot starting with a
        forward record.  Returns the user pointer."""
        self.tags.append(offset)
        if pad:
            self.put(offset, tag_bytes(HEAP + offset, pad, 0, abi.tag_bits(0, 0, abi.TAG_STATE_FORWARD)))
            offset += pad
        tag_addr = HEAP + offset
        state = abi.TAG_STATE_FREED if freed else abi.TAG_STATE_LIVE
        self.put(offset, tag_bytes(tag_addr, stack, time, abi.tag_bits(tid, size, state, kind)))
        user = offset + abi.TAG_SIZE
        if freed:
            rec = dict(free_stack=freed[0], free_tid=freed[1], free_time=freed[2], check=0)
            rec["check"] = abi.free_rec_check_value(tag_addr, SECRET, abi.FreeRec.parse(abi.FreeRec.build(rec)))
            self.put(user, bytes([abi.TAG_FREE_PATTERN]) * min(size, FILL))
            self.ring.append(dict(user=HEAP + user, rec=rec))
        if canary:
            self.put(user + size, abi.tag_canary_value(tag_addr, SECRET).to_bytes(8, "little"))
        return HEAP + user

    def guard_block(self, size: int, *, tid: int = MAIN_TID, stack: int = 0, time: int = 0,
                    freed: tuple[int, int, int] | None = None, readable: bool = True) -> int:
        """A block in the next slot of the guard pool, right-aligned in it,
        with its slot record (and the record's copy of its tag); freed: its
        free record in the slot record.  readable=False leaves the slot out
        of the memory, as a kernel's core leaves a freed slot.  Returns the
        user pointer."""
        i = len(self.guard)
        slot = GUARD_POOL + self.guard_page + i * (self.guard_slot_bytes + self.guard_page)
        user = slot + self.guard_slot_bytes - (max(size, abi.TAG_MIN_PAYLOAD) + 15) // 16 * 16
        state = abi.TAG_STATE_FREED if freed else abi.TAG_STATE_LIVE
        tag = tag_bytes(user - abi.TAG_SIZE, stack, time, abi.tag_bits(tid, size, state))
        rec = dict(free_stack=0, free_tid=0, free_time=0, check=0)
        if freed:
            rec = dict(free_stack=freed[0], free_tid=freed[1], free_time=freed[2], check=0)
            rec["check"] = abi.free_rec_check_value(user - abi.TAG_SIZE, SECRET,
                                                    abi.FreeRec.parse(abi.FreeRec.build(rec)))
        self.guard.append(dict(user=user, rec=rec, state=abi.TAG_GUARD_FREED if freed else abi.TAG_GUARD_LIVE,
                               retired=0, tag=dict(abi.Tag.parse(tag)), next=0, reported=0))
        self.guard_readable.append(readable)
        return user

    def put(self, offset: int, data: bytes) -> None:
        self.heap[offset:offset + len(data)] = data

    def word(self, addr: int, value: int) -> None:
        """Write a pointer-sized word anywhere in the heap, the globals or the stack."""
        for base, buf in ((HEAP, self.heap), (GLOBALS, self.globals), (STACK, self.stack)):
            if base <= addr < base + len(buf):
                buf[addr - base:addr - base + 8] = value.to_bytes(8, "little")
                return
        raise ValueError(f"{addr:#x} is in no buffer of the fake process")

    def globals_at(self, offset: int) -> int:
        return GLOBALS + offset

    def stack_at(self, offset: int) -> int:
        return STACK + offset

    # -- stacks and threads ---------------------------------------------

    def stack_id(self, *pcs: int) -> int:
        """The id of a stack of CALL frames, outermost first in pcs."""
        parent = 0
        for pc in pcs:
            self.nodes.append((pc, parent, abi.TAG_FRAME_CALL))
            parent = len(self.nodes) - 1
        return parent

    def thread(self, tid: int, *, sp_offset: int = 0x800) -> None:
        """A thread whose registers were saved at the snapshot: its stack
        pointer sp_offset bytes into the fake stack, every other register 0."""
        regs = [0] * abi.TAG_NREGS
        regs[19] = STACK + sp_offset  # rsp (user_regs_struct order)
        self.threads.append(dict(tid=tid, flags=abi.TAG_THREAD_REGS, shadow=0, allocs=0, frees=0,
                                 alloc_bytes=0, free_bytes=0, stack_hi=STACK + len(self.stack),
                                 regs=regs, quarantine=QUARANTINE if tid == MAIN_TID else 0,
                                 reserved=0))

    # -- the image ---------------------------------------------------------

    def memory(self) -> FakeMemory:
        control_addr = LIBTAG_DATA + 0x100
        control = _zero(abi.Control)
        control.update(
            magic=abi.TAG_CONTROL_MAGIC, self=control_addr, abi_version=abi.TAG_ABI_VERSION,
            tag_size=abi.TAG_SIZE, free_rec_size=abi.FREE_REC_SIZE, canary_size=abi.TAG_CANARY_SIZE,
            secret=SECRET, start_realtime_ns=self.start_realtime_ns, pid=self.pid,
            stack_nodes=STACK_TABLE, stack_capacity=len(self.nodes), stack_count=len(self.nodes),
            threads=THREAD_RECORDS, thread_capacity=len(self.threads), thread_count=len(self.threads),
            quarantine_fill=FILL, page_size=self.page_size,
            reason=self.reason, snapshot_seq=1, snapshot_tid=MAIN_TID, heap=HEAP_META)
        if self.guard:
            n = len(self.guard)
            control.update(guard_pool=GUARD_POOL,
                           guard_pool_bytes=self.guard_page + n * (self.guard_slot_bytes + self.guard_page),
                           guard_slots=GUARD_SLOTS, guard_slot_size=self.guard_slot_bytes, guard_capacity=n,
                           guard_used=n, guard_rate=1)
        if self.anomaly:
            control["anomaly"].update(self.anomaly)
        if self.crash:
            control["crash"].update(self.crash)
        control.update(self.control_fields)
        libtag = bytearray(self.libtag)
        raw = abi.Control.build(control)
        libtag[0x100:0x100 + len(raw)] = raw
        nodes = b"".join(abi.StackNode.build(dict(pc=pc, parent=parent, kind=kind))
                         for pc, parent, kind in self.nodes)
        records = b"".join(abi.ThreadRecord.build(t) for t in self.threads)
        return FakeMemory([
            (LIBTAG_DATA, libtag, True, "/fake/libtag.so"),
            (STACK_TABLE, nodes, True, None),
            (THREAD_RECORDS, records, True, None),
            (QUARANTINE, _ring_bytes(self.ring), True, None),
            (GLOBALS, self.globals, True, "/fake/program"),
            (HEAP, self.heap, True, "[heap]"),
            (STACK, self.stack, True, "[stack]"),
            (HEAP_META, self._heap_meta(), True, "[anon:libtag]"),
            *self._guard_regions(),
            *self.mappings,
        ])

    def _heap_meta(self) -> bytes:
        """struct libtag_heap at HEAP_META and its slice table at +0x100: the
        heap is one small span, its slot size the largest stride (at least
        32, the smallest slot) that puts every tag placed at a slot start."""
        stride = 0x1000
        for off in self.tags:
            while off % stride:
                stride //= 2
        assert stride >= 2 * abi.TAG_SIZE, f"blocks at heap offsets {self.tags}: tags 32 bytes apart at least"
        nslices = (len(self.heap) + abi.TAG_HEAP_SLICE - 1) // abi.TAG_HEAP_SLICE
        first = dict(_zero(abi.Slice), first_off=0, slices=nslices, kind=abi.TAG_SPAN_SMALL, block_size=stride,
                     capacity=nslices * abi.TAG_HEAP_SLICE // stride, carved=len(self.heap) // stride)
        first.update(self.heap_fields.get("slice", {}))
        entries = [first] + self.heap_fields.get(
            "more_slices", [dict(_zero(abi.Slice), first_off=i) for i in range(1, nslices)])
        header = dict(base=HEAP, slices_max=nslices, used=nslices, committed=nslices, meta=HEAP_META + 0x100,
                      key=0, large_count=0, large_bytes=0, broken_links=0)
        header.update(self.heap_fields.get("heap", {}))
        out = bytearray(0x100)
        out[:abi.HEAP_SIZE] = abi.HeapHeader.build(header)
        return bytes(out) + b"".join(abi.Slice.build(e) for e in entries)

    def _guard_regions(self) -> list[tuple[int, bytes, bool, str | None]]:
        """The guard slot records and each readable slot of the pool (a
        slot's bytes: zeros, the block's tag, patterned payload when freed)."""
        if not self.guard:
            return []
        out = [(GUARD_SLOTS, b"".join(abi.GuardSlot.build(g) for g in self.guard), True, "[anon:libtag]")]
        for i, (g, readable) in enumerate(zip(self.guard, self.guard_readable, strict=True)):
            slot = GUARD_POOL + self.guard_page + i * (self.guard_slot_bytes + self.guard_page)
            if readable:
                data = bytearray(self.guard_slot_bytes)
                t = g["user"] - abi.TAG_SIZE - slot
                data[t:t + abi.TAG_SIZE] = abi.Tag.build(g["tag"])
                out.append((slot, bytes(data), g["state"] == abi.TAG_GUARD_LIVE, "[anon:libtag guard]"))
        return out

    # -- added helpers ---------------------------------------------------

    def map(self, start: int, size: int, *, writable: bool = False, path: str | None = None) -> bytearray:
        """Another mapping, of zeros: a module's read-only text (which makes
        its writable mapping of the same path the module's globals), shared
        memory, an anonymous mapping.  Returns its bytes, to write into."""
        data = bytearray(size)
        self.mappings.append((start, data, writable, path))
        return data

    def modules(self) -> None:
        """The program's and libtag's text mapped read-only (PROGRAM_TEXT,
        LIBTAG_TEXT): their writable mappings are then modules' globals."""
        self.map(PROGRAM_TEXT, 0x1000, path=PROGRAM)
        self.map(LIBTAG_TEXT, 0x1000, path=LIBTAG)

    def libtag_word(self, offset: int, value: int) -> None:
        """Write a pointer-sized word into libtag's .data (outside its control
        block, which starts 0x100 in)."""
        self.libtag[offset:offset + 8] = value.to_bytes(8, "little")

    def record_anomaly(self, kind: int, user: int, *, address: int | None = None, tid: int = MAIN_TID,
                       stack: int = 0, time: int = 0, block: int | None = None, **more) -> None:
        """The anomaly libtag records: kind (abi.TAG_ANOMALY_*) at address
        (default user), with its copy of the tag of the block at user (and of
        its quarantine record, when freed) - as anomaly.c copies them.
        block: the block libtag names (default user; 0: none)."""
        tag_off = user - abi.TAG_SIZE - HEAP
        tag = dict(abi.Tag.parse(bytes(self.heap[tag_off:tag_off + abi.TAG_SIZE])))
        tag.pop("_io", None)
        rec = next((e["rec"] for e in self.ring if e["user"] == user), None)
        self.anomaly = dict(kind=kind, tid=tid, address=user if address is None else address,
                            block=user if block is None else block, stack=stack, time=time,
                            tag=tag, **({"free_rec": dict(rec)} if rec else {}), **more)
        self.reason = abi.TAG_REASON_ANOMALY


# ---------------------------------------------------------------- added --


def control(proc: FakeProcess):
    """The real forensics.reader.control.Control (libtag's control block and
    the tables off it) over proc's image."""
    from forensics.reader.control import Control

    return Control(proc.memory())


def heap(proc: FakeProcess):
    """The real forensics.reader.heap.Heap (the block index) over proc's
    image: unit tests build their Heap here, so how one is constructed is
    one line to change."""
    from forensics.reader.heap import Heap

    return Heap(control(proc))


def dump(proc: FakeProcess, symbols: "FakeSymbolizer | None" = None):
    """The real forensics.reader.dump.Dump over proc's image, its frames and
    data named by symbols (a FakeSymbolizer; default: one that knows no
    module) - no llvm-symbolizer, no symbol cache on disk."""
    from forensics.reader.dump import Dump

    d = Dump(proc.memory())
    d.__dict__["symbolizer"] = symbols if symbols is not None else FakeSymbolizer()
    return d


class FakeSymbolizer:
    """forensics.reader.symbols.Symbolizer's answers from tables the test
    gives: modules [(path, start, end)] (load bias = start), functions
    {pc: name} (the pc a stack records), data [(module, start, size, name,
    section)] for data_symbol."""

    def __init__(self, modules=(), functions: dict[int, str] | None = None, data=()) -> None:
        from forensics.reader.symbols import Module

        self.modules = sorted((Module(path, start, end, start) for path, start, end in modules),
                              key=lambda m: m.start)
        self.functions = dict(functions or {})
        self.data = list(data)
        self.warnings: list[str] = []

    def module_at(self, pc: int):
        return next((m for m in self.modules if pc in m), None)

    def symbolize(self, pcs):
        from forensics.reader.symbols import SymbolFrame

        out = []
        for pc, kind in pcs:
            m = self.module_at(pc - 1 if kind == abi.TAG_FRAME_CALL else pc)
            out.append(SymbolFrame(pc, self.functions.get(pc), None, None, m.path if m else None,
                                   module_offset=pc - m.load_bias if m else None))
        return out

    def data_symbol(self, module_path: str, addr: int):
        from forensics.reader.symbols import DataSymbol

        for module, start, size, name, section in self.data:
            if module == module_path and start <= addr < start + size:
                return DataSymbol(name, addr - start, section, module)
        return None


def tag_bytes(tag_addr: int, alloc_stack: int, alloc_time: int, bits: int) -> bytes:
    """The 16 bytes of a tag at tag_addr whose bits word (check excluded) is
    bits, its check computed as libtag does."""
    check = abi.tag_check_fields(tag_addr, SECRET, bits, alloc_stack, alloc_time)
    return abi.Tag.build(dict(alloc_stack=alloc_stack, alloc_time=alloc_time, bits=bits | check))


def _ring_bytes(entries: list[dict]) -> bytes:
    """abi.QuarantineRing.build of a ring holding entries (head 0, count,
    the rest zero), with the 4096 empty slots as zero bytes: construct
    takes ~80 ms to build them one by one, every memory() of every test."""
    head = (0).to_bytes(4, "little") + len(entries).to_bytes(4, "little") + bytes(8)  # head, count, bytes
    body = b"".join(abi.QEntry.build(e) for e in entries)
    return head + body + bytes(abi.TAG_QUARANTINE_BYTES - len(head) - len(body))


def _zero(struct) -> dict:
    """An all-zero value of a construct Struct, to fill in."""
    from construct import Array, Bytes, Struct

    out = {}
    for sub in struct.subcons:
        if not sub.name:
            continue
        con = sub.subcon
        if isinstance(con, Struct):
            out[sub.name] = _zero(con)
        elif isinstance(con, Array):
            out[sub.name] = [_zero(con.subcon) if isinstance(con.subcon, Struct) else 0
                             for _ in range(con.count)]
        elif isinstance(con, Bytes):
            out[sub.name] = bytes(con.length)
        else:
            out[sub.name] = 0
    return out
