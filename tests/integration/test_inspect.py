"""forensics inspect reports why each real core was taken: the anomaly with its
block and all three stacks, the crash with its fault address classified and
the faulting thread's stack, and - for an on-demand snapshot - the heap
totals and the biggest allocation stack.

Victims: tests/victims/who_anomaly.c (one misuse per run, a distinct function
for every stack; or an on-demand snapshot of HOARD_BLOCKS blocks made by
hoard) and tests/victims/who_crash.c (SIGSEGV at the NULL page, at an
unmapped address in a worker thread, on the program's read-only data, and by
jumping into a live heap block).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from forensics.snapshots import snapdir
import forensics_test_support as S


def functions(frames: list[dict], exe: Path) -> list[str]:
    """The function names of the frames in the victim itself, innermost first."""
    return [f["function"] for f in frames if f["module"] == str(exe)]


def printed(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
        else:
            key, _, value = line.partition(" ")
        out[key] = value
    return out


def the_core(snaps: Path, suffix: str) -> Path:
    dirs = [d for d in snaps.iterdir() if d.is_dir()]
    assert len(dirs) == 1 and dirs[0].name.endswith(suffix), (
        f"expected one *{suffix} snapshot dir, got {dirs}")
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    assert core is not None, f"expected a core in {snap.path}"
    return core


def inspect(run_cli, core: Path, state: Path, *extra: str) -> dict:
    result = run_cli("inspect", str(core), "--json", *extra, env={"XDG_STATE_HOME": str(state)})
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


# ---------------------------------------------------------------- anomalies --

# kind -> (block start relative to the printed address or None, size, offset
#          of the anomaly's address in the block (the first damaged byte for an
#          overflow or a write after free), state, alloc stack, free stack or
#          None, detecting stack)
ANOMALIES = {
    "double-free": (0, 48, 0, "freed", ["make_block", "do_double_free", "main"],
                    ["first_release", "do_double_free", "main"],
                    ["second_release", "do_double_free", "main"]),
    "invalid-free-interior": (-32, 128, 32, "live", ["make_block", "do_invalid_interior", "main"],
                              None, ["bad_release", "do_invalid_interior", "main"]),
    "invalid-free-stack": (None, None, None, None, None, None,
                           ["bad_release", "do_invalid_stack", "main"]),
    "heap-overflow": (0, 40, 40, "live", ["make_block", "do_overflow", "main"], None,
                      ["overflow_release", "do_overflow", "main"]),
    "use-after-free": (0, 64, 40, "freed", ["make_block", "do_use_after_free", "main"],
                       ["first_release", "do_use_after_free", "main"],
                       ["churn", "do_use_after_free", "main"]),
}
# what the victim wrote where it must not (hex), for the kinds that write;
# the overflow's bytes are what the victim printed (0x41, or 0xbe over a
# canary byte that held 0x41: tests/victims/overwrite.h)
WRITTEN = {"heap-overflow": None, "use-after-free": "42"}


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
@pytest.mark.parametrize("case", list(ANOMALIES))
def test_anomaly_core(case, core_path, build_victim, run_victim, run_cli, tmp_path):
    exe = Path(os.path.realpath(build_victim("who_anomaly")))
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    kind = case.rsplit("-", 1)[0] if case.startswith("invalid-free") else case
    rel, size, offset, state, alloc, free, detect = ANOMALIES[case]
    # GIVEN who_anomaly CASE under libtag (anomaly -> snapshot, run on)
    done = run_victim(exe, case, snap_dir=snaps, on_anomaly="snapshot",
                      env={"LIBTAG_CORE": core_path, "LIBTAG_QUARANTINE": "4096"})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    facts = printed(done.stdout)
    tid, address = int(facts["tid"]), int(facts["address"], 16)
    core = the_core(snaps, f"-1-{kind}")
    # WHEN
    doc = inspect(run_cli, core, tmp_path / "state")
    # THEN the reason, the process and exactly one anomaly of that kind at that address
    assert (doc["reason"], doc["crash"]) == (kind, None), (doc["reason"], doc["crash"])
    assert doc["process"] == {"pid": tid, "exe": str(exe)}, doc["process"]
    assert len(doc["anomalies"]) == 1, doc["anomalies"]
    a = doc["anomalies"][0]
    at = address + rel + offset if rel is not None else address
    assert (a["kind"], a["address"], a["thread"]) == (kind, hex(at), tid), a
    written = S.overwritten(facts["written"], 0x41).hex() if kind == "heap-overflow" else WRITTEN.get(kind)
    assert (a["offset"], a["written"]) == (offset, written), a
    # ... detected where the victim misused the heap
    assert functions(a["stack"], exe) == detect, a["stack"]
    # ... with the block, its state and both stacks
    block = a["block"]
    if rel is None:
        assert block is None, f"expected no block for a stack address, got {block}"
        return
    assert (block["start"], block["size"], block["offset"], block["state"], block["thread"]) == (
        hex(address + rel), size, offset, state, tid), block
    assert functions(block["alloc_stack"], exe) == alloc, block["alloc_stack"]
    if free is None:
        assert (block["free_stack"], block["free_thread"]) == (None, None), block
    else:
        assert functions(block["free_stack"], exe) == free, block["free_stack"]
        assert block["free_thread"] == tid, block["free_thread"]


def test_anomaly_human_output(build_victim, run_victim, run_cli, tmp_path):
    exe = Path(os.path.realpath(build_victim("who_anomaly")))
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    done = run_victim(exe, "double-free", snap_dir=snaps, env={"LIBTAG_CORE": "self"})
    assert done.returncode == 0, done.stderr
    facts = printed(done.stdout)
    core = the_core(snaps, "-1-double-free")
    result = run_cli("inspect", str(core), env={"XDG_STATE_HOME": str(tmp_path / "state"),
                                                "COLUMNS": "200"})
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    for text in (f"double-free of {facts['address']} in thread {facts['tid']}",
                 f"block {facts['address']}  48 bytes  freed  offset 0",
                 "second_release at", "make_block at", "first_release at"):
        assert text in result.stdout, f"expected {text!r} in:\n{result.stdout}"


# --------------------------------------------------------------- on demand --


def test_on_demand_heap_totals_and_top_stack(build_victim, run_victim, run_cli, tmp_path):
    exe = Path(os.path.realpath(build_victim("who_anomaly")))
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    # GIVEN 40 blocks of 1000 bytes from hoard, and libtag_stats just before the snapshot
    done = run_victim(exe, "on-demand", snap_dir=snaps, env={"LIBTAG_CORE": "self"})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    facts = printed(done.stdout)
    live_blocks, live_bytes = map(int, facts["stats"].split())
    core = the_core(snaps, "-1-on-demand")
    # WHEN
    doc = inspect(run_cli, core, tmp_path / "state", "--top", "1")
    # THEN the totals are libtag's own, and the top stack is hoard's
    assert (doc["reason"], doc["anomalies"], doc["crash"]) == ("on-demand", [], None), doc["reason"]
    assert doc["heap"] == {"live_blocks": live_blocks, "live_bytes": live_bytes,
                           "freed_blocks": 0, "freed_bytes": 0}, doc["heap"]
    assert len(doc["top_stacks"]) == 1, doc["top_stacks"]
    top = doc["top_stacks"][0]
    assert (top["blocks"], top["bytes"]) == (40, 40000), top
    assert functions(top["stack"], exe) == ["make_block", "hoard", "main"], top["stack"]
    assert [t["tid"] for t in doc["threads"]] == [int(facts["tid"])], doc["threads"]
    # AND --blocks 1 lists exactly the 40 blocks hoard made, by address, with
    # their size and thread
    hoarded = sorted(int(line.split()[1], 16) for line in done.stdout.splitlines()
                     if line.startswith("hoarded "))
    assert len(hoarded) == 40, done.stdout
    sb = inspect(run_cli, core, tmp_path / "state", "--top", "1", "--blocks", "1")["stack_blocks"]
    assert (sb["rank"], sb["count"], sb["bytes"]) == (1, 40, 40000), sb
    assert functions(sb["stack"], exe) == ["make_block", "hoard", "main"], sb["stack"]
    assert [int(b["start"], 16) for b in sb["blocks"]] == hoarded, sb["blocks"]
    assert {(b["size"], b["thread"]) for b in sb["blocks"]} == {(1000, int(facts["tid"]))}
    assert all(b["age_ms"] is not None and b["age_ms"] >= 0 for b in sb["blocks"]), sb["blocks"]
    # AND a rank past the last stack is one line and exit 2
    bad = run_cli("inspect", str(core), "--blocks", "99999", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert bad.returncode == 2, bad.stderr
    assert "--blocks 99999: the core has" in bad.stderr, bad.stderr


# ------------------------------------------------------------------ crashes --

# mode -> (faulting function stack in the victim, owner of the fault address, region, note)
# the victim's own frames of the crash stack (unwound from the core to the
# outermost frame: _start for the main thread, glibc's start_thread for a worker)
CRASHES = {
    "null": (["crash_read", "main", "_start"], "unmapped", None, "NULL page"),
    "wild": (["crash_read", "worker_crash"], "unmapped", None, "in no mapping of the process"),
    "rodata": (["crash_write", "main", "_start"], "mapping", "EXE", ""),
    "heap": (["call_block", "main", "_start"], "heap", "heap", "0 bytes into a live block of 64 bytes"),
}


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
@pytest.mark.parametrize("mode", list(CRASHES))
def test_crash_core(mode, core_path, build_victim, run_victim, run_cli, tmp_path):
    exe = Path(os.path.realpath(build_victim("who_crash")))
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    stack, owner, region, note = CRASHES[mode]
    # GIVEN who_crash MODE under libtag
    done = run_victim(exe, mode, snap_dir=snaps, env={"LIBTAG_CORE": core_path})
    assert done.returncode == -signal.SIGSEGV, f"expected SIGSEGV, got {done.returncode}: {done.stderr}"
    facts = printed(done.stdout)
    tid, fault = int(facts["tid"]), int(facts["fault"], 16)
    core = the_core(snaps, "-1-crash")
    # WHEN
    doc = inspect(run_cli, core, tmp_path / "state")
    # THEN the crash: signal, fault address, faulting thread
    c = doc["crash"]
    assert (doc["reason"], doc["anomalies"]) == ("crash", []), doc["reason"]
    assert (c["signal"], c["address"], c["thread"]) == ("SIGSEGV", hex(fault), tid), c
    if mode == "wild":
        assert tid != doc["process"]["pid"], f"expected a worker thread to fault, got {tid}"
    # ... its stack, innermost first, one frame per function
    assert functions(c["stack"], exe) == stack, c["stack"]
    if mode == "heap":  # the pc is the heap block itself: no function, no module
        assert (c["stack"][0]["address"], c["stack"][0]["function"], c["stack"][0]["module"]) == (
            hex(fault), None, None), c["stack"][0]
    else:
        assert c["stack"][0]["function"] == stack[0], c["stack"][0]
    # ... and what the fault address is
    where = c["address_owner"]
    assert (where["owner"], where["region"], where["note"]) == (
        owner, str(exe) if region == "EXE" else region, note), where
    if mode == "heap":
        block = where["block"]
        assert (block["start"], block["size"], block["offset"], block["state"], block["thread"]) == (
            hex(fault), 64, 0, "live", tid), block
        assert functions(block["alloc_stack"], exe) == ["code_block", "main"], block["alloc_stack"]
    else:
        assert where["block"] is None, where["block"]
