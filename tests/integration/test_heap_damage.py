"""Smashed headers, writes after free and mismatched releases: each gives
exactly the one anomaly the victim caused - kind, block, size, offset, the
bytes written, both stacks, thread - no extra anomaly, and the program runs on
to exit 0 (libtag never hands a damaged block back to its heap, where the
same write may have gone on into memory the heap hands out again).

Victims: tests/victims/heap_damage.c (an underflow, an overflow into the
next block, an overflow of a block never freed, writes after free at chosen
offsets by the freeing thread, another thread or into a worker's block) and
tests/victims/mismatch.cc (new[]/delete, malloc/delete, new/free).  Each
prints what it knows (block=, size=, tid=, free_tid=, address= the first byte
it damaged) before the misuse.  Every core is read with `forensics inspect
--json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from forensics.snapshots import snapdir
import forensics_test_support as S


def facts(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def functions(frames: list[dict], exe: Path) -> list[str]:
    """The function names of the frames in the victim itself, innermost first,
    through main (CFI stacks go on into libc's start-up and the victim's _start)."""
    names = [f["function"] for f in frames if f["module"] == str(exe)]
    return names[:names.index("main") + 1] if "main" in names else names


def stats(stderr: str) -> dict[str, str]:
    """The LIBTAG_STATS=1 line libtag prints at exit."""
    line = next((ln for ln in stderr.splitlines() if ln.startswith("libtag: stats ")), None)
    assert line is not None, f"expected a 'libtag: stats' line, got {stderr!r}"
    return dict(kv.split("=", 1) for kv in line.split()[2:])


def run(run_victim, exe: Path, snaps: Path, *args: str, **env: str):
    done = run_victim(exe, *args, snap_dir=snaps, on_anomaly="snapshot",
                      env={"LIBTAG_CORE": "self", "LIBTAG_QUARANTINE": "4096",
                           "LIBTAG_STATS": "1", **env})
    # THEN the program ran on to its normal end
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    assert done.stdout.splitlines()[-1] == "survived", done.stdout
    return done


def one_anomaly_core(snaps: Path, kind: str) -> Path:
    """The one snapshot in snaps, which must be the anomaly's: no second one."""
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1 and dirs[0].name.endswith(f"-1-{kind}"), (
        f"expected exactly one snapshot, *-1-{kind}, got {[d.name for d in dirs]}")
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    assert core is not None, f"expected a core in {snap.path}"
    return core


def inspect(run_cli, core: Path, tmp_path: Path) -> dict:
    result = run_cli("inspect", str(core), "--json", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def the_anomaly(doc: dict) -> dict:
    assert len(doc["anomalies"]) == 1, doc["anomalies"]
    a = doc["anomalies"][0]
    assert doc["counters"]["anomalies"] == 1, doc["counters"]
    assert a["time"].endswith("Z") and a["time_ms"] >= 0, a
    return a


@pytest.fixture(scope="module")
def damage(build_victim) -> Path:
    return Path(os.path.realpath(build_victim("heap_damage", instrument=False)))


# ------------------------------------------------------------- underflow --


@pytest.mark.parametrize("case", ["underflow", "underflow-exit"])
def test_one_byte_underflow_is_a_heap_underflow_of_its_own_block(case, damage, run_victim,
                                                                  run_cli, tmp_path):
    # GIVEN p[-1] = 0x41 on a live 40-byte block, then free(p) - or no free
    # at all: the program just exits and libtag's exit check finds it
    snaps = tmp_path / "snaps"
    done = run(run_victim, damage, snaps, case)
    f = facts(done.stdout)
    block, tid = int(f["block"], 16), int(f["tid"])
    # THEN exactly one anomaly: heap-underflow of that block at p - 1
    a = the_anomaly(inspect(run_cli, one_anomaly_core(snaps, "heap-underflow"), tmp_path))
    assert (a["kind"], a["address"], a["offset"], a["written"]) == (
        "heap-underflow", hex(block - 1), -1, "41"), a
    b = a["block"]
    assert (b["start"], b["size"], b["state"], b["thread"], b["alloc_kind"]) == (
        hex(block), 40, "live", tid, "malloc"), b
    assert functions(b["alloc_stack"], damage) == ["alloc_victim", "main"], b["alloc_stack"]
    if case == "underflow":
        assert functions(a["stack"], damage) == ["free_victim", "main"], a["stack"]
        # ... and the block, freed, is kept from the heap at exit, and counted
        assert stats(done.stderr)["damaged_leaked"] == "1", done.stderr
    assert a["thread"] == tid
    assert stats(done.stderr)["anomalies"] == "1", done.stderr


# -------------------------------------------------------------- overflow --


@pytest.mark.parametrize("order", ["p-first", "q-first"])
def test_overflow_into_the_next_block_is_one_heap_overflow_of_the_block_before(
        order, damage, run_victim, run_cli, tmp_path):
    # GIVEN 100 bytes written past the end of a 64-byte block p, over the
    # tag of the 64-byte block q in the next slot, then both freed
    # (in either order) and p pushed out of the quarantine
    snaps = tmp_path / "snaps"
    done = run(run_victim, damage, snaps, "overflow-neighbour", order)
    f = facts(done.stdout)
    block, neighbour, tid = int(f["block"], 16), int(f["neighbour"], 16), int(f["tid"])
    written = S.overwritten(f["written"], 0x42).hex()
    assert block < neighbour - 16 < block + 64 + 100, "q's tag must lie in the overflow"
    # THEN exactly one anomaly, blamed on p, with its stacks; none for q
    a = the_anomaly(inspect(run_cli, one_anomaly_core(snaps, "heap-overflow"), tmp_path))
    assert (a["kind"], a["address"], a["offset"], a["written"]) == (
        "heap-overflow", hex(block + 64), 64, written), a
    b = a["block"]
    assert (b["start"], b["size"], b["thread"]) == (hex(block), 64, tid), b
    assert functions(b["alloc_stack"], damage) == ["alloc_victim", "main"], b["alloc_stack"]
    detect = "free_victim" if order == "p-first" else "free_neighbour"
    assert functions(a["stack"], damage) == [detect, "main"], a["stack"]
    # ... and neither p nor q was handed back to the heap
    s = stats(done.stderr)
    assert (s["anomalies"], s["damaged_leaked"]) == ("1", "2"), done.stderr


def test_overflow_of_a_block_never_freed_is_reported_at_exit(damage, run_victim, run_cli, tmp_path):
    # GIVEN 8 bytes written past the end of a 64-byte block that is never freed
    snaps = tmp_path / "snaps"
    done = run(run_victim, damage, snaps, "overflow-kept")
    f = facts(done.stdout)
    block, tid = int(f["block"], 16), int(f["tid"])
    written = S.overwritten(f["written"], 0x43).hex()
    # THEN the exit check reports it: one heap-overflow of that block
    a = the_anomaly(inspect(run_cli, one_anomaly_core(snaps, "heap-overflow"), tmp_path))
    assert (a["kind"], a["address"], a["offset"], a["written"]) == (
        "heap-overflow", hex(block + 64), 64, written), a
    b = a["block"]
    assert (b["start"], b["size"], b["state"], b["thread"]) == (hex(block), 64, "live", tid), b
    assert functions(b["alloc_stack"], damage) == ["alloc_victim", "main"], b["alloc_stack"]


# ------------------------------------------------------- use after free --

UAF_CASES = [(off, who, churn) for off in (0, 8, 24, 119) for who in ("same", "other")
             for churn in ("evict", "none")] + [(0, "worker", "none"), (100, "worker", "none")]


@pytest.mark.parametrize("off,who,churn", UAF_CASES,
                         ids=[f"off{o}-{w}-{c}" for o, w, c in UAF_CASES])
def test_write_after_free_is_caught_at_its_offset_with_the_free_record(
        off, who, churn, damage, run_victim, run_cli, tmp_path):
    # GIVEN a 120-byte block freed, then 0x5a written at OFF by the freeing
    # thread, another thread, or (worker) main into a block a worker freed;
    # then enough frees to evict it, or none (checked when the freeing
    # thread or the process exits)
    snaps = tmp_path / "snaps"
    done = run(run_victim, damage, snaps, "uaf", str(off), who, churn)
    f = facts(done.stdout)
    block, tid, free_tid = int(f["block"], 16), int(f["tid"]), int(f["free_tid"])
    assert int(f["address"], 16) == block + off
    # THEN one use-after-free at the damaged byte, naming the block and who
    # freed it: the free record survived the write, even at offset 0
    a = the_anomaly(inspect(run_cli, one_anomaly_core(snaps, "use-after-free"), tmp_path))
    assert (a["kind"], a["address"], a["offset"], a["written"]) == (
        "use-after-free", hex(block + off), off, "5a"), a
    b = a["block"]
    assert (b["start"], b["size"], b["state"], b["thread"], b["free_thread"]) == (
        hex(block), 120, "freed", tid, free_tid), b
    caller = "worker" if who == "worker" else "uaf"
    assert functions(b["alloc_stack"], damage)[:2] == ["alloc_victim", caller], b["alloc_stack"]
    assert functions(b["free_stack"], damage)[:2] == ["free_victim", caller], b["free_stack"]
    if churn == "evict":
        assert functions(a["stack"], damage)[:1] == ["churn"], a["stack"]
    assert stats(done.stderr)["anomalies"] == "1", done.stderr


def test_a_snapshot_records_a_write_after_free_it_finds(damage, run_victim, run_cli, tmp_path):
    # GIVEN a write at offset 24 into a freed block, then libtag_snapshot()
    snaps = tmp_path / "snaps"
    done = run(run_victim, damage, snaps, "uaf-snapshot", "24")
    f = facts(done.stdout)
    block = int(f["block"], 16)
    names = [d.name for d in S.snapshot_dirs(snaps)]
    # THEN the on-demand snapshot holds the write (found by its fork child),
    # and the exit check reports it as the process's one anomaly
    assert sorted(n.split("-", 3)[-1] for n in names) == ["1-on-demand", "2-use-after-free"], names
    on_demand = next(d for d in S.snapshot_dirs(snaps) if d.name.endswith("-1-on-demand"))
    snap = snapdir.wait_complete(on_demand, 60)
    doc = inspect(run_cli, snapdir.find_core(snap.path), tmp_path)
    assert doc["reason"] == "on-demand"
    assert [(a["kind"], a["address"], a["written"], a["block"]["start"]) for a in doc["anomalies"]] == [
        ("use-after-free", hex(block + 24), "5a", hex(block))], doc["anomalies"]
    assert doc["counters"]["latent_uaf"] == 1, doc["counters"]
    assert stats(done.stderr)["anomalies"] == "1", done.stderr


# -------------------------------------------------------------- mismatch --

# victim argument: (alloc_kind, the release it used)
MISMATCHES = {"new[]-delete": ("new[]", "delete"), "malloc-delete": ("malloc", "delete"),
              "new-free": ("new", "free")}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_release_by_the_wrong_family_is_a_mismatch_then_released(case, build_victim, run_victim,
                                                                  run_cli, tmp_path):
    # GIVEN a block released by the wrong family
    exe = Path(os.path.realpath(build_victim("mismatch", instrument=False, cxx=True)))
    snaps = tmp_path / "snaps"
    done = run(run_victim, exe, snaps, case)
    f = facts(done.stdout)
    block, size, tid = int(f["block"], 16), int(f["size"]), int(f["tid"])
    alloc_kind, dealloc = MISMATCHES[case]
    # THEN one alloc-dealloc-mismatch with both stacks ...
    a = the_anomaly(inspect(run_cli, one_anomaly_core(snaps, "alloc-dealloc-mismatch"), tmp_path))
    assert (a["kind"], a["address"], a["dealloc"], a["thread"]) == (
        "alloc-dealloc-mismatch", hex(block), dealloc, tid), a
    b = a["block"]
    assert (b["start"], b["size"], b["alloc_kind"], b["thread"]) == (hex(block), size, alloc_kind, tid), b
    assert functions(b["alloc_stack"], exe)[:2] == ["alloc_victim", "main"], b["alloc_stack"]
    assert functions(a["stack"], exe)[:2] == ["release_victim", "main"], a["stack"]
    # ... and the block was released all the same: nothing leaked
    assert f["live_delta"] == "0", done.stdout
