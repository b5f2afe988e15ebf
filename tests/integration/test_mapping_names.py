"""Every kind of mapping has one name, whatever answer gives it: SysV and
POSIX shared memory, a memfd, a MAP_SHARED mapping of /dev/zero and a private
anonymous mapping are named for what they are (never a module's globals),
and a word in shared memory still keeps the block it points to alive.

Victim: tests/victims/shm_kinds.c (prints each mapping's address and key or
name, and keep_in_shm's 72-byte block, whose only pointer is the first word
of the SysV segment; then an on-demand snapshot of itself).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import forensics_test_support as S

KEPT_SIZE = 72  # shm_kinds.c


def parse(stdout: str) -> dict[str, list[str]]:
    return {key: rest for key, *rest in (line.split() for line in stdout.splitlines())}


@pytest.fixture(scope="module")
def case(build_victim, run_victim, tmp_path_factory):
    work = tmp_path_factory.mktemp("shm")
    snaps = work / "snaps"
    snaps.mkdir(mode=0o700)
    exe = Path(os.path.realpath(build_victim("shm_kinds")))
    done = run_victim(exe, snap_dir=snaps)
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    facts = parse(done.stdout)
    return facts, S.wait_core(snaps, int(facts["pid"][0])), work / "state"


def expected_names(facts: dict[str, list[str]]) -> dict[str, str]:
    return {
        "sysv": f"SysV shared memory (key {int(facts['sysv'][1], 16):#x})",
        "memfd": f"memfd:{facts['memfd'][1]}",
        "posix": f"POSIX shared memory {facts['posix'][1]}",
        "zero": "shared anonymous mapping",
        "anon": "anonymous mapping",
    }


def whoowns(run_cli, state: Path, core: Path, addr: str, *extra: str):
    r = run_cli("whoowns", addr, "--core", str(core), *extra, env={"XDG_STATE_HOME": str(state)})
    assert r.returncode in (0, 1), f"expected exit 0 or 1, got {r.returncode}: {r.stderr}"
    return r


@pytest.mark.parametrize("kind", ["sysv", "memfd", "posix", "zero", "anon"])
def test_each_mapping_is_named_for_its_kind(case, run_cli, kind):
    facts, core, state = case
    addr = facts[kind][0]
    want = expected_names(facts)[kind]
    # GIVEN the address the victim printed for one mapping (its first byte)
    # WHEN whoowns answers for a word 64 bytes into it
    inside = hex(int(addr, 16) + 64)
    doc = json.loads(whoowns(run_cli, state, core, inside, "--json").stdout)
    # THEN it is a mapping, named for its kind, starting where the victim mapped it
    assert (doc["owner"], doc["region"]["name"], doc["region"]["start"]) == ("mapping", want, addr), doc
    assert (doc["block"], doc["symbol"]) == (None, None), doc
    # AND the text says the same name on its first line
    first = whoowns(run_cli, state, core, inside).stdout.splitlines()[0]
    assert first.startswith(f"{inside}: mapping - {want} [{addr}-"), first


def test_a_pointer_in_shared_memory_is_a_named_referrer_and_a_root(case, run_cli):
    facts, core, state = case
    kept, size = facts["kept"]
    sysv = facts["sysv"][0]
    name = expected_names(facts)["sysv"]
    # GIVEN the block whose only pointer is the SysV segment's first word
    # WHEN whoowns answers for it
    doc = json.loads(whoowns(run_cli, state, core, kept, "--json").stdout)
    # THEN the block is found, and its one referrer is that word, named by
    # the segment's kind, with no module
    assert (doc["block"]["start"], doc["block"]["size"]) == (kept, KEPT_SIZE) == (kept, int(size))
    assert doc["referrers"] == [{"address": sysv, "in": "global", "block_start": None, "interior": False,
                                 "thread": None, "module": None, "symbol": name}], doc["referrers"]
    text = whoowns(run_cli, state, core, kept).stdout
    assert name in text and "SYSV" not in text, text
    # AND its retention path starts at that word, named the same way
    assert [(r["root"]["kind"], r["root"]["address"], r["root"]["module"], r["root"]["symbol"], r["path"])
            for r in doc["retainers"]] == [("global", sysv, None, name, [])], doc["retainers"]
    assert f"global word {sysv} ({name}) -> this block" in text, text
    # AND the leak scan still counts the segment as a root: the block is no leak
    r = run_cli("inspect", str(core), "--json", "--leaks", env={"XDG_STATE_HOME": str(state)})
    assert r.returncode == 0, r.stderr
    leaks = json.loads(r.stdout)["leaks"]
    assert not [g for g in leaks if any(f["function"] == "keep_in_shm" for f in g["stack"])], leaks
