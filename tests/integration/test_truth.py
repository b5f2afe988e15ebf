"""Never confidently wrong: answers about a core that the victim knows.

tests/victims/truth.c (and truth_cxx.cc) print what they did - addresses,
sizes, thread ids, times - and then take a snapshot or crash.  These tests
check forensics says exactly that:

- a binary rebuilt between the snapshot and inspect never names a frame
  (module+offset and a warning naming it), until --debug-dir gives the
  first build's debug file, found by build-id;
- a crash through a pointer read from a freed block names that block, and a
  C++ virtual call on a deleted object names the object;
- abort() is a signal sent by the process itself: its pid, no address;
- a global that holds a block is named by its symbol;
- every block says when it was allocated and freed;
- writes into freed blocks found in the core are use-after-free anomalies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from forensics.core import elf
import forensics_test_support as S

LIVE_SIZE, FREED_SIZE, NODE_SIZE = 40, 56, 48  # truth.c


def facts(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        key, *rest = line.split()
        out.setdefault(key, []).append(rest)
    return out


def one(f: dict, key: str, i: int = 0) -> int:
    return int(f[key][0][i], 0)


def symbol_range(exe: Path, name: str) -> tuple[int, int]:
    """[start, end) of a function symbol of exe, as nm sees it."""
    out = subprocess.run(["nm", "-S", str(exe)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == name:
            return int(parts[0], 16), int(parts[0], 16) + int(parts[1], 16)
    raise AssertionError(f"no symbol {name} in {exe}")


def build_id(path: Path) -> str:
    with open(path, "rb") as f:
        bid = elf.file_build_id(f)
    assert bid is not None, f"expected {path} to have a GNU build-id"
    return bid.hex()


def cli_json(run_cli, state: Path, *args) -> dict:
    done = run_cli(*args, "--json", env={"XDG_STATE_HOME": str(state)})
    assert done.returncode in (0, 1), f"expected exit 0 or 1, got {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


@dataclass
class Snap:
    exe: Path
    facts: dict
    core: Path


def snapshot_of(run_victim, exe: Path, mode: str, snaps: Path, core_path: str = "self") -> Snap:
    snaps.mkdir(mode=0o700, exist_ok=True)
    done = run_victim(exe, mode, snap_dir=snaps, env={"LIBTAG_CORE": core_path})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    f = facts(done.stdout)
    return Snap(exe, f, S.wait_core(snaps, one(f, "pid")))


# ------------------------------------------------------------- rebuilds --


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_a_rebuilt_binary_never_names_frames_until_debug_dir_has_the_old_build(
        core_path, build_victim, run_victim, run_cli, tmp_path):
    # GIVEN a snapshot of truth, then truth rebuilt in place from changed source
    exe = tmp_path / "bin" / "truth"
    exe.parent.mkdir()
    shutil.copy2(build_victim("truth"), exe)
    first = build_id(exe)
    lo, hi = symbol_range(exe, "make_value")
    # (both core writers keep each module's first page: its build-id)
    snap = snapshot_of(run_victim, exe, "snapshot", tmp_path / "snaps", core_path)
    debug = tmp_path / "debug"
    (debug / ".build-id" / first[:2]).mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(exe),
                    str(debug / ".build-id" / first[:2] / f"{first[2:]}.debug")], check=True)
    tmp = tmp_path / "bin" / "truth.new"
    shutil.copy2(build_victim("truth", extra_flags=["-DREBUILT"]), tmp)
    os.replace(tmp, exe)
    second = build_id(exe)
    assert second != first
    live = one(snap.facts, "live")
    state = tmp_path / "state"

    # WHEN whoowns asks for the live block with only the rebuilt file at hand
    doc = cli_json(run_cli, state, "whoowns", hex(live), "--core", snap.core)
    # THEN no frame of truth is named, each keeps module+offset: the call in
    # make_value of the FIRST build, make_value's entry (unnamed, the two are
    # not merged), main's call site; one warning names the module
    ours = [f for f in doc["block"]["alloc_stack"] if f["module"] == str(exe)]
    assert len(ours) == 3, f"expected make_value twice and main in {exe}: {doc['block']['alloc_stack']}"
    assert [(f["function"], f["file"], f["line"]) for f in ours] == [(None, None, None)] * 3, ours
    assert lo < int(ours[0]["module_offset"], 16) < hi, (
        f"expected the first frame inside make_value [{lo:#x}, {hi:#x}): {ours[0]}")
    assert int(ours[1]["module_offset"], 16) == lo, f"expected make_value's entry {lo:#x}: {ours[1]}"
    assert [w for w in doc["warnings"] if w.startswith(f"{exe}:")] == [
        f"{exe}: {exe} is not the file the process ran (build-id {second}, the process had "
        f"{first}); its frames are shown as module+offset; give --debug-dir DIR holding a "
        f"file with build-id {first}"], doc["warnings"]
    # ... and inspect says the same
    ins = cli_json(run_cli, state, "inspect", snap.core)
    assert all(f["function"] is None for s in ins["top_stacks"] for f in s["stack"]
               if f["module"] == str(exe)), ins["top_stacks"]
    assert any(w.startswith(f"{exe}: {exe} is not the file") for w in ins["warnings"]), ins["warnings"]

    # WHEN --debug-dir holds the first build's debug file
    doc = cli_json(run_cli, state, "whoowns", hex(live), "--core", snap.core, "--debug-dir", debug)
    # THEN the frames are named again, from the right file, and nothing is warned about truth
    ours = [f for f in doc["block"]["alloc_stack"] if f["module"] == str(exe)]
    assert [f["function"] for f in ours] == ["make_value", "main"], ours
    assert not [w for w in doc["warnings"] if str(exe) in w], doc["warnings"]


def test_a_missing_binary_is_warned_about(build_victim, run_victim, run_cli, tmp_path):
    # GIVEN a snapshot of truth whose binary was then deleted
    exe = tmp_path / "bin" / "truth"
    exe.parent.mkdir()
    shutil.copy2(build_victim("truth"), exe)
    snap = snapshot_of(run_victim, exe, "snapshot", tmp_path / "snaps")
    exe.unlink()
    # WHEN whoowns asks for the live block
    doc = cli_json(run_cli, tmp_path / "state", "whoowns", hex(one(snap.facts, "live")),
                   "--core", snap.core)
    # THEN truth's frames keep module+offset and a warning says the file is gone
    ours = [f for f in doc["block"]["alloc_stack"] if f["module"] == str(exe)]
    assert [f["function"] for f in ours] == [None, None, None], ours
    assert [w for w in doc["warnings"] if w.startswith(f"{exe}:")] == [
        f"{exe}: {exe} is missing or not a readable ELF file; its frames are shown as "
        f"module+offset; give --debug-dir DIR holding a file with build-id {build_id(build_victim('truth'))}"
    ], doc["warnings"]


def test_sysroot_finds_the_binary_under_another_root(build_victim, run_victim, run_cli, tmp_path):
    # GIVEN a snapshot of truth, whose binary then moved under a "sysroot"
    exe = tmp_path / "bin" / "truth"
    exe.parent.mkdir()
    shutil.copy2(build_victim("truth"), exe)
    snap = snapshot_of(run_victim, exe, "snapshot", tmp_path / "snaps")
    root = tmp_path / "root"
    moved = root / str(exe).lstrip("/")
    moved.parent.mkdir(parents=True)
    os.replace(exe, moved)
    # WHEN whoowns is given --sysroot
    doc = cli_json(run_cli, tmp_path / "state", "whoowns", hex(one(snap.facts, "live")),
                   "--core", snap.core, "--sysroot", root)
    # THEN the frames are named from the moved file, still reported under the process's path
    ours = [f["function"] for f in doc["block"]["alloc_stack"] if f["module"] == str(exe)]
    assert ours == ["make_value", "main"], doc["block"]["alloc_stack"]
    assert not [w for w in doc["warnings"] if str(exe) in w], doc["warnings"]


# -------------------------------------------------------------- crashes --


def crash_of(run_cli, exe: Path, args: list[str], tmp_path: Path, expect_signal: int) -> tuple[dict, Path]:
    """Run exe under forensics run until it dies of expect_signal; what it
    printed and its crash core."""
    from forensics.snapshots import snapdir

    snaps = tmp_path / "snaps"
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "LIBTAG_CORE": "self"}
    done = run_cli("run", "--dir", snaps, "--", exe, *args, env=env)
    assert done.returncode == 128 + expect_signal, (
        f"expected exit {128 + expect_signal}, got {done.returncode}: {done.stderr}")
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1 and dirs[0].name.endswith("-1-crash"), f"expected one *-1-crash dir, got {dirs}"
    core = snapdir.find_core(snapdir.wait_complete(dirs[0], 60).path)
    assert core is not None, f"expected a core in {dirs[0]}"
    return facts(done.stdout), core


def assert_freed_block(block: dict, start: int, size: int, offset: int, alloc_fn: str, free_fn: str,
                       tid: int, exe: Path) -> None:
    assert (block["start"], block["size"], block["offset"], block["state"]) == (
        hex(start), size, offset, "freed"), block
    assert (block["thread"], block["free_thread"]) == (tid, tid), block
    names = lambda frames: [f["function"] for f in frames if f["module"] == str(exe)]  # noqa: E731
    assert names(block["alloc_stack"])[:2] == [alloc_fn, "main"], block["alloc_stack"]
    assert names(block["free_stack"])[:2] == [free_fn, "main"], block["free_stack"]


def test_a_crash_through_a_pointer_read_from_a_freed_block_names_the_block(
        build_victim, run_cli, tmp_path):
    # GIVEN truth freed-ptr: next_id(n) reads n->next of a freed node and
    # dereferences it - 0xfdfdfdfdfdfdfdfd, a general-protection fault
    exe = build_victim("truth")
    f, core = crash_of(run_cli, exe, ["freed-ptr"], tmp_path, signal.SIGSEGV)
    node, tid = one(f, "node"), one(f, "tid")
    # WHEN inspect reads the crash core
    doc = cli_json(run_cli, tmp_path / "state", "inspect", core)
    c = doc["crash"]
    # THEN the kernel's missing address is not taken for one: si_code is
    # SI_KERNEL, the address is decoded from `mov rbx, qword ptr [rax]`
    assert (c["signal"], c["code"], c["code_name"], c["sender"]) == ("SIGSEGV", 128, "SI_KERNEL", None), c
    assert (c["address"], c["address_source"]) == ("0xfdfdfdfdfdfdfdfd", "decoded"), c
    assert c["instruction"] == "mov rbx, qword ptr [rax]", c["instruction"]
    # ... the pointer came from n->next, at offset 8 of the freed node, which
    # is named with both stacks (allocated in main, freed by drop)
    cause = c["cause"]
    assert (cause["kind"], cause["register"], cause["value"], cause["loaded_from"]) == (
        "use-after-free", "rax", "0xfdfdfdfdfdfdfdfd", hex(node + 8)), cause
    assert (cause["load"], cause["load_in"]) == ("mov rax, qword ptr [rbx + 8]", "function"), cause
    block = cause["block"]
    assert (block["start"], block["size"], block["offset"], block["state"]) == (
        hex(node), NODE_SIZE, 8, "freed"), block
    assert (block["thread"], block["free_thread"]) == (tid, tid), block
    # (freed_node is inlined into main: DWARF names it as a frame of its own)
    assert [x["function"] for x in block["alloc_stack"] if x["module"] == str(exe)] == [
        "freed_node", "main"], block
    assert [x["function"] for x in block["free_stack"] if x["module"] == str(exe)] == [
        "drop", "freed_node", "main"], block
    assert c["summary"] == (
        f"SIGSEGV: general-protection fault (the kernel gives no address); mov rbx, qword ptr [rax] "
        f"accesses 0xfdfdfdfdfdfdfdfd: a use-after-free: a pointer read from freed block {node:#x} "
        f"({NODE_SIZE} bytes), at offset 8 of it"), c["summary"]
    # ... and the human form says so, never "NULL page"
    human = run_cli("inspect", core, env={"XDG_STATE_HOME": str(tmp_path / "state"),
                                          "COLUMNS": "400"})
    assert human.returncode == 0, human.stderr
    assert f"a pointer read from freed block {node:#x}" in human.stdout, human.stdout
    assert "NULL page" not in human.stdout, human.stdout


def test_a_virtual_call_on_a_deleted_object_names_the_object(build_victim, run_cli, tmp_path):
    # GIVEN truth_cxx: draw(s) calls s->area() on a deleted Circle
    exe = build_victim("truth_cxx", cxx=True)
    f, core = crash_of(run_cli, exe, [], tmp_path, signal.SIGSEGV)
    obj, size, tid = one(f, "object"), one(f, "object", 1), one(f, "tid")
    # WHEN inspect reads the crash core
    c = cli_json(run_cli, tmp_path / "state", "inspect", core)["crash"]
    # THEN the call through the vtable slot is decoded, and the vtable
    # pointer came from offset 0 of the deleted object, named with its stacks
    assert (c["code_name"], c["address_source"], c["instruction"]) == (
        "SI_KERNEL", "decoded", "call qword ptr [rax + 0x10]"), c
    assert c["address"] == hex(0xFDFDFDFDFDFDFDFD + 0x10), c["address"]
    cause = c["cause"]
    assert (cause["register"], cause["loaded_from"], cause["load"]) == (
        "rax", hex(obj), "mov rax, qword ptr [rbx]"), cause
    block = cause["block"]
    assert (block["start"], block["size"], block["offset"], block["state"], block["alloc_kind"]) == (
        hex(obj), size, 0, "freed", "new"), block
    assert (block["thread"], block["free_thread"]) == (tid, tid), block
    # (delete calls the deleting destructor, which calls operator delete)
    assert [x["function"] for x in block["free_stack"] if x["module"] == str(exe)][:3] == [
        "Circle::~Circle()", "forget(Shape*)", "main"], block["free_stack"]


# -O2 without -g, as a release build ships: names from the symbol table only
RELEASE = ["-O2", "-g0"]


def test_a_freed_pointer_loaded_by_the_caller_names_the_block(build_victim, run_cli, tmp_path):
    # GIVEN truth freed-arg, built -O2 without -g: main loads n->next from
    # the freed node and passes it to id_of, which dereferences it - the
    # faulting function never wrote its argument register
    exe = build_victim("truth", instrument=False, extra_flags=RELEASE)
    f, core = crash_of(run_cli, exe, ["freed-arg"], tmp_path, signal.SIGSEGV)
    node, tid = one(f, "node"), one(f, "tid")
    # WHEN inspect reads the crash core
    c = cli_json(run_cli, tmp_path / "state", "inspect", core)["crash"]
    # THEN the fault is in id_of, through rdi = the free pattern ...
    assert c["stack"][0]["function"] == "id_of", c["stack"][:2]
    assert c["instruction"] == "mov rax, qword ptr [rdi]", c
    cause = c["cause"]
    assert (cause["kind"], cause["register"], cause["value"]) == (
        "use-after-free", "rdi", "0xfdfdfdfdfdfdfdfd"), cause
    # ... loaded by the caller from offset 8 of the freed node (rbx, restored
    # for main's frame from id_of's CFI), and the node is named with its stacks
    assert (cause["loaded_from"], cause["load"], cause["load_in"]) == (
        hex(node + 8), "mov rdi, qword ptr [rbx + 8]", "caller"), cause
    block = cause["block"]
    assert (block["start"], block["size"], block["offset"], block["state"]) == (
        hex(node), NODE_SIZE, 8, "freed"), block
    assert (block["thread"], block["free_thread"]) == (tid, tid), block
    # (at -O2, drop's call of free is a tail jump: drop has left the stack)
    assert [x["function"] for x in block["free_stack"] if x["module"] == str(exe)] == [
        "main", "_start"], block
    assert c["summary"].endswith(
        f": a use-after-free: a pointer read from freed block {node:#x} ({NODE_SIZE} bytes), "
        f"at offset 8 of it"), c["summary"]
    human = run_cli("inspect", core, env={"XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "400"})
    assert f"the pointer was loaded from {node + 8:#x} by mov rdi, qword ptr [rbx + 8] in the caller" in (
        human.stdout), human.stdout


def test_a_wild_pointer_no_freed_block_explains_is_unknown(build_victim, run_cli, tmp_path):
    # GIVEN truth wild, built -O2 without -g: a live node's next holds
    # 0x4141414141414141 (no block, not libtag's pattern) and is dereferenced
    exe = build_victim("truth", instrument=False, extra_flags=RELEASE)
    f, core = crash_of(run_cli, exe, ["wild"], tmp_path, signal.SIGSEGV)
    node = one(f, "node")
    # WHEN inspect reads the crash core
    c = cli_json(run_cli, tmp_path / "state", "inspect", core)["crash"]
    # THEN the address is decoded, and the cause is unknown - not a
    # use-after-free, and no block is named as the culprit ...
    assert (c["address"], c["address_source"]) == ("0x4141414141414141", "decoded"), c
    cause = c["cause"]
    assert (cause["kind"], cause["value"]) == ("unknown", "0x4141414141414141"), cause
    # ... while the evidence that is there is given: the pointer came from
    # offset 8 of the live node
    assert (cause["loaded_from"], cause["block"]["start"], cause["block"]["state"],
            cause["block"]["offset"]) == (hex(node + 8), hex(node), "live", 8), cause
    assert c["summary"].endswith(
        f": no freed block explains it (cause unknown; the pointer was read from live block "
        f"{node:#x} ({NODE_SIZE} bytes), at offset 8 of it)"), c["summary"]
    assert "use-after-free" not in c["summary"], c["summary"]


def test_abort_is_a_signal_from_the_process_itself(build_victim, run_cli, tmp_path):
    # GIVEN truth abort: abort() in do_abort
    exe = build_victim("truth")
    f, core = crash_of(run_cli, exe, ["abort"], tmp_path, signal.SIGABRT)
    pid = one(f, "pid")
    # WHEN inspect reads the crash core
    doc = cli_json(run_cli, tmp_path / "state", "inspect", core)
    c = doc["crash"]
    # THEN SIGABRT was sent (tgkill: SI_TKILL) by the victim's own pid, and
    # there is no address (si_pid/si_uid are no fault address)
    assert (c["signal"], c["code"], c["code_name"]) == ("SIGABRT", -6, "SI_TKILL"), c
    assert c["sender"] == {"pid": pid, "uid": os.getuid(), "self": True}, c["sender"]
    assert (c["address"], c["address_source"], c["address_owner"], c["cause"]) == (None, None, None, None), c
    assert c["summary"] == (f"SIGABRT sent by the process itself (abort, raise) "
                            f"(pid {pid}, uid {os.getuid()}, SI_TKILL)"), c["summary"]
    # ... and neither the human form nor the report page shows an address
    state = {"XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "400"}
    human = run_cli("inspect", core, env=state)
    assert f"SIGABRT in thread {pid}: SIGABRT sent by the process itself" in human.stdout, human.stdout
    assert f"at {pid:#x}" not in human.stdout, human.stdout
    page = tmp_path / "report.html"
    done = run_cli("report", core, "-o", page, env=state)
    assert done.returncode == 0, done.stderr
    assert f"SIGABRT at {pid:#x}" not in page.read_text() and "SIGABRT sent by the process itself" in (
        page.read_text()), "expected the report to name the sender, not an address"


# ------------------------------------------------------ times and names --


def epoch_ms(iso: str) -> int:
    t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return round(t.timestamp() * 1000)


@pytest.fixture(scope="module")
def truth_snap(build_victim, run_victim, tmp_path_factory) -> Snap:
    return snapshot_of(run_victim, build_victim("truth"), "snapshot", tmp_path_factory.mktemp("snaps"))


def test_blocks_say_when_they_were_allocated_and_freed(truth_snap, run_cli, tmp_path):
    f = truth_snap.facts
    # libtag's times are CLOCK_MONOTONIC_COARSE ms from its start: each may be
    # off by one tick of that clock (res_ms, which the victim read) and 1 ms
    slack = one(f, "res_ms") + 1
    # WHEN whoowns asks for the live block and the freed one
    live = cli_json(run_cli, tmp_path, "whoowns", hex(one(f, "live")), "--core", truth_snap.core)["block"]
    freed = cli_json(run_cli, tmp_path, "whoowns", hex(one(f, "freed")), "--core", truth_snap.core)["block"]
    # THEN each carries the wall-clock time the victim saw around the call
    at = epoch_ms(live["alloc_time"])
    assert one(f, "t_alloc_before") - slack <= at <= one(f, "t_alloc_after") + slack, (live, f)
    assert live["free_time"] is None, live
    gone = epoch_ms(freed["free_time"])
    assert one(f, "t_free_before") - slack <= gone <= one(f, "t_free_after") + slack, (freed, f)
    assert epoch_ms(freed["alloc_time"]) <= gone, freed
    # ... and its age at the snapshot, taken after t_snapshot
    assert live["age_s"] >= (one(f, "t_snapshot") - one(f, "t_alloc_after") - 2 * slack) / 1000, live
    # ... which the human form shows too
    human = run_cli("whoowns", hex(one(f, "freed")), "--core", truth_snap.core,
                    env={"XDG_STATE_HOME": str(tmp_path), "COLUMNS": "300"})
    assert f"at {freed['alloc_time']} ({freed['age_s']:g} s before the core)" in human.stdout, human.stdout
    assert f"freed by thread {one(f, 'tid')} at {freed['free_time']}" in human.stdout, human.stdout


def test_a_block_held_by_a_global_names_the_global(truth_snap, run_cli, tmp_path):
    f = truth_snap.facts
    # WHEN whoowns asks for the live block, whose pointer is kv_inst.value
    doc = cli_json(run_cli, tmp_path, "whoowns", hex(one(f, "live")), "--core", truth_snap.core)
    # THEN the global referrer is named by its symbol: kv_inst+8 in truth
    globals_ = [r for r in doc["referrers"] if r["in"] == "global"]
    assert globals_ == [{"address": hex(one(f, "kv_inst") + 8), "in": "global", "block_start": None,
                         "interior": False, "thread": None, "module": str(truth_snap.exe),
                         "symbol": "kv_inst+8"}], doc["referrers"]
    # ... and whoowns on the global's own address says the same
    doc = cli_json(run_cli, tmp_path, "whoowns", hex(one(f, "kv_inst") + 8), "--core", truth_snap.core)
    assert doc["symbol"] == {"name": "kv_inst", "offset": 8, "section": ".data",
                             "module": str(truth_snap.exe)}, doc
    human = run_cli("whoowns", hex(one(f, "live")), "--core", truth_snap.core,
                    env={"XDG_STATE_HOME": str(tmp_path), "COLUMNS": "300"})
    assert "kv_inst+8 in truth" in human.stdout, human.stdout


# ------------------------------------------------------ use-after-free --


def test_writes_into_freed_blocks_are_use_after_free_anomalies(build_victim, run_victim, run_cli, tmp_path):
    # GIVEN truth uaf: four freed 64-byte blocks written through dangling
    # pointers at offsets 0, 8, 24 and 63, then a snapshot
    snap = snapshot_of(run_victim, build_victim("truth"), "uaf", tmp_path / "snaps")
    wrote = sorted((int(a, 16), int(o), b) for a, o, b in snap.facts["uaf"])
    tid = one(snap.facts, "tid")
    # WHEN inspect reads the core
    doc = cli_json(run_cli, tmp_path / "state", "inspect", snap.core)
    # THEN each write is one use-after-free anomaly at its first damaged byte,
    # with the bytes written and the block's stacks; none is reported twice
    # (libtag's snapshot records the first one itself)
    uafs = sorted(doc["anomalies"], key=lambda a: int(a["address"], 16))
    assert [(a["kind"], a["address"], a["offset"], a["written"]) for a in uafs] == [
        ("use-after-free", hex(start + off), off, data) for start, off, data in wrote], uafs
    for a, (start, off, _) in zip(uafs, wrote):
        b = a["block"]
        assert (b["start"], b["size"], b["offset"], b["state"]) == (hex(start), 64, off, "freed"), b
        assert (b["thread"], b["free_thread"]) == (tid, tid), b
        assert [f["function"] for f in b["free_stack"] if f["module"] == str(snap.exe)][:2] == [
            "drop", "main"], b["free_stack"]
        assert a["time"] is not None, a
    assert sorted(a["detected_by"] for a in uafs) == ["libtag", "reader", "reader", "reader"], uafs
    # ... the human form says where each was found
    human = run_cli("inspect", snap.core, env={"XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "300"})
    for start, off, _ in wrote:
        assert f"use-after-free of {start + off:#x} " in human.stdout, human.stdout
    assert human.stdout.count("found in the core (libtag had not checked the block yet)") == 3, human.stdout
    # ... and whoowns on the block written at offset 24 says so
    start, off, data = wrote[2]
    who = cli_json(run_cli, tmp_path / "state", "whoowns", hex(start), "--core", snap.core)
    assert who["use_after_free"] == {"address": hex(start + off), "offset": off, "written": data}, who
    assert who["note"] == (f"0 bytes into a freed block of 64 bytes; written after it was freed, "
                           f"from offset {off} (bytes {data}): a use-after-free"), who["note"]


def test_a_debug_dir_that_does_not_exist_is_a_one_line_error(truth_snap, run_cli, tmp_path):
    missing = tmp_path / "no-such-dir"
    done = run_cli("inspect", truth_snap.core, "--debug-dir", missing, env={"XDG_STATE_HOME": str(tmp_path)})
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == f"forensics: error: --debug-dir {missing}: no such directory\n", done.stderr
