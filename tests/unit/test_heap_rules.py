"""The heap reader's rules, driven by fake memory (no process, no core).

GIVEN a libtag process image laid out by tests/fakes.py (tags, canaries,
free records, the control block and stack table built with abi's Structs)
WHEN forensics.reader.control.Control reads libtag's tables and
forensics.reader.heap.Heap indexes the blocks over it
THEN it finds exactly the blocks the rules say: the blocks of the heap's
spans (slots with a tag or a forward record, large spans with their exact
size) and of the guard pool's slot records; tags that do not validate are
not blocks, and every lie in libtag's tables is a warning and a partial
answer.
"""

from __future__ import annotations

import forensics_test_fakes as F
import pytest

from forensics.reader import abi
from forensics.reader.control import Control
from forensics.reader.heap import Heap


def control_of(proc: F.FakeProcess) -> Control:
    return Control(proc.memory())


def heap_of(proc: F.FakeProcess) -> Heap:
    return Heap(control_of(proc))


def starts(heap: Heap) -> list[int]:
    return [b.start for b in heap.blocks()]


# ------------------------------------------------------------- blocks --


def test_a_live_block_is_read_with_every_field_of_its_tag():
    proc = F.FakeProcess()
    stack = proc.stack_id(0x401000, 0x402000)
    user = proc.block(0x40, size=24, tid=7, stack=stack, time=1234)
    heap = heap_of(proc)
    assert len(heap) == 1
    b = heap.block_at(user + 23)
    assert (b.start, b.size, b.state, b.thread, b.alloc_stack, b.alloc_time_ms) == (user, 24, "live", 7, stack, 1234)
    assert (b.free_thread, b.free_stack, b.free_time_ms) == (None, None, None)
    assert heap.block_at(user + 24) is None  # the canary is not the block's
    assert heap.near(user + 24) == (b, 0)
    assert heap.near(user + 24 + 64) is None  # beyond the near window
    assert heap.warnings == []


def test_a_freed_block_has_its_free_record():
    proc = F.FakeProcess()
    user = proc.block(0x40, size=32, tid=3, freed=(5, 9, 700))
    b = heap_of(proc).block_at(user)
    assert (b.state, b.free_stack, b.free_thread, b.free_time_ms) == ("freed", 5, 9, 700)


def test_a_write_into_the_freed_payload_leaves_the_free_record_alone():
    # GIVEN a freed block whose first bytes a dangling pointer overwrote
    proc = F.FakeProcess()
    user = proc.block(0x40, size=32, tid=3, freed=(5, 9, 700))
    proc.put(0x40 + abi.TAG_SIZE, (0x4141414141414141).to_bytes(8, "little"))
    # THEN who freed it still comes from the ring entry, outside the block
    b = heap_of(proc).block_at(user)
    assert (b.state, b.free_stack, b.free_thread, b.free_time_ms) == ("freed", 5, 9, 700)


def test_a_free_record_that_does_not_validate_is_left_out_not_trusted():
    proc = F.FakeProcess()
    user = proc.block(0x40, size=32, freed=(5, 9, 700))
    proc.ring[0]["rec"]["free_time"] = 701  # not the record libtag wrote for this block
    b = heap_of(proc).block_at(user)
    assert (b.state, b.free_thread, b.free_stack, b.free_time_ms) == ("freed", None, None, None)


def test_malloc_0_owns_its_start_address():
    proc = F.FakeProcess()
    user = proc.block(0x40, size=0)
    heap = heap_of(proc)
    assert heap.block_at(user).size == 0
    assert heap.block_at(user + 1) is None


@pytest.mark.parametrize("damage", ["check", "stack", "state", "size past the span"])
def test_a_tag_that_does_not_validate_is_not_a_block(damage):
    # GIVEN a live block whose tag is damaged one way
    proc = F.FakeProcess(heap_size=0x10000)
    proc.block(0x40, size=24)
    if damage == "check":
        proc.put(0x48, b"\0\0")  # the check, bits 0..15
    elif damage == "stack":
        proc.put(0x40, (99).to_bytes(4, "little"))  # a field the check covers
    elif damage == "state":  # a forward record over itself: the state is covered too
        bits = int.from_bytes(proc.heap[0x48:0x50], "little") | abi.TAG_STATE_FORWARD << abi.TAG_STATE_SHIFT
        proc.put(0x48, bits.to_bytes(8, "little"))
    else:  # a valid check, but the block would end past its span
        proc.block(0xFF00, size=0x200, canary=False)
        proc.put(0x40, bytes(16))  # (the first block gone: state NONE, no block)
    slot = F.HEAP + (0xFF00 if damage == "size past the span" else 0x40)
    # WHEN the heap is walked
    heap = heap_of(proc)
    # THEN no block is found, and the walk names the slot whose tag was written over
    assert (len(heap), heap.warnings) == (0, [
        f"libtag's heap: 1 slots hold a tag that does not validate or does not fit its slot "
        f"(written over), their blocks are not read: {slot:#x}"])


# ---------------------------------------------------------------- walk --


def test_the_walk_reads_live_freed_free_and_forwarded_slots_of_a_small_span():
    # GIVEN a small span (slots of 0x40 bytes) whose slot 1 is live, slot 2
    # freed, slot 3 free (state NONE, a link in its first word) and slot 4 an
    # aligned block: a forward record, its tag 0x20 bytes on
    proc = F.FakeProcess()
    live = proc.block(0x40, size=24, tid=7, stack=3, time=11)
    freed = proc.block(0x80, size=16, tid=8, freed=(5, 9, 700), time=12)
    proc.put(0xC0, (0x5555001234560).to_bytes(8, "little") + bytes(8))
    aligned = proc.block(0x100, size=8, tid=9, stack=4, time=13, pad=0x20, kind=abi.TAG_ALLOC_NEW_ALIGNED)
    # WHEN the heap is walked
    heap = heap_of(proc)
    # THEN exactly the three blocks, with their tags' fields
    got = [(b.start, b.size, b.state, b.thread, b.alloc_stack, b.alloc_time_ms, b.alloc_kind, b.tag_addr,
            b.free_thread, b.guarded) for b in heap.blocks()]
    assert got == [
        (F.HEAP + 0x50, 24, "live", 7, 3, 11, "malloc", F.HEAP + 0x40, None, False),
        (F.HEAP + 0x90, 16, "freed", 8, 0, 12, "malloc", F.HEAP + 0x80, 9, False),
        (F.HEAP + 0x130, 8, "live", 9, 4, 13, "new-aligned", F.HEAP + 0x120, None, False),
    ]
    assert [live, freed, aligned] == [F.HEAP + 0x50, F.HEAP + 0x90, F.HEAP + 0x130]
    assert heap.warnings == []


def test_a_forward_record_that_does_not_validate_leads_nowhere():
    # GIVEN an aligned block whose forward record's pad was overwritten
    proc = F.FakeProcess()
    proc.block(0x100, size=8, pad=0x20)
    proc.put(0x100, (0x30).to_bytes(4, "little"))
    # WHEN the heap is walked  THEN the block is not found
    assert len(heap_of(proc)) == 0


def test_a_large_span_gives_its_block_with_the_exact_size_from_the_span_entry():
    # GIVEN a large span (slice 1) whose block's tag says TAG_SIZE_BIG, and
    # whose entry says the block is 0x123456 bytes
    proc = F.FakeProcess(heap_size=0x10000 * 2)
    slot = 0x10000 + 0x40  # block_off 0x40
    proc.put(slot, F.tag_bytes(F.HEAP + slot, 6, 77, abi.tag_bits(12, 0x123456, abi.TAG_STATE_LIVE)))
    proc.heap_fields["slice"] = dict(slices=1, carved=16)  # the small span is slice 0 only (slots of 0x1000)
    proc.heap_fields["more_slices"] = [dict(F._zero(abi.Slice), first_off=0, slices=40, kind=abi.TAG_SPAN_LARGE,
                                            block_off=0x40, large_size=0x123456)]
    proc.heap_fields["heap"] = dict(used=2, slices_max=41)
    # WHEN the heap is walked
    heap = heap_of(proc)
    # THEN the block has the span's size
    (b,) = heap.blocks()
    assert (b.start, b.size, b.state, b.thread, b.alloc_stack, b.alloc_time_ms) == (
        F.HEAP + slot + 16, 0x123456, "live", 12, 6, 77)
    assert heap.warnings == []


def test_a_guarded_block_is_found_from_its_slot_record():
    # GIVEN a live guarded block, and a freed one whose slot is not in the
    # memory (a kernel's core): only the slot record's tag copy tells of it;
    # control.page_size 0, as a libtag that left it reserved wrote it (4 KiB
    # guard pages: abi.TAG_GUARD_PAGE)
    proc = F.FakeProcess()
    live = proc.guard_block(40, tid=5, stack=2, time=30)
    freed = proc.guard_block(100, tid=6, time=31, freed=(0, 6, 40), readable=False)
    # WHEN the heap is walked
    heap = heap_of(proc)
    # THEN both are blocks, guarded, with their tags' fields and the free record
    got = [(b.start, b.size, b.state, b.thread, b.alloc_time_ms, b.guarded, b.free_thread, b.free_time_ms)
           for b in heap.blocks()]
    assert got == [(F.GUARD_POOL + 0x1000 + 0x1000 - 48, 40, "live", 5, 30, True, None, None),
                   (F.GUARD_POOL + 0x3000 + 0x1000 - 112, 100, "freed", 6, 31, True, 6, 40)]
    assert [live, freed] == [got[0][0], got[1][0]]
    assert heap.warnings == []


def test_guard_pages_are_the_page_size_libtag_ran_with():
    # GIVEN a guard pool of 64 KiB guard pages (an aarch64 kernel's), which
    # control.page_size says, and 2 MiB slots: a small block, then one too
    # big for a tag's size field (TAG_SIZE_BIG), whose size is the distance
    # from it to its slot's end - which the guard pages place
    proc = F.FakeProcess(page_size=0x10000, guard_slot_bytes=0x200000)
    small = proc.guard_block(40, tid=5, stack=2, time=30)
    big = proc.guard_block(0x180000, tid=6, time=31)
    # WHEN the heap is walked
    heap = heap_of(proc)
    # THEN the big block's slot ends a 64 KiB guard page, a slot and a
    # guard page after the first slot's end: its size is its own
    got = [(b.start, b.size, b.state, b.guarded) for b in heap.blocks()]
    assert got == [(F.GUARD_POOL + 0x10000 + 0x200000 - 48, 40, "live", True),
                   (F.GUARD_POOL + 0x220000 + 0x200000 - 0x180000, 0x180000, "live", True)]
    assert [small, big] == [got[0][0], got[1][0]]
    assert heap.control.page_size == 0x10000 and heap.warnings == []


def test_an_unreadable_span_is_a_warning_and_the_walk_goes_on():
    # GIVEN a heap of two spans, the second (slice 1) not in the memory
    proc = F.FakeProcess()
    user = proc.block(0x40, size=24)
    proc.heap_fields["more_slices"] = [dict(F._zero(abi.Slice), first_off=0, slices=1, kind=abi.TAG_SPAN_SMALL,
                                            block_size=0x40, capacity=1024, carved=3)]
    proc.heap_fields["heap"] = dict(used=2, slices_max=2)
    # WHEN the heap is walked
    heap = heap_of(proc)
    # THEN the first span's block is there, and the second span is a warning
    assert starts(heap) == [user]
    assert heap.warnings == [f"libtag's heap: 1 spans are not readable in fake memory, their blocks are "
                             f"not read: {F.HEAP + 0x10000:#x}"]


def test_blocks_side_by_side_do_not_overlap():
    proc = F.FakeProcess()
    a = proc.block(0x40, size=24)  # tag 0x40-0x50, payload to 0x68, canary to 0x70
    b = proc.block(0x80, size=24)
    c = proc.block(0xC0, size=8, freed=(0, 1, 1))  # payload at least TAG_MIN_PAYLOAD
    heap = heap_of(proc)
    assert starts(heap) == [a, b, c]
    t = heap.totals
    assert (t.live_blocks, t.live_bytes, t.freed_blocks, t.freed_bytes) == (2, 48, 1, 8)


# ------------------------------------------------------------- canaries --


def test_a_smashed_canary_is_a_warning_naming_the_block():
    proc = F.FakeProcess()
    user = proc.block(0x40, size=24)
    proc.put(0x40 + abi.TAG_SIZE + 24, b"AAAAAAAA")
    heap = heap_of(proc)
    assert heap.block_at(user).state == "live"
    assert len(heap.warnings) == 1 and f"{user:#x} (24 bytes)" in heap.warnings[0], heap.warnings


# --------------------------------------------------------------- stacks --


def test_a_stack_is_its_frames_innermost_first():
    proc = F.FakeProcess()
    s = proc.stack_id(0x1000, 0x2000, 0x3000)  # main -> f -> g
    control = control_of(proc)
    assert control.raw_stack(s) == [(0x3000, abi.TAG_FRAME_CALL), (0x2000, abi.TAG_FRAME_CALL),
                                    (0x1000, abi.TAG_FRAME_CALL)]
    assert control.raw_stack(0) == []
    assert control.warnings == []


def test_a_stack_id_beyond_the_table_is_a_warning_and_no_frames():
    proc = F.FakeProcess()
    proc.stack_id(0x1000)
    control = control_of(proc)
    assert control.raw_stack(99) == []
    assert control.warnings == ["stack id 99 is beyond the stack table's 2 nodes: its frames are unknown"]


def test_a_parent_link_that_does_not_go_down_cuts_the_stack():
    proc = F.FakeProcess()
    s = proc.stack_id(0x1000, 0x2000)
    proc.nodes[1] = (0x1000, 2, abi.TAG_FRAME_CALL)  # a cycle: 2 -> 1 -> 2
    control = control_of(proc)
    assert control.raw_stack(s) == [(0x2000, abi.TAG_FRAME_CALL), (0x1000, abi.TAG_FRAME_CALL)]
    assert control.warnings == ["corrupt stack table: node 1's parent 2 is not below it "
                                "(a cycle or a forward link); stack 2 is cut there"]


def test_a_node_of_an_unknown_kind_cuts_the_stack():
    proc = F.FakeProcess()
    s = proc.stack_id(0x1000, 0x2000)
    proc.nodes[1] = (0x1000, 0, 7)
    control = control_of(proc)
    assert control.raw_stack(s) == [(0x2000, abi.TAG_FRAME_CALL)]
    assert control.warnings == ["corrupt stack table: node 1 has unknown frame kind 7; stack 2 is cut there"]


def test_live_bytes_by_allocation_stack_most_first():
    proc = F.FakeProcess()
    s1, s2 = proc.stack_id(0x1000), proc.stack_id(0x2000)
    proc.block(0x40, size=16, stack=s1)
    proc.block(0x80, size=16, stack=s1)
    proc.block(0xC0, size=100, stack=s2)
    proc.block(0x180, size=500, stack=s2, freed=(0, 1, 1))
    assert heap_of(proc).by_stack("live") == [(s2, 1, 100), (s1, 2, 32)]


# ------------------------------------------------------- control block --


def test_memory_without_libtag_says_so():
    mem = F.FakeMemory([(0x1000, bytes(0x1000), True, None)], name="a plain process")
    with pytest.raises(abi.NoLibtagError, match="no libtag control block in a plain process"):
        Control(mem)


@pytest.mark.parametrize("version", [3, abi.TAG_ABI_VERSION + 1])  # 3: a core of the 32-byte tag
def test_another_abi_version_is_refused_by_name(version):
    proc = F.FakeProcess()
    mem = proc.memory()
    libtag = mem.regions()[-1] if mem.regions()[-1].path == "/fake/libtag.so" else next(
        r for r in mem.regions() if r.path == "/fake/libtag.so")
    raw = bytearray(libtag.array.tobytes())
    offset = 0x100 + abi.field_offsets(abi.Control)["abi_version"]
    raw[offset:offset + 4] = version.to_bytes(4, "little")
    other = F.FakeMemory([(r.start, raw if r is libtag else r.array.tobytes(), r.writable, r.path)
                          for r in mem.regions()])
    with pytest.raises(abi.AbiVersionError) as exc:
        Control(other)
    assert str(exc.value) == (
        f"libtag control block at {F.LIBTAG_DATA + 0x100:#x} in fake memory has ABI version {version}, this "
        f"forensics reads version 5: use the forensics that matches the libtag the process ran with")


def test_the_anomaly_is_read_from_the_control_block_copy_of_the_tag():
    proc = F.FakeProcess(reason=abi.TAG_REASON_ANOMALY)
    user = proc.block(0x40, size=24, freed=(3, 8, 90))
    tag = abi.Tag.parse(bytes(proc.heap[0x40:0x50]))
    rec = proc.ring[0]["rec"]  # libtag copies the ring entry's record into the anomaly
    proc.anomaly = dict(kind=abi.TAG_ANOMALY_DOUBLE_FREE, tid=8, address=user, block=user, stack=3, time=95,
                        tag=dict(tag), free_rec=dict(rec))
    control = control_of(proc)
    a = control.anomaly
    assert (control.reason, a.kind, a.address, a.thread, a.stack) == ("double-free", "double-free", user, 8, 3)
    assert (a.block.start, a.block.state, a.block.free_thread, a.block.free_time_ms) == (user, "freed", 8, 90)
