"""inspect's document, driven by fake memory (no process, no core).

GIVEN a fake libtag process (tests/fakes.py) with blocks, stacks, an
anomaly libtag recorded, a crash or a write into a freed block
WHEN forensics.answers.inspect builds its document
THEN the totals, top stacks, reason, anomalies (block, offset, written),
crash and counters are exactly what docs/json.md, "inspect", says.
"""

from __future__ import annotations

import forensics_test_fakes as F
import pytest

from forensics.answers import inspect
from forensics.answers.documents import to_json
from forensics.errors import InputError
from forensics.reader import abi

START_NS = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z
MAIN, HELPER = F.PROGRAM_TEXT + 0x100, F.PROGRAM_TEXT + 0x200


def symbols() -> F.FakeSymbolizer:
    return F.FakeSymbolizer(modules=[(F.PROGRAM, F.PROGRAM_TEXT, F.PROGRAM_TEXT + 0x1000)],
                            functions={MAIN: "main", HELPER: "helper"})


def doc_of(proc: F.FakeProcess, **kw) -> dict:
    return to_json(inspect.inspect_doc(F.dump(proc, symbols()), **kw))


def names(frames: list[dict]) -> list[str | None]:
    return [f["function"] for f in frames]


# ------------------------------------------------------- totals, stacks --


def test_totals_and_top_stacks_by_live_bytes():
    # GIVEN three stacks: 2 x 16 bytes, 1 x 100 bytes, 3 x 8 bytes, and a freed block
    proc = F.FakeProcess()
    s1, s2, s3 = proc.stack_id(MAIN), proc.stack_id(MAIN, HELPER), proc.stack_id(HELPER)
    proc.block(0x40, size=16, stack=s1)
    proc.block(0x80, size=16, stack=s1)
    proc.block(0xC0, size=100, stack=s2)
    for i in range(3):
        proc.block(0x180 + 0x40 * i, size=8, stack=s3)
    proc.block(0x300, size=500, stack=s3, freed=(0, 1, 1))
    doc = doc_of(proc)
    assert doc["heap"] == {"live_blocks": 6, "live_bytes": 156, "freed_blocks": 1, "freed_bytes": 500}
    assert [(names(t["stack"]), t["blocks"], t["bytes"], t["runtime"]) for t in doc["top_stacks"]] == [
        (["helper", "main"], 1, 100, False), (["main"], 2, 32, False), (["helper"], 3, 24, False)]
    assert doc["runtime"] == {"blocks": 0, "bytes": 0, "stacks": 0, "shown": False}
    # --top 2: the first two only
    assert [t["bytes"] for t in doc_of(proc, top=2)["top_stacks"]] == [100, 32]


def test_the_document_names_the_process_threads_and_counters():
    proc = F.FakeProcess(pid=777)
    proc.thread(4343, sp_offset=0x400)
    proc.threads[0].update(allocs=10, frees=4, alloc_bytes=1000, free_bytes=300)
    proc.threads[1].update(allocs=5, frees=5, alloc_bytes=50, free_bytes=50)
    proc.control_fields.update(anomaly_count=2, stack_full=3, latent_uaf=1, guard_rate=100)
    doc = doc_of(proc)
    assert (doc["core"], doc["process"], doc["reason"], doc["payload"], doc["libtag"], doc["crash"]) == (
        "fake memory", {"pid": 777, "exe": None}, "on-demand", "kept", True, None)
    assert [(t["tid"], t["sp"], t["stack"]) for t in doc["threads"]] == [
        (F.MAIN_TID, hex(proc.stack_at(0x800)), []), (4343, hex(proc.stack_at(0x400)), [])]
    c = doc["counters"]
    assert (c["allocs"], c["frees"], c["alloc_bytes"], c["free_bytes"], c["threads"]) == (15, 9, 1050, 350, 2)
    assert (c["anomalies"], c["stack_full"], c["latent_uaf"], c["guard_rate"], c["stack_nodes"]) == (2, 3, 1, 100, 1)


@pytest.mark.parametrize("reason, crash, want", [
    (abi.TAG_REASON_ON_DEMAND, False, "on-demand"),
    (abi.TAG_REASON_EXIT, False, "exit"),
    (abi.TAG_REASON_CRASH, True, "crash"),
    (abi.TAG_REASON_NONE, False, "on-demand"),  # gcore of a libtag process
    (abi.TAG_REASON_NONE, True, "crash"),  # a crash libtag saw, a core it did not write
    (99, False, "on-demand"),  # a reason this reader does not know
])
def test_the_reason(reason, crash, want):
    proc = F.FakeProcess(reason=reason)
    if crash:
        proc.crash = dict(signal=11, tid=F.MAIN_TID, address=0x10, code=1, time=3)
    assert inspect.inspect_reason(F.control(proc)) == want


def test_payloads_omitted_are_said_and_hide_no_use_after_free_guess():
    proc = F.FakeProcess()
    proc.control_fields["options"] = abi.TAG_OPTION_NO_PAYLOAD
    proc.block(0x40, size=32, freed=(0, 1, 1))
    proc.put(0x40 + 32, bytes(32))  # blank, as an omitted payload is
    doc = doc_of(proc)
    assert (doc["payload"], doc["anomalies"]) == ("omitted", [])


# ------------------------------------------------------------ anomalies --


def test_a_double_free_names_the_freed_block_its_free_and_the_second_free():
    proc = F.FakeProcess(start_realtime_ns=START_NS)
    alloc, free1, free2 = proc.stack_id(MAIN), proc.stack_id(HELPER), proc.stack_id(MAIN, HELPER)
    b = proc.block(0x40, size=32, stack=alloc, time=10, freed=(free1, 7, 50))
    proc.record_anomaly(abi.TAG_ANOMALY_DOUBLE_FREE, b, tid=8, stack=free2, time=60)
    doc = doc_of(proc)
    assert doc["reason"] == "double-free"
    (a,) = doc["anomalies"]
    assert (a["kind"], a["address"], a["offset"], a["thread"], a["time_ms"], a["time"]) == (
        "double-free", hex(b), 0, 8, 60, "2023-11-14T22:13:20.060Z")
    assert (names(a["stack"]), a["written"], a["dealloc"], a["access"], a["pc"], a["detected_by"]) == (
        ["helper", "main"], None, None, None, None, "libtag")
    blk = a["block"]
    assert (blk["start"], blk["size"], blk["state"], blk["free_thread"], names(blk["alloc_stack"]),
            names(blk["free_stack"]), blk["alloc_time"], blk["free_time"]) == (
        hex(b), 32, "freed", 7, ["main"], ["helper"], "2023-11-14T22:13:20.010Z", "2023-11-14T22:13:20.050Z")


def test_an_invalid_free_of_an_interior_pointer_names_the_block_holding_it():
    # GIVEN free(p + 32) of a live 64-byte p: libtag names no block
    proc = F.FakeProcess()
    p = proc.block(0x40, size=64)
    proc.record_anomaly(abi.TAG_ANOMALY_INVALID_FREE, p, address=p + 32, block=0)
    (a,) = doc_of(proc)["anomalies"]
    # THEN the block holding the address is given, with the offset into it
    assert (a["kind"], a["address"], a["offset"]) == ("invalid-free", hex(p + 32), 32)
    assert (a["block"]["start"], a["block"]["offset"], a["block"]["state"]) == (hex(p), 32, "live")


def test_an_invalid_free_of_an_address_in_no_block_has_no_block():
    proc = F.FakeProcess()
    p = proc.block(0x40, size=64)
    proc.record_anomaly(abi.TAG_ANOMALY_INVALID_FREE, p, address=proc.globals_at(0x10), block=0)
    (a,) = doc_of(proc)["anomalies"]
    assert (a["address"], a["block"], a["offset"]) == (hex(proc.globals_at(0x10)), None, None)


def test_a_smashed_canary_shows_the_bytes_written_over_it():
    # GIVEN a 24-byte block whose canary the program overwrote with "AB"
    proc = F.FakeProcess()
    p = proc.block(0x40, size=24)
    canary = abi.tag_canary_value(p - abi.TAG_SIZE, F.SECRET).to_bytes(8, "little")
    proc.put(0x40 + abi.TAG_SIZE + 24, b"AB")
    proc.record_anomaly(abi.TAG_ANOMALY_HEAP_OVERFLOW, p, address=p + 24)
    doc = doc_of(proc)
    (a,) = doc["anomalies"]
    # THEN written is the rest of the canary from the first damaged byte, as the core holds it
    assert (a["kind"], a["address"], a["offset"], a["written"]) == (
        "heap-overflow", hex(p + 24), 24, (b"AB" + canary[2:]).hex())
    # and the reader's own canary check says it too
    assert doc["warnings"] == [
        f"heap overflow: the canary after 1 live block(s) is smashed - written past their end: "
        f"{p:#x} (24 bytes); a block right after one may have lost its tag and be missing from the answers"]


def test_an_overflow_from_the_middle_of_the_canary_starts_there():
    proc = F.FakeProcess()
    p = proc.block(0x40, size=24)
    canary = abi.tag_canary_value(p - abi.TAG_SIZE, F.SECRET).to_bytes(8, "little")
    proc.put(0x40 + abi.TAG_SIZE + 24 + 5, b"\x00")
    proc.record_anomaly(abi.TAG_ANOMALY_HEAP_OVERFLOW, p, address=p + 29)
    (a,) = doc_of(proc)["anomalies"]
    assert (a["offset"], a["written"]) == (29, (b"\x00" + canary[6:]).hex())


def test_a_use_after_free_shows_the_bytes_written_into_the_freed_block_once():
    # GIVEN a freed block written at offsets 8..11, which libtag caught
    proc = F.FakeProcess()
    b = proc.block(0x40, size=32, freed=(0, 7, 50))
    proc.put(0x40 + abi.TAG_SIZE + 8, b"\x01\x02\xfd\x04")  # 0xfd: the free pattern byte, kept in the run
    proc.record_anomaly(abi.TAG_ANOMALY_USE_AFTER_FREE, b, address=b + 8)
    (a,) = doc_of(proc)["anomalies"]  # not listed a second time as the reader's
    assert abi.TAG_FREE_PATTERN == 0xFD
    assert (a["kind"], a["offset"], a["written"], a["detected_by"]) == ("use-after-free", 8, "0102fd04", "libtag")


def test_a_write_into_a_freed_block_libtag_has_not_seen_is_the_readers_anomaly():
    proc = F.FakeProcess(start_realtime_ns=START_NS)
    proc.control_fields["snapshot_time_ms"] = 900
    proc.block(0x40, size=16)
    b = proc.block(0x80, size=32, freed=(0, 7, 50))
    proc.put(0x80 + abi.TAG_SIZE + 4, b"\x2a")
    (a,) = doc_of(proc)["anomalies"]
    assert a == {"kind": "use-after-free", "address": hex(b + 4), "block": a["block"], "stack": [],
                 "thread": None, "time": "2023-11-14T22:13:20.900Z", "time_ms": 900, "offset": 4,
                 "written": "2a", "dealloc": None, "access": None, "pc": None, "detected_by": "reader"}
    assert (a["block"]["start"], a["block"]["offset"], a["block"]["state"]) == (hex(b), 4, "freed")


def damaged_double_free() -> tuple[F.FakeProcess, int]:
    """A double free of a block whose tag libtag found damaged beyond
    repair: its copy in the anomaly and the tag in memory do not validate."""
    proc = F.FakeProcess()
    b = proc.block(0x40, size=32, freed=(0, 7, 50))
    proc.record_anomaly(abi.TAG_ANOMALY_DOUBLE_FREE, b)
    proc.anomaly["tag"]["bits"] ^= 1  # its check
    proc.put(0x48, b"\0\0")  # and the tag in memory
    return proc, b


def test_an_anomaly_whose_tag_copy_does_not_validate_has_no_block_and_a_warning():
    proc, b = damaged_double_free()
    doc = doc_of(proc)
    (a,) = doc["anomalies"]
    assert (a["kind"], a["address"], a["block"], a["offset"]) == ("double-free", hex(b), None, None)
    assert f"double-free at {b:#x}: the block's tag was damaged beyond repair; " \
           f"its size, stacks and thread are unknown" in doc["warnings"]


def test_the_damaged_tag_warning_is_said_once():
    proc, b = damaged_double_free()
    assert doc_of(proc)["warnings"] == [f"double-free at {b:#x}: the block's tag was damaged beyond repair; "
                                        f"its size, stacks and thread are unknown"]


def test_a_mismatched_release_names_how_it_was_released():
    proc = F.FakeProcess()
    p = proc.block(0x40, size=16)
    proc.record_anomaly(abi.TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH, p, dealloc=abi.TAG_ALLOC_NEW_ARRAY)
    (a,) = doc_of(proc)["anomalies"]
    assert (a["kind"], a["dealloc"], a["block"]["alloc_kind"]) == ("alloc-dealloc-mismatch", "delete[]", "malloc")


# ---------------------------------------------------------------- crash --


def test_a_fault_in_a_block_says_whose_address_it_is():
    proc = F.FakeProcess(reason=abi.TAG_REASON_CRASH, start_realtime_ns=START_NS)
    p = proc.block(0x40, size=24)
    proc.crash = dict(signal=11, tid=F.MAIN_TID, address=p + 8, code=1, stack=0, time=70)
    doc = doc_of(proc)
    c = doc["crash"]
    assert (doc["reason"], c["signal"], c["code"], c["code_name"], c["address"], c["address_source"]) == (
        "crash", "SIGSEGV", 1, "SEGV_MAPERR", hex(p + 8), "fault")
    assert (c["summary"], c["sender"], c["thread"], c["time_ms"], c["time"]) == (
        f"SIGSEGV (SEGV_MAPERR) at address {p + 8:#x}", None, F.MAIN_TID, 70, "2023-11-14T22:13:20.070Z")
    o = c["address_owner"]
    assert (o["owner"], o["region"], o["note"], o["block"]["start"], o["block"]["offset"]) == (
        "heap", "heap", "8 bytes into a live block of 24 bytes", hex(p), 8)


def test_a_signal_the_process_sent_itself_names_the_sender_and_no_address():
    proc = F.FakeProcess(reason=abi.TAG_REASON_CRASH)
    si_tkill = (1 << 32) - 6  # -6 as the control block's u32
    proc.crash = dict(signal=6, tid=F.MAIN_TID, address=F.PID | 1000 << 32, code=si_tkill, time=1)
    c = doc_of(proc)["crash"]
    assert (c["signal"], c["code"], c["code_name"], c["address"], c["address_owner"]) == (
        "SIGABRT", -6, "SI_TKILL", None, None)
    assert c["sender"] == {"pid": F.PID, "uid": 1000, "self": True}
    assert c["summary"] == f"SIGABRT sent by the process itself (abort, raise) (pid {F.PID}, uid 1000, SI_TKILL)"


def test_a_fault_on_the_null_page_is_unmapped():
    proc = F.FakeProcess(reason=abi.TAG_REASON_CRASH)
    proc.crash = dict(signal=11, tid=F.MAIN_TID, address=0x18, code=1, time=1)
    o = doc_of(proc)["crash"]["address_owner"]
    assert o == {"owner": "unmapped", "region": None, "note": "NULL page", "block": None}


# ------------------------------------------------------- --blocks N --


def test_the_blocks_of_a_stack_by_rank_with_their_ages():
    proc = F.FakeProcess()
    proc.control_fields["snapshot_time_ms"] = 1000
    big, small = proc.stack_id(MAIN), proc.stack_id(HELPER)
    a = proc.block(0x40, size=100, stack=big, time=400, tid=9)
    b = proc.block(0x100, size=50, stack=big, time=900)
    proc.block(0x180, size=8, stack=small)
    sb = to_json(inspect.stack_blocks(F.dump(proc, symbols()), 1))
    assert (sb["rank"], names(sb["stack"]), sb["count"], sb["bytes"]) == (1, ["main"], 2, 150)
    assert sb["blocks"] == [{"start": hex(a), "size": 100, "thread": 9, "age_ms": 600},
                            {"start": hex(b), "size": 50, "thread": F.MAIN_TID, "age_ms": 100}]


def test_a_rank_past_the_last_stack_is_a_one_line_error():
    proc = F.FakeProcess()
    proc.block(0x40, size=8, stack=proc.stack_id(MAIN))
    proc.block(0x80, size=8, stack=proc.stack_id(HELPER))
    with pytest.raises(InputError) as err:
        inspect.stack_blocks(F.dump(proc, symbols()), 3)
    assert err.value.message == "inspect: --blocks 3: the core has 2 allocation stacks with live blocks (#1 to #2)"
