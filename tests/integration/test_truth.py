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


def test_a_rebuilt_binary_never_names_frames_until_debug_dir_has_the_old_build(
        build_victim, run_victim, run_cli, tmp_path):
    # GIVEN a snapshot of truth, then truth rebuilt in place from changed source
    exe = tmp_path / "bin" / "truth"
    exe.parent.mkdir()
    shutil.copy2(build_victim("truth"), exe)
    first = build_id(exe)
    lo, hi = symbol_range(exe, "make_value")
    snap = snapshot_of(run_victim, exe, "snapshot", tmp_path / "snaps")
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
