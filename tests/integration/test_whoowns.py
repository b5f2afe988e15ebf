"""forensics whoowns answers, for every address a real victim printed, exactly
what the victim knows: block, size, offset, state, threads, both stacks, and
who points at the block.

tests/victims/who_addrs.c allocates a live block (alloc_target <- setup_target
<- main) whose pointer it keeps in exactly three words - a global, a word
inside another live block and a slot of main's stack - and a block allocated
by a worker thread (worker_alloc <- worker_main) and freed by main
(release_freed <- main); it prints every address and thread id, then takes an
on-demand snapshot of itself (or, in "wait" mode, blocks for whoowns --pid).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from forensics import libpath
from forensics.snapshots import snapdir
import forensics_test_support as S

LIVE_SIZE, FREED_SIZE = 100, 72  # who_addrs.c


@dataclass
class Facts:
    """What who_addrs printed."""

    values: dict[str, list[int]] = field(default_factory=dict)

    def __getitem__(self, key: str) -> int:
        return self.values[key][0]

    def second(self, key: str) -> int:
        return self.values[key][1]


def parse(stdout: str) -> Facts:
    facts = Facts()
    for line in stdout.splitlines():
        key, *rest = line.split()
        if key == "ready":
            continue
        facts.values[key] = [int(v, 0) for v in rest]
    want = {"pid", "main_tid", "worker_tid", "live", "freed", "holder", "ref_global",
            "ref_heap", "ref_stack", "stack", "global"}
    assert want <= facts.values.keys(), f"expected the lines {sorted(want)}, got {stdout!r}"
    return facts


@dataclass
class Case:
    exe: Path
    facts: Facts
    core: Path
    state: Path  # XDG_STATE_HOME for the CLI


def functions(frames: list[dict], exe: Path) -> list[str]:
    """The function names of the frames in the victim itself, innermost first."""
    return [f["function"] for f in frames if f["module"] == str(exe)]


@pytest.fixture(scope="module")
def exe(build_victim) -> Path:
    return Path(os.path.realpath(build_victim("who_addrs")))


@pytest.fixture(scope="module", params=S.CORE_PATHS)
def case(request, exe, run_victim, tmp_path_factory) -> Case:
    snaps = tmp_path_factory.mktemp(f"who-snaps-{request.param}")
    snaps.chmod(0o700)
    done = run_victim(exe, "snapshot", snap_dir=snaps, env={"LIBTAG_CORE": request.param})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    facts = parse(done.stdout)
    dirs = list(snaps.glob(f"*-{facts['pid']}-1-on-demand"))
    assert len(dirs) == 1, f"expected one snapshot dir, got {sorted(snaps.iterdir())}"
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    assert core is not None, f"expected a core in {snap.path}"
    return Case(exe, facts, core, tmp_path_factory.mktemp("state"))


def whoowns(run_cli, state: Path, addr: str, *source: str) -> tuple[int, dict]:
    result = run_cli("whoowns", addr, *source, "--json", env={"XDG_STATE_HOME": str(state)})
    assert result.returncode in (0, 1), (
        f"expected exit 0 or 1, got {result.returncode}: {result.stderr}")
    return result.returncode, json.loads(result.stdout)


def ask(run_cli, case: Case, addr: int) -> tuple[int, dict]:
    return whoowns(run_cli, case.state, hex(addr), "--core", str(case.core))


def assert_live_block(doc: dict, case: Case, offset: int) -> None:
    f = case.facts
    block = doc["block"]
    assert doc["owner"] == "heap", f"expected owner heap, got {doc['owner']}"
    assert (block["start"], block["size"], block["offset"], block["state"]) == (
        hex(f["live"]), LIVE_SIZE, offset, "live"), block
    assert block["thread"] == f["main_tid"], f"expected thread {f['main_tid']}, got {block['thread']}"
    assert (block["free_stack"], block["free_thread"]) == (None, None), block
    assert block["alloc_stack"][0]["function"] == "alloc_target", block["alloc_stack"][0]
    assert functions(block["alloc_stack"], case.exe) == ["alloc_target", "setup_target", "main"], (
        block["alloc_stack"])


def expected_referrers(f: Facts, exe: Path) -> list[dict]:
    """The three holders the victim printed: its global (in the victim's own
    data), a word in its holder block, and a slot in main's stack frame - each
    pointing at the block's start."""
    common = {"interior": False, "thread": None, "module": None, "block_start": None, "symbol": None}
    return sorted([
        {**common, "address": hex(f["ref_global"]), "in": "global", "module": str(exe), "symbol": "g_ref"},
        {**common, "address": hex(f["ref_heap"]), "in": "heap", "block_start": hex(f["holder"])},
        {**common, "address": hex(f["ref_stack"]), "in": "stack", "thread": f["main_tid"]},
    ], key=lambda r: int(r["address"], 16))


# ------------------------------------------------------------- the blocks --


def test_live_block_start(case, run_cli):
    # WHEN whoowns is asked for the live block's own pointer
    rc, doc = ask(run_cli, case, case.facts["live"])
    # THEN exit 0, the block at offset 0, allocated by main through alloc_target
    assert rc == 0, f"expected exit 0, got {rc}"
    assert doc["address"] == hex(case.facts["live"]), doc["address"]
    assert_live_block(doc, case, 0)


def test_live_block_referrers_are_exactly_the_three_holders(case, run_cli):
    # WHEN
    rc, doc = ask(run_cli, case, case.facts["live"])
    # THEN the global, the word in the holder block and main's stack slot - no more
    got = sorted(doc["referrers"], key=lambda r: int(r["address"], 16))
    assert got == expected_referrers(case.facts, case.exe), f"expected the three holders, got {got}"
    assert doc["referrer_count"] == 3, doc["referrer_count"]
    # AND the block's own word that points into it is counted, not listed
    assert doc["self_referrers"] == 1, doc["self_referrers"]
    # AND the roots come first: the global, then the stack slot, then the heap word
    assert [r["in"] for r in doc["referrers"]] == ["global", "stack", "heap"], doc["referrers"]


@pytest.mark.parametrize("offset", [17, LIVE_SIZE - 1])
def test_interior_pointer_and_last_byte(offset, case, run_cli):
    rc, doc = ask(run_cli, case, case.facts["live"] + offset)
    assert rc == 0, f"expected exit 0, got {rc}"
    assert_live_block(doc, case, offset)
    assert doc["note"] == f"{offset} bytes into a live block of {LIVE_SIZE} bytes", doc["note"]


def test_one_byte_past_the_end(case, run_cli):
    # WHEN the address just past the live block
    addr = case.facts["live"] + LIVE_SIZE
    rc, doc = ask(run_cli, case, addr)
    # THEN no block holds it (exit 1), and the answer names the block it follows
    assert rc == 1, f"expected exit 1, got {rc}"
    assert (doc["owner"], doc["block"], doc["referrers"]) == ("mapping", None, []), doc
    assert doc["near"]["past_end"] == 0, doc["near"]
    assert (doc["near"]["block"]["start"], doc["near"]["block"]["size"]) == (
        hex(case.facts["live"]), LIVE_SIZE), doc["near"]
    assert doc["note"] == (f"just past the end of the live block at {hex(case.facts['live'])} "
                           f"({LIVE_SIZE} bytes)"), doc["note"]


def test_freed_block(case, run_cli):
    f = case.facts
    # WHEN the block the worker allocated and main freed
    rc, doc = ask(run_cli, case, f["freed"] + 8)
    # THEN exit 0, freed, both threads and both stacks
    assert rc == 0, f"expected exit 0, got {rc}"
    block = doc["block"]
    assert (block["start"], block["size"], block["offset"], block["state"]) == (
        hex(f["freed"]), FREED_SIZE, 8, "freed"), block
    assert (block["thread"], block["free_thread"]) == (f["worker_tid"], f["main_tid"]), block
    assert f["worker_tid"] != f["main_tid"], "expected the worker to be another thread"
    assert functions(block["alloc_stack"], case.exe) == ["worker_alloc", "worker_main"], (
        block["alloc_stack"])
    assert functions(block["free_stack"], case.exe) == ["release_freed", "main"], block["free_stack"]


# ------------------------------------------------------------ not a block --


def test_stack_variable(case, run_cli):
    rc, doc = ask(run_cli, case, case.facts["stack"])
    assert rc == 1, f"expected exit 1, got {rc}"
    tid = case.facts["main_tid"]
    assert (doc["owner"], doc["block"], doc["thread"]) == ("stack", None, tid), doc
    assert doc["region"]["name"] == f"stack of thread {tid}", doc["region"]
    lo, hi = int(doc["region"]["start"], 16), int(doc["region"]["end"], 16)
    assert lo <= case.facts["stack"] < hi, f"expected the address inside {doc['region']}"


def test_global(case, run_cli):
    rc, doc = ask(run_cli, case, case.facts["global"])
    assert rc == 1, f"expected exit 1, got {rc}"
    assert (doc["owner"], doc["block"]) == ("global", None), doc
    assert doc["region"]["name"] == f"globals of {case.exe.name}", doc["region"]
    # ... named by its symbol in the program's own symbol table: &g_plain[8]
    assert doc["symbol"] == {"name": "g_plain", "offset": 8, "section": ".bss", "module": str(case.exe)}, doc
    assert doc["note"] == f"g_plain+8 (.bss) in {case.exe}", doc["note"]


def test_null(case, run_cli):
    rc, doc = ask(run_cli, case, 0)
    assert rc == 1, f"expected exit 1, got {rc}"
    assert (doc["address"], doc["owner"], doc["block"], doc["region"], doc["note"]) == (
        "0x0", "unmapped", None, None, "NULL page"), doc


def test_decimal_address_gives_the_same_answer(case, run_cli):
    _, by_hex = ask(run_cli, case, case.facts["live"] + 5)
    rc, by_dec = whoowns(run_cli, case.state, str(case.facts["live"] + 5), "--core", str(case.core))
    assert rc == 0, f"expected exit 0, got {rc}"
    assert by_dec == by_hex, f"expected the same document, got {by_dec} vs {by_hex}"


def test_human_output_names_block_stacks_and_referrers(case, run_cli):
    result = run_cli("whoowns", hex(case.facts["freed"]), "--core", str(case.core),
                     env={"XDG_STATE_HOME": str(case.state), "COLUMNS": "200"})
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    out = result.stdout
    for text in (f"block {hex(case.facts['freed'])}  {FREED_SIZE} bytes  freed  offset 0",
                 f"allocated by thread {case.facts['worker_tid']}",
                 f"freed by thread {case.facts['main_tid']}", "worker_alloc", "release_freed"):
        assert text in out, f"expected {text!r} in:\n{out}"


# --------------------------------------------- --pid and the catalog's newest --


def start_waiting(exe: Path, snaps: Path, state: Path) -> tuple[subprocess.Popen, Facts]:
    env = dict(os.environ, LD_PRELOAD=str(libpath.lib_path()), LIBTAG_DIR=str(snaps),
               LIBTAG_CORE="self", XDG_STATE_HOME=str(state))
    proc = subprocess.Popen([str(exe), "wait"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = b""
    while b"ready pid=" not in out or not out.endswith(b"\n"):
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        chunk = os.read(proc.stdout.fileno(), 65536) if ready else b""
        if not chunk:
            proc.kill()
            proc.wait(timeout=30)
            raise AssertionError(f"who_addrs wait printed no 'ready' line: {out!r}")
        out += chunk
    return proc, parse(out.decode())


def test_pid_takes_a_fresh_snapshot_then_neither_flag_uses_it(exe, run_cli, tmp_path):
    snaps, state = tmp_path / "snaps", tmp_path / "state"
    snaps.mkdir(mode=0o700)
    # GIVEN who_addrs blocked in read(), nothing in the catalog yet
    proc, f = start_waiting(exe, snaps, state)
    try:
        # WHEN whoowns --pid asks for its live block
        rc, doc = whoowns(run_cli, state, hex(f["live"] + 3), "--pid", str(f["pid"]))
        # THEN a snapshot was taken, and the answer is the victim's
        dirs = [d.name for d in snaps.iterdir()]
        assert dirs == [f"{exe.name[:15]}-{f['pid']}-1-on-demand"], (
            f"expected one on-demand dir, got {dirs}")
        new_core = str(snaps / dirs[0] / "core")
        assert doc["core"] == new_core, doc["core"]
        # ... and the human answer says where the new snapshot went, first
        human = run_cli("whoowns", hex(f["live"]), "--pid", str(f["pid"]),
                        env={"XDG_STATE_HOME": str(state)})
        second = snaps / f"{exe.name[:15]}-{f['pid']}-2-on-demand" / "core"
        assert human.stdout.splitlines()[0] == (
            f"core {second} (a new snapshot of pid {f['pid']})"), human.stdout
        assert rc == 0, f"expected exit 0, got {rc}"
        block = doc["block"]
        assert (block["start"], block["size"], block["offset"], block["state"], block["thread"]) == (
            hex(f["live"]), LIVE_SIZE, 3, "live", f["main_tid"]), block
        assert functions(block["alloc_stack"], exe) == ["alloc_target", "setup_target", "main"]
        got = sorted(doc["referrers"], key=lambda r: int(r["address"], 16))
        assert got == expected_referrers(f, exe), f"expected the three holders, got {got}"
        # ... and still running: the process ran on after the snapshot
        assert proc.poll() is None, "expected who_addrs to run on after the snapshot"
        # WHEN whoowns has neither --core nor --pid
        rc, newest = whoowns(run_cli, state, hex(f["freed"]))
        # THEN it reads the snapshot --pid took last (the newest in the catalog)
        assert rc == 0, f"expected exit 0, got {rc}"
        assert newest["core"] == str(second), newest["core"]
        block = newest["block"]
        assert (block["start"], block["state"], block["thread"], block["free_thread"]) == (
            hex(f["freed"]), "freed", f["worker_tid"], f["main_tid"]), block
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert proc.returncode == 0, f"expected who_addrs to exit 0, got {proc.returncode}"


def test_neither_flag_reads_the_newest_of_two_runs(exe, run_cli, tmp_path):
    snaps, state = tmp_path / "snaps", tmp_path / "state"
    env = {"XDG_STATE_HOME": str(state), "LIBTAG_CORE": "self"}
    # GIVEN two runs of who_addrs under forensics run, each snapshotting itself
    runs = []
    for _ in range(2):
        result = run_cli("run", "--dir", snaps, "--", exe, "snapshot", env=env)
        assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
        runs.append(parse(result.stdout))
    # WHEN whoowns asks for the second run's live block with no --core / --pid
    second = runs[1]
    rc, doc = whoowns(run_cli, state, hex(second["live"]))
    # THEN the answer comes from the second run's core, and says so first
    assert rc == 0, f"expected exit 0, got {rc}"
    (core,) = [str(d / "core") for d in snaps.iterdir() if f"-{second['pid']}-" in d.name]
    assert doc["core"] == core, doc["core"]
    human = run_cli("whoowns", hex(second["live"]), env={"XDG_STATE_HOME": str(state)})
    assert human.stdout.splitlines()[0] == (
        f"core {core} (the newest in the catalog: pid {second['pid']} {exe}, on-demand)"), human.stdout
    assert (doc["block"]["start"], doc["block"]["thread"]) == (hex(second["live"]), second["main_tid"])
    got = sorted(doc["referrers"], key=lambda r: int(r["address"], 16))
    assert got == expected_referrers(second, exe), f"expected the second run's holders, got {got}"
    # ... and both runs are in the catalog
    listed = run_cli("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [e["pid"] for e in json.loads(listed.stdout)] == [r["pid"] for r in runs], listed.stdout


def test_whoowns_finds_a_zero_size_block(build_victim, run_cli, tmp_path):
    # GIVEN the core of a process holding malloc(0)'s block
    core, address = S.zero_block_core(build_victim("rev_cases"), tmp_path)
    # WHEN whoowns asks about its address
    done = run_cli("whoowns", hex(address), "--core", core, "--json",
                   env={"XDG_STATE_HOME": str(tmp_path / "state")})
    # THEN it is that block, of size 0, and whoowns exits 0
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["owner"], doc["block"]["start"], doc["block"]["size"]) == ("heap", hex(address), 0)
