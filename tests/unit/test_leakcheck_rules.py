"""The leak groups' document, the leak check at exit and its suppressions,
and trend's series, driven by fake memory and fake symbols.

GIVEN fake libtag processes (tests/fakes.py) with lost, indirect and kept
blocks, and suppression files' text
WHEN forensics.answers.leaks / leakcheck / trend build their documents
THEN the groups, their ages, the merged same-reading stacks, what a
suppression removes and counts, and each stack's series over the snapshots
are exactly what docs/json.md and docs/guide.md, "Leak check at exit", say.
"""

from __future__ import annotations

import forensics_test_fakes as F
import pytest

from forensics.answers.leakcheck import Suppressions, leak_check_doc
from forensics.answers.leaks import leaks_doc
from forensics.answers.documents import FrameDoc, to_json
from forensics.answers.trend import trend, trend_doc
from forensics.errors import InputError

LOSE, KEEP, CHILD = F.PROGRAM_TEXT + 0x10, F.PROGRAM_TEXT + 0x20, F.PROGRAM_TEXT + 0x30


def symbols() -> F.FakeSymbolizer:
    return F.FakeSymbolizer(modules=[(F.PROGRAM, F.PROGRAM_TEXT, F.PROGRAM_TEXT + 0x1000)],
                            functions={LOSE: "make_session", KEEP: "cache_put", CHILD: "make_buffer"})


def leaky() -> tuple[F.FakeProcess, dict]:
    """Two lost 16-byte sessions (each holding a 40-byte buffer), one kept cache entry."""
    proc = F.FakeProcess()
    proc.control_fields["snapshot_time_ms"] = 1000
    lose, keep, child = proc.stack_id(LOSE), proc.stack_id(KEEP), proc.stack_id(CHILD)
    s1 = proc.block(0x40, size=16, stack=lose, time=100)
    s2 = proc.block(0x80, size=16, stack=lose, time=300)
    b1 = proc.block(0x100, size=40, stack=child, time=100)
    proc.word(s1, b1)
    kept = proc.block(0x200, size=24, stack=keep, time=5)
    proc.word(proc.globals_at(0), kept)
    return proc, dict(lose=lose, keep=keep, child=child, s1=s1, s2=s2, b1=b1, kept=kept)


def test_leak_groups_with_their_ages_examples_and_what_is_lost_through_them():
    proc, x = leaky()
    groups = to_json(leaks_doc(F.dump(proc, symbols())))
    assert [(g["kind"], g["stack_id"], g["blocks"], g["bytes"]) for g in groups] == [
        ("definite", x["lose"], 2, 32), ("indirect", x["child"], 1, 40)]
    d = groups[0]
    assert (d["oldest_alloc_ms"], d["newest_alloc_ms"], d["age_ms"], d["examples"], d["usable_size"]) == (
        100, 300, {"oldest": 900, "newest": 700}, [hex(x["s1"]), hex(x["s2"])], None)
    assert (d["indirect_blocks"], d["indirect_bytes"], d["cycle_leaders"]) == (1, 40, 0)
    assert [f["function"] for f in d["stack"]] == ["make_session"]
    assert "indirect_blocks" not in groups[1]


def test_a_core_without_a_snapshot_time_has_no_ages():
    proc, _ = leaky()
    proc.control_fields["snapshot_time_ms"] = 0
    assert [g["age_ms"] for g in to_json(leaks_doc(F.dump(proc, symbols())))] == [None, None]


def test_the_leak_check_counts_what_is_left_and_fails_on_definite_or_indirect():
    proc, x = leaky()
    doc = to_json(leak_check_doc(F.dump(proc, symbols())))
    assert (doc["pid"], doc["core"], doc["reason"], doc["leaked"], doc["warnings"]) == (
        F.PID, "fake memory", "on-demand", True, [])
    assert doc["totals"] == {"definite": {"blocks": 2, "bytes": 32}, "indirect": {"blocks": 1, "bytes": 40},
                             "possible": {"blocks": 0, "bytes": 0}}
    assert doc["suppressed"] == {"blocks": 0, "bytes": 0, "patterns": []}


def test_a_suppression_removes_the_groups_it_matches_and_counts_them():
    proc, x = leaky()
    sup = Suppressions.parse("# ours\nleak:make_sess*\n\nmake_buffer$  # trailing comment\n", "my.supp")
    assert [(r.pattern, r.line) for r in sup.rules] == [("make_sess*", 2), ("make_buffer$", 4)]
    doc = to_json(leak_check_doc(F.dump(proc, symbols()), sup))
    assert (doc["leaks"], doc["leaked"]) == ([], False)
    assert doc["suppressed"] == {"blocks": 3, "bytes": 72, "patterns": [
        {"pattern": "make_sess*", "blocks": 2, "bytes": 32}, {"pattern": "make_buffer$", "blocks": 1, "bytes": 40}]}


@pytest.mark.parametrize("pattern, matches", [
    ("session", True), ("^make", True), ("^session", False), ("session$", True), ("make$", False),
    ("^make_session$", True), ("m*n", True), ("/fake/prog", True), ("fake*gram$", True), ("cache", False),
])
def test_a_pattern_matches_anywhere_in_a_function_file_or_module(pattern, matches):
    frame = FrameDoc(address="0x401000", function="make_session", file=None, line=None, module=F.PROGRAM,
                     inlined=False, libtag=False, module_offset="0x1000")
    assert (Suppressions.parse(pattern, "s").match([frame]) is not None) is matches


@pytest.mark.parametrize("text, message", [
    ("ok\nrace:foo\n", "my.supp:2: unknown suppression type 'race': expected leak:PATTERN or PATTERN"),
    ("leak:\n", "my.supp:1: empty suppression pattern"),
    ("\n\n^$\n", "my.supp:3: empty suppression pattern"),
])
def test_a_bad_suppression_line_is_named(text, message):
    with pytest.raises(InputError) as err:
        Suppressions.parse(text, "my.supp")
    assert err.value.message == message


def test_a_cpp_name_is_no_suppression_type():
    (rule,) = Suppressions.parse("std::vector<int>::push_back", "s").rules
    assert rule.pattern == "std::vector<int>::push_back"


def test_groups_whose_stacks_read_the_same_are_one():
    # GIVEN two call sites that symbolise the same (two stack ids, one function name)
    proc = F.FakeProcess()
    a, b = proc.stack_id(LOSE), proc.stack_id(LOSE)
    x = proc.block(0x40, size=16, stack=a, time=10)
    y = proc.block(0x80, size=32, stack=b, time=20)
    doc = to_json(leak_check_doc(F.dump(proc, symbols())))
    (g,) = doc["leaks"]
    assert (g["kind"], g["blocks"], g["bytes"], g["stack_id"], g["oldest_alloc_ms"], g["newest_alloc_ms"],
            g["examples"]) == ("definite", 2, 48, b, 10, 20, [hex(x), hex(y)])


# ---------------------------------------------------------------- trend --


def test_trend_follows_each_stack_over_the_snapshots_in_their_order():
    # GIVEN three snapshots of one process, given out of order
    snaps = []
    for seq, n in ((1, 1), (2, 2), (3, 4)):
        p = F.FakeProcess()
        p.control_fields.update(snapshot_seq=seq, snapshot_time_ms=100 * seq)
        grow, flat = p.stack_id(LOSE), p.stack_id(KEEP)
        for i in range(n):
            p.block(0x40 + 0x40 * i, size=16, stack=grow, time=i)
        p.block(0x400, size=100, stack=flat, time=0)
        snaps.append(p)
    dumps = [F.dump(snaps[i], symbols()) for i in (2, 0, 1)]
    doc = to_json(trend_doc(trend(dumps)))
    assert [s["snapshot_seq"] for s in doc["snapshots"]] == [1, 2, 3]
    assert (doc["same_process"], doc["monotonic_stacks"], doc["stacks_total"]) == (True, 1, 2)
    assert [(s["stack_id"], s["blocks"], s["bytes"], s["monotonic"], s["growth_bytes"], s["growth_blocks"])
            for s in doc["stacks"]] == [(1, [1, 2, 4], [16, 32, 64], True, 48, 3),
                                        (2, [1, 1, 1], [100, 100, 100], False, 0, 0)]
    assert [f["function"] for f in doc["stacks"][0]["stack"]] == ["make_session"]
    growing = to_json(trend_doc(trend(dumps), growing_only=True))
    assert ([s["stack_id"] for s in growing["stacks"]], growing["stacks_total"]) == ([1], 1)


def test_trend_top_cuts_the_list_and_says_how_many_there_were():
    snaps = []
    for seq in (1, 2):
        p = F.FakeProcess()
        p.control_fields["snapshot_seq"] = seq
        ids = [p.stack_id(pc) for pc in (LOSE, KEEP, CHILD)]
        for i, s in enumerate(ids):  # each stack grows by i + 1 blocks of 16 bytes
            for k in range(1 + (i + 1) * (seq - 1)):
                p.block(0x40 + 0x200 * i + 0x40 * k, size=16, stack=s)
        snaps.append(p)
    doc = to_json(trend_doc(trend([F.dump(p, symbols()) for p in snaps]), top=2))
    assert [(s["stack_id"], s["blocks"], s["growth_bytes"]) for s in doc["stacks"]] == [
        (3, [1, 4], 48), (2, [1, 3], 32)]
    assert (doc["stacks_total"], doc["monotonic_stacks"]) == (3, 3)
