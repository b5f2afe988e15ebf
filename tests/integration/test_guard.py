"""Guarded sampling: a bad access to a guarded block is caught at the
faulting instruction, reported with its stack, snapshotted, and the program
runs on (LIBTAG_ON_ANOMALY=snapshot) or dies at that instruction (abort).

guard_faults (tests/victims/guard_faults.c), run with LIBTAG_GUARD_RATE=1 so
every block is guarded, prints before each bad access the block, the exact
byte it touches, its own thread id, the source line of the access (in
read_byte or write_byte) and, after a free, the freeing thread's id.  The
victim is built -O2 without frame pointers, and -O2 with
-finstrument-functions: the detecting stack must name the accessing
function either way, unwound from the signal context.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

import forensics_test_support as S
from forensics.reader import abi

PLAIN = dict(instrument=False, extra_flags=("-O2", "-fomit-frame-pointer"))
INSTRUMENTED = dict(instrument=True, extra_flags=("-O2", "-fomit-frame-pointer"))

# case (victim arguments) -> (anomaly kind, access, accessing function)
FAULTS = {
    "overflow-write": ("heap-overflow", "write", "write_byte"),
    "overflow-read": ("heap-overflow", "read", "read_byte"),
    "underflow-read": ("heap-underflow", "read", "read_byte"),
    "underflow-write": ("heap-underflow", "write", "write_byte"),
    "uaf-read 0": ("use-after-free", "read", "read_byte"),
    "uaf-read 255": ("use-after-free", "read", "read_byte"),
    "uaf-write 128": ("use-after-free", "write", "write_byte"),
    "uaf-read-other 17": ("use-after-free", "read", "read_byte"),
    "uaf-write-thread 200": ("use-after-free", "write", "write_byte"),
}


def _run(exe: Path, args: str, snaps: Path, on_anomaly: str = "snapshot", **env: str):
    full = S.victim_env("self", snaps, LIBTAG_GUARD_RATE="1", LIBTAG_ON_ANOMALY=on_anomaly, **env)
    return subprocess.run([str(exe), *args.split()], env=full, capture_output=True, text=True,
                          timeout=60)


def _said(stdout: str) -> dict[str, list[str]]:
    """The victim's key=value lines, every value of each key in order."""
    out: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        for word in line.split():
            key, eq, value = word.partition("=")
            if eq:
                out.setdefault(key, []).append(value)
    return out


def _inspect(run_cli, core: Path, tmp_path: Path) -> dict:
    r = run_cli("inspect", "--json", str(core), env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


_SNAP_NAME = re.compile(r"-(\d+)-(\d+)-([a-z-]+)$")  # <comm>-<pid>-<seq>-<reason>


def _cores(snaps: Path, pid: int, reasons: list[str]) -> list[Path]:
    """The cores of pid's snapshots, which must be exactly reasons, in order."""
    names = [_SNAP_NAME.search(d.name).groups() for d in S.snapshot_dirs(snaps)]
    assert names == [(str(pid), str(i + 1), r) for i, r in enumerate(reasons)], names
    return [S.wait_core(snaps, pid, i + 1, r) for i, r in enumerate(reasons)]


def _pid(stderr: str) -> int:
    line = next(ln for ln in stderr.splitlines() if "snapshot 1 (" in ln)
    return int(_SNAP_NAME.search(line).group(1))


def _check_fault(doc: dict, said: dict, kind: str, access: str, function: str, k: int = 0) -> dict:
    """The one anomaly of doc is the fault the victim announced (its k-th)."""
    [a] = doc["anomalies"]
    assert (a["kind"], a["access"]) == (kind, access), a
    assert int(a["address"], 16) == int(said["address"][k], 16), (a["address"], said)
    assert int(a["block"]["start"], 16) == int(said["block"][k], 16), (a["block"], said)
    assert a["thread"] == int(said["tid"][k]), (a["thread"], said)
    assert a["block"]["guarded"] is True, a["block"]
    # the detecting stack starts at the faulting instruction, in the function
    # that made the access, at the line of the access
    top = a["stack"][0]
    assert (top["function"], top["line"]) == (function, int(said["line"][k])), a["stack"][:3]
    assert a["pc"] == top["address"], (a["pc"], top)
    assert a["written"] is None, a
    return a


@pytest.mark.parametrize("case", list(FAULTS))
def test_fault_is_caught_at_the_instruction_and_the_program_runs_on(case, build_victim, run_cli,
                                                                    tmp_path):
    # GIVEN every block guarded, in an -O2 build without frame pointers
    exe = build_victim("guard_faults", **PLAIN)
    snaps = tmp_path / "snaps"
    kind, access, function = FAULTS[case]
    # WHEN the victim makes the bad access
    result = _run(exe, case, snaps)
    # THEN it runs on past it and exits normally ...
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "survived", result.stdout
    said = _said(result.stdout)
    if kind == "use-after-free" and access == "read":
        # ... reading what libtag left in the freed block (the slot was opened)
        assert said["value"] == [str(abi.TAG_FREE_PATTERN)], said
    # ... after exactly one snapshot, named for the kind
    [core] = _cores(snaps, _pid(result.stderr), [kind])
    doc = _inspect(run_cli, core, tmp_path)
    a = _check_fault(doc, said, kind, access, function)
    if kind == "use-after-free":
        # ... whose block is the freed one, with who freed it
        assert (a["block"]["state"], a["block"]["free_thread"]) == ("freed", int(said["free_tid"][0])), a
        assert a["block"]["free_stack"], a["block"]
        assert a["offset"] == int(case.split()[1]), a
    else:
        assert a["block"]["state"] == "live", a["block"]
    assert doc["counters"]["guard_faults"] == 1, doc["counters"]


@pytest.mark.parametrize("case", ["overflow-write", "underflow-read", "uaf-read-other 17"])
def test_fault_stack_in_an_instrumented_build(case, build_victim, run_cli, tmp_path):
    # GIVEN the victim built -O2 with -finstrument-functions (shadow stacks)
    exe = build_victim("guard_faults", **INSTRUMENTED)
    snaps = tmp_path / "snaps"
    kind, access, function = FAULTS[case]
    # WHEN it makes the bad access
    result = _run(exe, case, snaps)
    assert result.returncode == 0, result.stderr
    # THEN the report names the accessing function, as in the plain build
    [core] = _cores(snaps, _pid(result.stderr), [kind])
    _check_fault(_inspect(run_cli, core, tmp_path), _said(result.stdout), kind, access, function)


def test_whoowns_on_a_freed_guarded_block(build_victim, run_cli, tmp_path):
    # GIVEN the snapshot of a read after free, 17 bytes into a 256-byte block
    exe = build_victim("guard_faults", **PLAIN)
    snaps = tmp_path / "snaps"
    result = _run(exe, "uaf-read-other 17", snaps)
    said = _said(result.stdout)
    [core] = _cores(snaps, _pid(result.stderr), ["use-after-free"])
    # WHEN whoowns asks about that address
    r = run_cli("whoowns", "--json", "--core", str(core), said["address"][0],
                env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # THEN it answers as for any block: the freed guarded block, its offset,
    # and the thread that freed it
    b = doc["block"]
    assert (doc["owner"], int(b["start"], 16), b["offset"], b["size"], b["state"], b["guarded"]) == (
        "heap", int(said["block"][0], 16), 17, 256, "freed", True), doc
    assert b["free_thread"] == int(said["free_tid"][0]), b


@pytest.mark.parametrize("case", ["uaf-read 3", "overflow-write"])
def test_abort_dies_at_the_instruction_after_one_snapshot(case, build_victim, run_cli, tmp_path):
    # GIVEN LIBTAG_ON_ANOMALY=abort
    exe = build_victim("guard_faults", **PLAIN)
    snaps = tmp_path / "snaps"
    kind, access, function = FAULTS.get(case, ("use-after-free", "read", "read_byte"))
    # WHEN the victim makes the bad access
    result = _run(exe, case, snaps, on_anomaly="abort")
    # THEN it dies of the fault itself, the access never completed ...
    assert result.returncode == -signal.SIGSEGV, (result.returncode, result.stderr)
    assert "value=" not in result.stdout and "survived" not in result.stdout, result.stdout
    # ... leaving one snapshot that names the instruction (and no core of its own)
    [core] = _cores(snaps, _pid(result.stderr), [kind])
    _check_fault(_inspect(run_cli, core, tmp_path), _said(result.stdout), kind, access, function)
    assert not list(tmp_path.glob("core*")), "expected no core of the process itself"


def test_each_slot_is_reported_once(build_victim, run_cli, tmp_path):
    # GIVEN two freed blocks; the first is read twice after free, the
    # second written once
    exe = build_victim("guard_faults", **PLAIN)
    snaps = tmp_path / "snaps"
    result = _run(exe, "uaf-twice", snaps)
    assert result.returncode == 0, result.stderr
    said = _said(result.stdout)
    # THEN two snapshots: the first read of the first block, the write to the second
    first, second = _cores(snaps, _pid(result.stderr), ["use-after-free", "use-after-free"])
    _check_fault(_inspect(run_cli, first, tmp_path), said, "use-after-free", "read", "read_byte", 0)
    doc = _inspect(run_cli, second, tmp_path)
    _check_fault(doc, said, "use-after-free", "write", "write_byte", 2)
    assert (doc["counters"]["anomalies"], doc["counters"]["guard_faults"]) == (2, 2), doc["counters"]


# case -> the anomaly libtag reports when the block is freed
AT_FREE = {
    "slack": "heap-overflow",          # a write into the slack after the payload
    "tag-underflow": "heap-underflow",  # p[-1]: the last byte of the tag
    "double-free": "double-free",
}


@pytest.mark.parametrize("case", list(AT_FREE))
def test_damage_without_a_fault_is_found_at_free(case, build_victim, run_cli, tmp_path):
    # GIVEN a guarded block the victim damages where no guard page is, or frees twice
    exe = build_victim("guard_faults", **PLAIN)
    snaps = tmp_path / "snaps"
    result = _run(exe, case, snaps)
    assert result.returncode == 0, result.stderr
    said = _said(result.stdout)
    # THEN free() reports it, at the damaged byte (or the pointer), naming the block
    [core] = _cores(snaps, _pid(result.stderr), [AT_FREE[case]])
    [a] = _inspect(run_cli, core, tmp_path)["anomalies"]
    assert (a["kind"], a["access"], a["pc"]) == (AT_FREE[case], None, None), a
    assert int(a["address"], 16) == int(said["address"][0], 16), (a, said)
    assert int(a["block"]["start"], 16) == int(said["block"][0], 16), (a, said)
    assert a["block"]["guarded"] is True, a
    if case == "double-free":
        assert a["block"]["state"] == "freed" and a["block"]["free_stack"], a


def test_the_programs_own_sigsegv_handler_gets_its_own_faults(build_victim, tmp_path):
    # GIVEN a program whose SIGSEGV handler recovers from its own fault
    exe = build_victim("guard_faults", **PLAIN)
    snaps = tmp_path / "snaps"
    # WHEN it faults on its own (address 16), then reads a guarded block after free
    result = _run(exe, "own-handler", snaps)
    # THEN its handler saw its own fault only, libtag reported the other
    assert result.returncode == 0, result.stderr
    assert _said(result.stdout)["own_faults"] == ["1"], result.stdout
    _cores(snaps, _pid(result.stderr), ["use-after-free"])
    assert [d.name for d in S.snapshot_dirs(snaps) if "crash" in d.name] == []


def test_threads_allocating_and_fork_while_one_faults(build_victim, tmp_path):
    # GIVEN four threads allocating, filling, checking and freeing guarded blocks
    exe = build_victim("guard_faults", **PLAIN)
    snaps = tmp_path / "snaps"
    # WHEN the main thread reads a freed block (snapshot) and then forks a
    # child that allocates a guarded block
    result = _run(exe, "storm", snaps)
    # THEN everyone ran, every thread read back what it wrote, the child
    # allocated and exited 0, and the one fault made one snapshot
    assert result.returncode == 0, result.stderr
    said = _said(result.stdout)
    assert (said["bad0"], said["bad1"], said["bad2"], said["bad3"]) == (["0"],) * 4, result.stdout
    assert said["ran"] == ["1"] * 4 and said["child"] == ["0"], result.stdout
    _cores(snaps, _pid(result.stderr), ["use-after-free"])


def test_usable_size_realloc_and_alignment(build_victim, tmp_path):
    # GIVEN guarded blocks from calloc, realloc and posix_memalign
    exe = build_victim("guard_faults", **PLAIN)
    result = _run(exe, "usable", tmp_path / "snaps")
    # THEN they behave as glibc's do: zeroed, the asked size, moved with
    # their bytes, aligned; a freed one has no usable size; no anomaly
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "usable=100 zero=1", "moved=1 kept=1 usable=5000", "aligned=0 rc=0", "freed_usable=0",
        "survived"], result.stdout
    assert S.snapshot_dirs(tmp_path / "snaps") == []


def test_calloc_in_a_reused_slot_is_zero_in_hunting_mode(build_victim, tmp_path):
    # GIVEN every allocation guarded, more blocks than the guard window
    # (2047 placements by default), so freed slots leave it and are reused -
    # some with their pages given back, the last few queued with their
    # pages kept (and the 0xab the program wrote in them)
    exe = build_victim("guard_faults", **PLAIN)
    # WHEN six rounds free 6000 filled blocks and take as many from calloc
    result = _run(exe, "reuse 6000", tmp_path / "snaps")
    # THEN every calloc'd block was guarded and all zero
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["dirty=0 guarded=36000", "survived"], result.stdout
    assert S.snapshot_dirs(tmp_path / "snaps") == []


def test_the_default_rate_guards_some_blocks(build_victim, tmp_path):
    # GIVEN libtag with no LIBTAG_GUARD_RATE (its default)
    exe = build_victim("guard_faults", **PLAIN)
    env = S.victim_env("self", tmp_path / "snaps")
    del env["LIBTAG_GUARD_RATE"]
    # WHEN the victim makes 200000 allocations of 64 bytes
    result = subprocess.run([str(exe), "count", "200000"], env=env, capture_output=True, text=True,
                            timeout=60)
    # THEN the documented rate is in effect, and some (not all) blocks were
    # guarded: 40 expected, none with probability e^-40
    assert result.returncode == 0, result.stderr
    said = _said(result.stdout)
    assert said["rate"] == ["5000"], result.stdout
    assert 0 < int(said["guarded"][0]) < 200000, result.stdout


def test_a_full_pool_of_long_lived_blocks_leaves_the_programs_mappings_alone(build_victim,
                                                                             tmp_path):
    # GIVEN every allocation guarded, with the largest pool the guide allows
    exe = build_victim("guard_faults", **PLAIN)
    max_map_count = int(Path("/proc/sys/vm/max_map_count").read_text())
    # WHEN the victim keeps 100,000 blocks alive, then maps 1000 pages of its
    # own, dlopens a library, and reads a block it allocated and freed last
    result = _run(exe, "many 100000", tmp_path / "snaps", LIBTAG_GUARD_SLOTS="262144",
                  LIBTAG_STATS="1")
    assert result.returncode == 0, result.stderr[-2000:]
    said = _said(result.stdout)
    # THEN every block was guarded and kept its bytes, the pool holds at most
    # an eighth of the process's mapping limit (the window of max_map_count
    # / 32 placements keeps its guards), and the program's own calls work
    assert said["guarded"] == ["100000"] and said["bad"] == ["0"], result.stdout
    assert (said["mmap"], said["dlopen"]) == (["1000"], ["1"]), result.stdout
    stats = _said(next(line for line in result.stderr.splitlines() if "libtag: stats" in line))
    assert stats["guard_window"] == [str(max_map_count // 32)], stats
    assert int(said["mappings"][0]) < max_map_count // 8 + 200, said["mappings"]
    # ... and the block made after all of them was guarded: its read after
    # free is caught at the instruction
    block = said["block"][0]
    assert f"use-after-free: read at {said['address'][0]} (block {block})" in result.stderr, \
        result.stderr[-2000:]
    assert said["value"] == ["253"], result.stdout  # the fill libtag left in it


def test_a_slot_freed_in_the_window_stays_shut_after_it_leaves(build_victim, tmp_path):
    # GIVEN every allocation guarded, the pool past its window (max_map_count
    # / 32 placements keep their guards), and 100 freed slots queued for reuse
    exe = build_victim("guard_faults", **PLAIN)
    # WHEN a block freed inside the window is read after 30 more placements
    # made its slot leave the window (and took 30 slots from the queue ahead
    # of it)
    result = _run(exe, "shut", tmp_path / "snaps")
    assert result.returncode == 0, result.stderr[-2000:]
    said = _said(result.stdout)
    # THEN its slot was left PROT_NONE as it left: the read is caught at the
    # instruction, and reads the freed fill once libtag opens the page
    block = said["block"][0]
    assert f"use-after-free: read at {said['address'][0]} (block {block})" in result.stderr, \
        result.stderr[-2000:]
    assert said["value"] == ["253"], result.stdout


@pytest.mark.parametrize("slots, freed", [("1000", "0"), (None, "100")])
def test_freed_slots_give_their_pages_back_at_a_sampling_rate(slots, freed, build_victim,
                                                              tmp_path):
    # GIVEN every allocation guarded, in a pool no larger than its window
    # (1000 slots: as at a sampling rate, where nothing leaves the window),
    # or in hunting mode's (262144 slots, past the window)
    exe = build_victim("guard_faults", **PLAIN)
    extra = {"LIBTAG_GUARD_SLOTS": slots} if slots else {}
    # WHEN 100 blocks of 64 bytes are written, freed, and the first read
    result = _run(exe, "resident 100", tmp_path / "snaps", **extra)
    assert result.returncode == 0, result.stderr[-2000:]
    said = _said(result.stdout)
    # THEN each live block's page was resident; the freed ones went back to
    # the kernel in the sampled pool (hunting mode keeps them, for the next
    # placements), and the read after free is caught and reads the freed
    # fill either way: libtag refills a page it gave back before it opens it
    assert (said["live"], said["freed"]) == (["100"], [freed]), result.stdout
    block = said["block"][0]
    assert f"use-after-free: read at {said['address'][0]} (block {block})" in result.stderr, \
        result.stderr[-2000:]
    assert said["value"] == ["253"], result.stdout


@pytest.mark.parametrize("case, kind, offset", [("lone", "use-after-free", 8),
                                                ("lone-overflow", "heap-overflow", 64)])
def test_a_block_that_outlives_the_window_keeps_its_guards(case, kind, offset, build_victim, tmp_path):
    # GIVEN every allocation guarded, and a block of 64 bytes whose slot left
    # the window live (max_map_count / 32 + 30 placements after it)
    exe = build_victim("guard_faults", **PLAIN)
    # WHEN the victim reads it after freeing it, or reads the byte past it
    result = _run(exe, case, tmp_path / "snaps")
    assert result.returncode == 0, result.stderr[-2000:]
    said = _said(result.stdout)
    # THEN the slot left the window as it was, unmerged: the read is caught
    # at the instruction
    block, address = said["block"][0], said["address"][0]
    assert int(address, 16) - int(block, 16) == offset
    assert f"{kind}: read at {address} (block {block})" in result.stderr, result.stderr[-2000:]


def test_churn_of_short_and_long_lives_keeps_every_block_and_the_mapping_bound(build_victim, tmp_path):
    # GIVEN every allocation guarded
    exe = build_victim("guard_faults", **PLAIN)
    max_map_count = int(Path("/proc/sys/vm/max_map_count").read_text())
    window = max_map_count // 32
    # WHEN 20,000 blocks live at once and are replaced 400,000 times, most
    # lives short, some long: slots leave the window live and freed, stay
    # unmerged up to their bound, and are merged or reused
    result = _run(exe, "churn 20000", tmp_path / "snaps", LIBTAG_STATS="1")
    assert result.returncode == 0, result.stderr[-2000:]
    said = _said(result.stdout)
    # THEN every block kept its bytes, no guard faulted, and the pool stayed
    # within five mappings a window slot (four in the window, two for each
    # of at most window / 2 unmerged slots), with the program's own beside
    assert said["bad"] == ["0"], result.stdout
    stats = _said(next(line for line in result.stderr.splitlines() if "libtag: stats" in line))
    assert stats["guard_faults"] == ["0"], stats
    # (every allocation guarded but the victim's two arrays, larger than a slot)
    assert int(stats["allocs"][0]) - int(stats["guard_allocs"][0]) == 2, stats
    assert int(stats["guard_mappings"][0]) <= 5 * window, stats
    assert int(said["mappings"][0]) < 5 * window + 200, said["mappings"]


def test_a_full_pool_says_so_once_and_counts_what_it_left_unguarded(build_victim, tmp_path):
    # GIVEN every allocation guarded, in a pool capped at 100 slots
    exe = build_victim("guard_faults", **PLAIN)
    # WHEN the victim keeps 150 blocks alive (and makes one more after them)
    result = _run(exe, "many 150", tmp_path / "snaps", LIBTAG_GUARD_SLOTS="100", LIBTAG_STATS="1")
    assert result.returncode == 0, result.stderr[-2000:]
    said = _said(result.stdout)
    # THEN the pool's 100 slots went to the first allocations (the victim's
    # array of pointers, then 99 of its blocks), the log says once that the
    # pool is full, and the stats count every allocation it left unguarded
    # (each of this victim's fits a slot)
    assert said["guarded"] == ["99"] and said["bad"] == ["0"], result.stdout
    full = [line for line in result.stderr.splitlines() if "guard pool is full" in line]
    assert full == ["libtag: the guard pool is full: its 100 slots hold live blocks, and allocations go "
                    "unguarded until one is freed (LIBTAG_GUARD_SLOTS sets the cap, up to 262144; "
                    "LIBTAG_STATS counts them as guard_no_slot)"], result.stderr[-2000:]
    stats = _said(next(line for line in result.stderr.splitlines() if "libtag: stats" in line))
    assert stats["guard_allocs"] == ["100"] and int(stats["guard_no_slot"][0]) >= 51, stats
    assert int(stats["guard_allocs"][0]) + int(stats["guard_no_slot"][0]) == int(stats["allocs"][0]), stats


def test_a_bad_rate_is_refused(build_victim, tmp_path):
    # GIVEN LIBTAG_GUARD_RATE=often
    exe = build_victim("guard_faults", **PLAIN)
    env = S.victim_env("self", tmp_path / "snaps", LIBTAG_GUARD_RATE="often")
    result = subprocess.run([str(exe), "usable"], env=env, capture_output=True, text=True, timeout=60)
    # THEN libtag refuses to start, saying what it accepts
    assert result.returncode == 2, result
    assert result.stderr.splitlines() == ["libtag: error: LIBTAG_GUARD_RATE=often: expected a number"], \
        result.stderr
