"""Reads after free caught by libtag's DEFAULT settings: the first
allocation of every allocation stack (LIBTAG_GUARD_SITES=1, the default) is
a guarded one, so a block a program allocates at one site once - the
addrinfo getaddrinfo returns, a configuration struct - faults at the
instruction that reads it after its free, with no LIBTAG_GUARD_RATE set.

uaf_default (tests/victims/uaf_default.c) churns 200000 blocks through one
hot site first, then prints the block, its size, the byte it reads and the
source line of the read, and reads it after free.  It runs through
`forensics run`, with the environment the test suite sets for every other
program (LIBTAG_GUARD_RATE=0, conftest.py) taken out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import forensics_test_support as S
from forensics.reader import abi

# case -> the function that reads the freed block
CASES = {"addrinfo": "read_family", "config": "read_port"}


def _said(stdout: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        for word in line.split():
            key, eq, value = word.partition("=")
            if eq:
                out[key] = value
    return out


def _forensics(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forensics", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", list(CASES))
def test_a_read_after_free_of_a_once_allocated_block_is_caught_by_default(case, build_victim,
                                                                          tmp_path):
    # GIVEN libtag's defaults: no LIBTAG_GUARD_* in the environment
    exe = build_victim("uaf_default", instrument=False)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LIBTAG_GUARD_") and k != "PYTHONPATH"}
    env.update(LIBTAG_CORE="self", XDG_STATE_HOME=str(tmp_path / "state"))
    snaps = tmp_path / "snaps"
    # WHEN the victim reads a block it allocated once, after freeing it
    result = _forensics("run", "--dir", str(snaps), "--", str(exe), case, env=env, cwd=tmp_path)
    # THEN the read is caught at its instruction, and the program runs on,
    # reading the fill libtag left in the freed block
    assert result.returncode == 0, result.stderr
    said = _said(result.stdout)
    fill = int.from_bytes(bytes([abi.TAG_FREE_PATTERN]) * 4, "little", signed=True)
    assert said["value"] == str(fill), result.stdout
    assert result.stdout.splitlines()[-1] == "survived", result.stdout
    assert f"use-after-free: read at {said['address']} (block {said['block']})" in result.stderr, \
        result.stderr
    [snap] = S.snapshot_dirs(snaps)
    assert snap.name.endswith("-1-use-after-free"), snap.name
    pid = int(re.search(r"-(\d+)-1-use-after-free$", snap.name).group(1))
    core = S.wait_core(snaps, pid, 1, "use-after-free")
    r = _forensics("inspect", "--json", str(core), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    [a] = json.loads(r.stdout)["anomalies"]
    # ... as a read of the freed block, whose exact size the victim printed
    # (getaddrinfo's: an addrinfo and its sockaddr_in in one block, 48 + 16)
    assert (a["kind"], a["access"]) == ("use-after-free", "read"), a
    assert int(a["address"], 16) == int(said["address"], 16), (a["address"], said)
    b = a["block"]
    assert (int(b["start"], 16), b["size"], b["state"], b["guarded"]) == (
        int(said["block"], 16), int(said["size"]), "freed", True), b
    assert int(said["size"]) == {"addrinfo": 64, "config": 80}[case], said
    # ... by the instruction in the function that read it, at the read's line
    top = a["stack"][0]
    assert (top["function"], top["line"]) == (CASES[case], int(said["line"])), a["stack"][:3]
    assert a["pc"] == top["address"], (a["pc"], top)
    # ... with the free that came before it
    assert b["free_stack"], b
