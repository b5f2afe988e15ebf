"""The shared JSON shapes (frame, block, times), driven by fake memory.

GIVEN blocks of a fake libtag process and frames a FakeSymbolizer names
WHEN forensics.answers.shapes builds their documents (and to_json their JSON)
and their labels
THEN every field is what docs/json.md, "Shared shapes", says: addresses as
"0x..." strings, times as ISO-8601 UTC from the process's clock, ages at
the core's time, and a frame without a function labelled module+offset.
"""

from __future__ import annotations

import forensics_test_fakes as F

from forensics.answers.documents import FrameDoc, to_json
from forensics.answers.shapes import block_doc, frame_doc, frame_label, hexaddr, iso_time
from forensics.reader import abi
from forensics.reader.model import Frame
from forensics.reader.symbols import SymbolFrame

START_NS = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z


def test_hexaddr_and_iso_time():
    assert (hexaddr(None), hexaddr(0), hexaddr(0x7F00DEAD)) == (None, "0x0", "0x7f00dead")
    assert iso_time(START_NS + 123_456_789) == "2023-11-14T22:13:20.123Z"  # milliseconds, cut not rounded


def _frame(address: str | None, function: str | None, module: str | None, module_offset: str | None) -> FrameDoc:
    return FrameDoc(address=address, function=function, file=None, line=None, module=module, inlined=False,
                    libtag=False, module_offset=module_offset)


def test_frame_labels():
    assert frame_label(_frame("0x1", "main", "/bin/p", "0x10")) == "main"
    assert frame_label(_frame("0x55d01904b", None, "/usr/sbin/memcached", "0x1904b")) == "memcached+0x1904b"
    assert frame_label(_frame("0x1234", None, None, None)) == "0x1234"
    assert frame_label(_frame(None, None, None, None)) == "??"


def test_a_frames_json_keeps_every_field_and_the_module_offset():
    f = SymbolFrame(0x555400000110, "helper", "/src/p.c", 42, F.PROGRAM, inlined=True, module_offset=0x110)
    assert to_json(frame_doc(f)) == {"address": "0x555400000110", "function": "helper", "file": "/src/p.c", "line": 42,
                             "module": F.PROGRAM, "inlined": True, "libtag": False, "module_offset": "0x110"}
    assert frame_doc(Frame(0x10)).module_offset is None  # a plain Frame has none


def test_a_block_from_a_dump_has_its_times_and_age_at_the_snapshot():
    proc = F.FakeProcess(start_realtime_ns=START_NS)
    proc.control_fields["snapshot_time_ms"] = 2234
    s = proc.stack_id(F.PROGRAM_TEXT + 0x10)
    live = proc.block(0x40, size=24, stack=s, time=1000, tid=7)
    freed = proc.block(0x80, size=16, stack=s, time=200, freed=(s, 8, 1800))
    dump = F.dump(proc, F.FakeSymbolizer(functions={F.PROGRAM_TEXT + 0x10: "main"}))
    heap = dump.heap
    doc = to_json(block_doc(heap.block_at(live), dump, offset=4))
    assert {k: doc[k] for k in ("start", "size", "offset", "state", "thread", "free_stack", "free_thread",
                                "alloc_kind", "alloc_time", "free_time", "age_s", "guarded")} == {
        "start": hex(live), "size": 24, "offset": 4, "state": "live", "thread": 7, "free_stack": None,
        "free_thread": None, "alloc_kind": "malloc", "alloc_time": "2023-11-14T22:13:21.000Z", "free_time": None,
        "age_s": 1.234, "guarded": False}
    assert [f["function"] for f in doc["alloc_stack"]] == ["main"]
    doc = to_json(block_doc(heap.block_at(freed), dump))
    assert (doc["offset"], doc["state"], doc["free_thread"], [f["function"] for f in doc["free_stack"]],
            doc["free_time"], doc["age_s"]) == (0, "freed", 8, ["main"], "2023-11-14T22:13:21.800Z", 2.034)


def test_a_block_of_a_process_without_a_start_time_has_no_times():
    proc = F.FakeProcess(start_realtime_ns=0)
    b = proc.block(0x40, size=24, time=1000)
    dump = F.dump(proc)
    doc = to_json(block_doc(dump.heap.block_at(b), dump))
    assert (doc["alloc_time"], doc["free_time"], doc["age_s"]) == (None, None, None)


def test_a_block_with_a_stack_function_instead_of_a_dump_has_no_clock():
    proc = F.FakeProcess(start_realtime_ns=START_NS)
    b = proc.block(0x40, size=16, stack=3, freed=(5, 9, 700))
    asked = []

    def frames(sid):
        asked.append(sid)
        return [Frame(0x1000 + sid, f"fn{sid}")]

    doc = to_json(block_doc(F.heap(proc).block_at(b), frames))
    assert asked == [3, 5]
    assert ([f["function"] for f in doc["alloc_stack"]], [f["function"] for f in doc["free_stack"]]) == (
        ["fn3"], ["fn5"])
    assert (doc["alloc_time"], doc["free_time"], doc["age_s"], doc["free_thread"]) == (None, None, None, 9)


def test_a_freed_block_whose_free_record_did_not_validate_has_no_free_stack():
    proc = F.FakeProcess()
    b = proc.block(0x40, size=16, freed=(5, 9, 700))
    proc.ring[0]["rec"]["free_tid"] = 10  # not the record libtag wrote
    dump = F.dump(proc)
    doc = to_json(block_doc(dump.heap.block_at(b), dump))
    assert (doc["state"], doc["free_stack"], doc["free_thread"], doc["free_time"]) == ("freed", None, None, None)


def test_the_alloc_kind_comes_from_the_tag():
    proc = F.FakeProcess()
    b = proc.block(0x40, size=16)
    # set the tag's allocation kind to new[] and recompute its check, as libtag writes it
    proc.put(0x40, F.tag_bytes(F.HEAP + 0x40, 0, 0, abi.tag_bits(F.MAIN_TID, 16, abi.TAG_STATE_LIVE,
                                                                 abi.TAG_ALLOC_NEW_ARRAY)))
    dump = F.dump(proc)
    assert to_json(block_doc(dump.heap.block_at(b), dump))["alloc_kind"] == "new[]"
