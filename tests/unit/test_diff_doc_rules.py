"""diff's document, filters and matching across processes, driven by fake memory.

GIVEN two fake snapshots (tests/fakes.py), of one process or of two runs,
with frames a FakeSymbolizer names
WHEN forensics.answers.diff compares them and builds its document
THEN stacks are kept or dropped by the filters exactly, two runs' stacks
meet by their frames' names (not their ids), and every field of the
document is what docs/json.md, "diff", says.
"""

from __future__ import annotations

import forensics_test_fakes as F

from forensics.answers.diff import diff, stack_diff_doc
from forensics.answers.documents import to_json

LEAK, CHURN, OTHER = F.PROGRAM_TEXT + 0x10, F.PROGRAM_TEXT + 0x20, F.PROGRAM_TEXT + 0x30


def symbols() -> F.FakeSymbolizer:
    return F.FakeSymbolizer(modules=[(F.PROGRAM, F.PROGRAM_TEXT, F.PROGRAM_TEXT + 0x1000)],
                            functions={LEAK: "leak_one", CHURN: "churn", OTHER: "cache_fill"})


def pair(**kw) -> tuple[F.FakeProcess, F.FakeProcess]:
    return F.FakeProcess(**kw), F.FakeProcess(**kw)


def test_the_document_splits_growth_from_the_rest_and_counts_every_block():
    # GIVEN a stack that grew by 3 x 24 bytes and one that churned 64 -> 32 bytes
    old, new = pair()
    for p in (old, new):
        p.stack_id(LEAK), p.stack_id(CHURN)
    leak, churn = 1, 2
    old.block(0x40, size=64, stack=churn, time=1)
    new.block(0x40, size=32, stack=churn, time=7)
    old.block(0x400, size=10, stack=leak, time=2)
    new.block(0x400, size=10, stack=leak, time=2)
    added = [new.block(0x100 + 0x40 * i, size=24, stack=leak, time=10 + i) for i in range(3)]
    old.control_fields.update(snapshot_seq=1, snapshot_time_ms=100)
    new.control_fields.update(snapshot_seq=2, snapshot_time_ms=200)
    o, n = F.dump(old, symbols()), F.dump(new, symbols())
    doc = to_json(stack_diff_doc(o, n, diff(o, n)))
    assert (doc["same_process"], doc["new_blocks"], doc["gone_blocks"], doc["survived_blocks"],
            doc["new_bytes"], doc["gone_bytes"], doc["warnings"]) == (True, 4, 1, 1, 104, 64, [])
    (g,) = doc["growth"]
    assert g == {"stack": g["stack"], "blocks": 3, "bytes": 72, "stack_id": leak,
                 "old": {"blocks": 1, "bytes": 10}, "new": {"blocks": 4, "bytes": 82}, "survived": 1,
                 "added": 3, "added_bytes": 72, "gone": 0, "gone_bytes": 0, "same_size_share": 1.0,
                 "common_size": 24, "addresses": [hex(a) for a in added]}
    assert [f["function"] for f in g["stack"]] == ["leak_one"]
    (c,) = doc["no_growth"]
    assert (c["stack_id"], c["blocks"], c["bytes"], c["added"], c["gone"], c["survived"]) == (churn, 0, -32, 1, 1, 0)
    assert (doc["old"], doc["new"]) == (
        {"core": "fake memory", "pid": F.PID, "snapshot_seq": 1, "time_ms": 100, "reason": "on-demand",
         "live_blocks": 2, "live_bytes": 74},
        {"core": "fake memory", "pid": F.PID, "snapshot_seq": 2, "time_ms": 200, "reason": "on-demand",
         "live_blocks": 5, "live_bytes": 114})


def test_old_taken_after_new_is_a_warning():
    old, new = pair()
    old.control_fields["snapshot_seq"] = 5
    new.control_fields["snapshot_seq"] = 3
    o, n = F.dump(old), F.dump(new)
    assert to_json(stack_diff_doc(o, n, diff(o, n)))["warnings"] == [
        f"OLD was taken after NEW (snapshot 5 of pid {F.PID} after snapshot 3): diff takes the earlier core "
        f"first (forensics diff OLD NEW), so here growth and shrinkage are swapped"]


def test_two_runs_are_ordered_by_wall_clock_and_share_no_block():
    old, new = F.FakeProcess(start_realtime_ns=10_000_000_000), F.FakeProcess(start_realtime_ns=2_000_000_000)
    old.control_fields["snapshot_time_ms"] = 500
    new.control_fields["snapshot_time_ms"] = 500
    s = old.stack_id(LEAK)
    new.stack_id(LEAK)
    old.block(0x40, size=16, stack=s, time=5)
    new.block(0x40, size=16, stack=s, time=5)  # the same identity, but another process
    o, n = F.dump(old, symbols()), F.dump(new, symbols())
    doc = to_json(stack_diff_doc(o, n, diff(o, n)))
    assert (doc["same_process"], doc["survived_blocks"], doc["new_blocks"], doc["gone_blocks"]) == (False, 0, 1, 1)
    assert doc["warnings"] == ["OLD was taken after NEW (8.0 s after): diff takes the earlier core first "
                               "(forensics diff OLD NEW), so here growth and shrinkage are swapped"]


def test_two_runs_meet_by_frame_names_not_stack_ids():
    # GIVEN the same leak at another stack id in each run (ASLR and another order)
    old, new = F.FakeProcess(start_realtime_ns=1), F.FakeProcess(start_realtime_ns=2)
    old_leak = old.stack_id(LEAK)
    new.stack_id(OTHER)
    new_leak = new.stack_id(LEAK)
    assert (old_leak, new_leak) == (1, 2)
    old.block(0x40, size=16, stack=old_leak)
    new.block(0x40, size=16, stack=new_leak)
    new.block(0x80, size=16, stack=new_leak)
    d = diff(F.dump(old, symbols()), F.dump(new, symbols()))
    (g,) = d.stacks
    assert (g.old_stack, g.new_stack, g.old_blocks, g.new_blocks, g.bytes, g.added, g.gone) == (1, 2, 1, 2, 16, 2, 1)


def test_filters_and_excludes_match_function_names_by_substring_or_glob():
    old, new = pair()
    ids = [(old.stack_id(pc), new.stack_id(pc)) for pc in (LEAK, CHURN, OTHER)]
    for i, (_, s) in enumerate(ids):
        new.block(0x40 + 0x100 * i, size=16 * (i + 1), stack=s, time=1)

    def kept(**kw) -> list[int]:
        return sorted(g.key for g in diff(F.dump(old, symbols()), F.dump(new, symbols()), **kw).stacks)

    assert kept() == [1, 2, 3]
    assert kept(filters=["leak"]) == [1]  # a substring
    assert kept(filters=["c*"]) == [2, 3]  # a glob matches the whole name
    assert kept(filters=["*_*"], excludes=["cache"]) == [1]
    assert kept(filters=["program"]) == [1, 2, 3]  # the module's file name counts too
    assert kept(filters=["nothing"]) == []
    assert kept(min_bytes=32) == [2, 3]
