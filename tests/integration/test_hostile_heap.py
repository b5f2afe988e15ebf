"""A heap that lies: the answers degrade, say so, and never loop or crash.

tests/victims/rob_hostile.c damages libtag's own structures from inside the
process (an overflow over a neighbour's tag, counts of the control block
overwritten through libtag_control(), a stack node that is its own parent, a
stack table cut short, a shadow stack pointer into nothing) and then
snapshots itself.  Each test reads that real core with the real ``forensics``
command in a subprocess with a timeout, so a reader that loops fails the test
instead of hanging it, and checks the degraded answer: what is still known
is right, and ``warnings`` names the problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import forensics_test_support as S

CLI_TIMEOUT = 60  # seconds; a reader that loops on a cycle fails here
ENV = {"LIBTAG_CORE": "self", "LIBTAG_STACK_NODES": "1024"}


@dataclass
class Victim:
    pid: int
    victim: int
    other: int
    printed: dict[str, list[str]]
    core: Path


@pytest.fixture(scope="module")
def hostile(build_victim, run_victim, tmp_path_factory):
    exe = build_victim("rob_hostile")

    def run(mode: str) -> Victim:
        snap_dir = tmp_path_factory.mktemp(f"hostile-{mode}")
        snap_dir.chmod(0o700)
        done = run_victim(exe, mode, snap_dir=snap_dir, env=ENV, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        printed = {ln.split()[0]: ln.split()[1:] for ln in done.stdout.splitlines()}
        assert "done" in printed, done.stdout + done.stderr
        pid = int(printed["pid"][0])
        return Victim(pid, int(printed["victim"][0], 16), int(printed["other"][0], 16),
                      printed, S.wait_core(snap_dir, pid))

    return run


@pytest.fixture
def forensics_json(run_cli, tmp_path):
    """forensics(*args) -> (exit code, JSON document or None, stderr), in a
    subprocess that must finish within CLI_TIMEOUT."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}

    def call(*args: str):
        r = run_cli(*args, env=env, timeout=CLI_TIMEOUT)
        assert r.returncode in (0, 1, 2), f"exit {r.returncode}: {r.stderr}"
        assert "Traceback" not in r.stderr, r.stderr
        doc = json.loads(r.stdout) if r.returncode in (0, 1) and "--json" in args else None
        return r.returncode, doc, r.stderr

    return call


def test_overflow_over_a_neighbours_tag(hostile, forensics_json):
    # GIVEN a core where a live block of 64 bytes was overrun by 32 bytes, over
    # its canary, its slot's slack and the 16-byte tag of the block after it
    v = hostile("overflow")
    assert int(v.printed["smashed"][0], 16) == v.other
    # WHEN inspect and whoowns read it
    code, doc, _ = forensics_json("inspect", "--json", str(v.core))
    # THEN inspect names the overflowing block in its warnings
    assert code == 0
    overflow = [w for w in doc["warnings"] if w.startswith("heap overflow")]
    assert len(overflow) == 1, doc["warnings"]
    assert f"{v.victim:#x} (64 bytes)" in overflow[0]
    # AND the slot whose tag was written over, the neighbour's (its tag 16
    # bytes below the block the victim printed)
    damaged = (f"libtag's heap: 1 slots hold a tag that does not validate or does not fit its slot "
               f"(written over), their blocks are not read: {v.other - 16:#x}")
    assert doc["warnings"] == overflow + [damaged]
    # AND the overflowing block is still found, with the warnings
    code, doc, _ = forensics_json("whoowns", hex(v.victim), "--core", str(v.core), "--json")
    assert (code, doc["block"]["start"], doc["block"]["size"]) == (0, hex(v.victim), 64)
    assert doc["warnings"] == overflow + [damaged]
    # AND the block whose tag was smashed is no longer claimed as a tagged block:
    # it is reported as lying past the end of the overflowing one
    code, doc, _ = forensics_json("whoowns", hex(v.other + 8), "--core", str(v.core), "--json")
    assert (code, doc["block"]) == (1, None)
    assert doc["near"]["block"]["start"] == hex(v.victim)
    assert doc["warnings"] == overflow + [damaged]


def test_control_block_counts_overwritten(hostile, forensics_json):
    # GIVEN a core whose control block claims 0xffffffff stack nodes and thread
    # slots and anomaly kind 77 (the reason the victim wrote, 99, is rewritten
    # by the snapshot child: "on-demand")
    v = hostile("control")
    # WHEN inspect reads it
    code, doc, _ = forensics_json("inspect", "--json", str(v.core))
    # THEN it answers (exit 0) with what it could read, and says what it could not
    assert code == 0
    assert doc["reason"] == "on-demand"
    assert [a["kind"] for a in doc["anomalies"]] == ["anomaly-77"]
    assert any(w.startswith(f"stack table count {0xffffffff} exceeds") for w in doc["warnings"]), doc["warnings"]
    # AND the heap is still scanned: both printed blocks are found, live
    code, w, _ = forensics_json("whoowns", hex(v.victim), "--core", str(v.core), "--json")
    assert (code, w["block"]["start"], w["block"]["state"]) == (0, hex(v.victim), "live")
    code, w, _ = forensics_json("whoowns", hex(v.other), "--core", str(v.core), "--json")
    assert (code, w["block"]["start"], w["block"]["size"]) == (0, hex(v.other), 64)


def test_control_block_layout_overwritten(hostile, forensics_json):
    # GIVEN a core whose control block says tags are 48 bytes
    v = hostile("sizes")
    # WHEN inspect reads it  THEN one error line names the corrupt control block (exit 2)
    code, _, err = forensics_json("inspect", str(v.core))
    assert code == 2
    assert err.splitlines() == [err.strip()] and err.startswith("forensics: error: corrupt libtag control block")
    assert "(48, 16, 8)" in err


def test_stack_node_cycle(hostile, forensics_json):
    # GIVEN a core where the innermost node of the victim block's allocation
    # stack is its own parent, and the other block's points forward
    v = hostile("cycle")
    ia, ib = (int(x) for x in v.printed["stack"])
    # WHEN whoowns asks about each (in a subprocess with a timeout: no loop)
    code, doc, _ = forensics_json("whoowns", hex(v.victim), "--core", str(v.core), "--json")
    # THEN the block is found with the one frame before the cycle, and the cycle is named
    assert (code, doc["block"]["start"]) == (0, hex(v.victim))
    assert len(doc["block"]["alloc_stack"]) == 1
    assert doc["block"]["alloc_stack"][0]["function"] == "alloc_victim"
    assert f"corrupt stack table: node {ia}'s parent {ia} is not below it" in " ".join(doc["warnings"])
    code, doc, _ = forensics_json("whoowns", hex(v.other), "--core", str(v.core), "--json")
    assert (code, len(doc["block"]["alloc_stack"])) == (0, 1)
    assert f"node {ib}'s parent {ib + 5} is not below it" in " ".join(doc["warnings"])
    # AND inspect finishes, with the warning
    code, doc, _ = forensics_json("inspect", "--json", str(v.core))
    assert code == 0 and any("corrupt stack table" in w for w in doc["warnings"]), doc["warnings"]


def test_stack_table_truncated(hostile, forensics_json):
    # GIVEN a core whose control block says the stack table has 2 nodes
    v = hostile("truncate")
    sid = int(v.printed["stack"][0])
    assert sid >= 2
    # WHEN whoowns asks about a block whose stack id is beyond them
    code, doc, _ = forensics_json("whoowns", hex(v.victim), "--core", str(v.core), "--json")
    # THEN the block is found, its stack is empty, and the warning says why
    assert (code, doc["block"]["start"], doc["block"]["alloc_stack"]) == (0, hex(v.victim), [])
    assert f"stack id {sid} is beyond the stack table's 2 nodes: its frames are unknown" in doc["warnings"]


def test_shadow_stack_pointer_into_nothing(hostile, forensics_json):
    # GIVEN a core whose thread record points at a shadow stack at 0x10000 (unmapped)
    v = hostile("shadow")
    # WHEN inspect reads it  THEN the warning names the shadow stack, and the
    # thread's stack still comes from its registers: unwound with CFI from
    # libtag's snapshot code through raise() to main, where the victim raised
    code, doc, _ = forensics_json("inspect", "--json", str(v.core))
    assert code == 0
    assert any(w.startswith("the shadow stack of thread ") and w.endswith("at 0x10000 is not readable")
               for w in doc["warnings"]), doc["warnings"]
    (stack,) = [t["stack"] for t in doc["threads"]]
    assert (stack[0]["function"], stack[0]["libtag"]) == ("_tag_snapshot_take", True), stack[0]
    assert [f["function"] for f in stack if f["file"] and f["file"].endswith("rob_hostile.c")] == ["main"]
    # AND the blocks are still found
    code, w, _ = forensics_json("whoowns", hex(v.victim), "--core", str(v.core), "--json")
    assert (code, w["block"]["start"]) == (0, hex(v.victim))


def test_a_full_stack_table_cuts_stacks_with_a_marker(build_victim, run_victim, forensics_json,
                                                      tmp_path):
    # GIVEN a stack table of 1024 nodes and a victim that allocates on 2048
    # different paths of 11 levels (step -> left or right, by the bits of the
    # path's number), then snapshots itself
    exe = build_victim("stack_full", instrument=False, extra_flags=("-O1",))
    snap_dir = tmp_path / "snaps"
    snap_dir.mkdir(mode=0o700)
    done = run_victim(exe, "2048", snap_dir=snap_dir, env=ENV, timeout=60)
    assert done.returncode == 0 and "done" in done.stdout, done.stdout + done.stderr
    said = dict(ln.split("=", 1) for ln in done.stdout.splitlines() if "=" in ln)
    depth = int(said["depth"])
    core = S.wait_core(snap_dir, int(said["pid"]))
    # WHEN whoowns asks about a block made before the table filled, and one after
    _, shallow, _ = forensics_json("whoowns", said["shallow"], "--core", str(core), "--json")
    _, deep, _ = forensics_json("whoowns", said["deep"], "--core", str(core), "--json")
    _, doc, _ = forensics_json("inspect", "--json", str(core))
    # THEN the early stack (path 3: left, left, then right) is whole
    path = ["left" if 3 >> k & 1 else "right" for k in range(depth)]
    want = ["leaf", "step"] + [x for side in reversed(path) for x in (side, "step")] + ["main"]
    names = [f["function"] for f in shallow["block"]["alloc_stack"]]
    assert names[:len(want)] == want, names
    # ... and the late one keeps the outer frames the table holds, cut by the
    # marker where the rest was lost: never a short stack that looks whole
    names = [f["function"] for f in deep["block"]["alloc_stack"]]
    assert names[0] == "[frames lost: libtag's stack table was full]", names
    outer = names[1:names.index("main")]
    assert 0 < len(outer) < len(want) - 2 and set(outer) <= {"step", "left"}, names
    assert doc["counters"]["stack_full"] > 0, doc["counters"]
    assert doc["counters"]["stack_nodes"] <= 1024, doc["counters"]

