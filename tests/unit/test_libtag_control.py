"""libtag's tables and the block index are two readers, and a thread is one type.

GIVEN a fake libtag process (tests/fakes.py: control block, stack table,
thread records, a quarantine ring, a heap and one stack)
WHEN forensics.reader.control.Control reads what libtag holds there and
forensics.reader.heap.Heap indexes the blocks over that Control
THEN the Control alone gives the thread records and the stacks, the Heap
built from it finds the blocks (with the free records the Control read),
and Dump.threads, the leak scan and whoowns all see one Thread type: the
record's fields with the registers Dump chose and the stack they point into.
"""

from __future__ import annotations

import forensics_test_fakes as F

from forensics.answers.leaks import thread_contexts
from forensics.answers.owners import classify
from forensics.reader import abi
from forensics.reader.control import Control
from forensics.reader.dump import Dump
from forensics.reader.heap import Heap
from forensics.reader.model import Thread

WORKER = 77


def two_threads() -> F.FakeProcess:
    """The main thread (sp 0x800 into the stack) and a worker (sp 0x400)."""
    proc = F.FakeProcess()
    proc.thread(WORKER, sp_offset=0x400)
    return proc


def test_the_control_reads_the_thread_records_as_libtag_left_them():
    # GIVEN two thread records whose registers libtag saved
    proc = two_threads()
    # WHEN only libtag's tables are read
    control = Control(proc.memory())
    # THEN each record is a Thread with the record's fields, and no choice of
    # registers or stack yet: that is Dump.threads'
    assert [(t.tid, t.recorded, t.flags, t.stack_hi) for t in control.threads] == [
        (F.MAIN_TID, True, abi.TAG_THREAD_REGS, F.STACK + 0x1000),
        (WORKER, True, abi.TAG_THREAD_REGS, F.STACK + 0x1000)]
    assert [t.saved_regs["rsp"] for t in control.threads] == [F.STACK + 0x800, F.STACK + 0x400]
    assert [(t.regs, t.sp, t.stack_region) for t in control.threads] == [(None, None, None)] * 2
    assert control.thread(WORKER).tid == WORKER and control.thread(5) is None
    assert (control.reason, control.pid, control.addr) == ("on-demand", F.PID, F.LIBTAG_DATA + 0x100)
    assert control.counters["threads"] == 2
    assert control.warnings == []


def test_the_control_reads_the_stack_table():
    # GIVEN a stack table of main -> f -> g and a second stack main -> h
    proc = F.FakeProcess()
    g = proc.stack_id(0x1000, 0x2000, 0x3000)
    h = proc.stack_id(0x1000, 0x4000)
    # WHEN libtag's tables are read
    control = Control(proc.memory())
    # THEN every node is there and each id walks to its frames, innermost first
    assert control.stack_count == 6  # the root and 5 nodes
    assert control.raw_stack(g) == [(0x3000, abi.TAG_FRAME_CALL), (0x2000, abi.TAG_FRAME_CALL),
                                    (0x1000, abi.TAG_FRAME_CALL)]
    assert control.raw_stack(h) == [(0x4000, abi.TAG_FRAME_CALL), (0x1000, abi.TAG_FRAME_CALL)]


def test_the_heap_built_from_the_control_finds_the_fake_blocks():
    # GIVEN a live block and a freed one whose free record is in the main thread's ring
    proc = F.FakeProcess()
    s = proc.stack_id(0x1000)
    live = proc.block(0x40, size=24, stack=s, time=10)
    freed = proc.block(0x100, size=48, stack=s, freed=(s, WORKER, 90))
    control = Control(proc.memory())
    # WHEN the block index is built over that Control
    heap = Heap(control)
    # THEN it finds both, the freed one with the free record the Control read
    assert heap.control is control and heap.mem is control.mem
    assert [(b.start, b.size, b.state) for b in heap.blocks()] == [(live, 24, "live"), (freed, 48, "freed")]
    assert [int(u) for u in control.free_records()["user"]] == [freed]
    b = heap.block_at(freed + 47)
    assert (b.start, b.free_stack, b.free_thread, b.free_time_ms) == (freed, s, WORKER, 90)
    assert (heap.totals.live_bytes, heap.totals.freed_bytes) == (24, 48)
    # AND the tables libtag owns are left out of the scan: the ring, the records, the control block
    assert (F.QUARANTINE, F.QUARANTINE + abi.TAG_QUARANTINE_BYTES) in control.own_ranges()
    # AND what either could not read is one list, in the order found
    assert heap.warnings is control.warnings


def test_a_dump_holds_both_and_gives_one_thread_type():
    # GIVEN two threads, the worker's record marked exited
    proc = two_threads()
    proc.threads[1]["flags"] |= abi.TAG_THREAD_EXITED
    # WHEN a Dump opens the memory
    dump = Dump(proc.memory())
    # THEN it holds both readers, the heap over the dump's control
    assert dump.heap.control is dump.control
    # AND its threads are the records that had not exited, as Threads with
    # the registers libtag saved for the snapshot (an on-demand snapshot:
    # saved_registers_first), the stack pointer and the stack mapping
    assert dump.saved_registers_first is True
    (t,) = dump.threads
    assert isinstance(t, Thread)
    assert (t.tid, t.recorded, t.sp, t.regs["rsp"]) == (F.MAIN_TID, True, F.STACK + 0x800, F.STACK + 0x800)
    assert (t.stack_region.start, t.stack_region.end) == (F.STACK, F.STACK + 0x1000)
    assert t.live_stack == (F.STACK + 0x800, F.STACK + 0x1000)
    assert dump.thread(WORKER) is None and [x.tid for x in dump.control.threads] == [F.MAIN_TID, WORKER]


def test_the_leak_scan_and_whoowns_see_the_dumps_threads():
    # GIVEN two live threads
    proc = two_threads()
    dump = Dump(proc.memory())
    # WHEN the leak scan takes its roots and whoowns names a stack address
    contexts = thread_contexts(dump)
    owner = classify(dump, F.STACK + 0x900)
    # THEN the leak scan's threads are Dump.threads', registers and all
    assert [(c.tid, c.regs, c.sp, c.live_stack) for c in contexts] == [
        (t.tid, t.regs, t.sp, t.live_stack) for t in dump.threads]
    assert [c.sp for c in contexts] == [F.STACK + 0x800, F.STACK + 0x400]
    # AND whoowns finds the stack through the same Threads (both share the one fake stack)
    assert (owner.owner, owner.thread, owner.region_name) == ("stack", F.MAIN_TID, f"stack of thread {F.MAIN_TID}")
