"""diff of two cores of a process that never ran libtag: growth by chunk size.

GIVEN tests/victims/glibc_growth.c, run without libtag, and gcore's core of
it at each of its two waits (30 blocks of 72 bytes; then 5 of them freed and
10 blocks of 1000 bytes added)
WHEN forensics diff compares the two cores
THEN the size classes change by exactly what the victim did, the kept and
gone chunks are those of one process, and the answer says what is unknown
without libtag; a libtag core against a plain one is refused in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import forensics_test_support as S

pytestmark = pytest.mark.skipif(shutil.which("gcore") is None, reason="gcore (gdb) is not installed")


@pytest.fixture(scope="module")
def cores(build_victim, tmp_path_factory) -> tuple[Path, Path, int]:
    exe = build_victim("glibc_growth", instrument=False, extra_flags=["-O2"])
    return S.growth_cores(exe, tmp_path_factory.mktemp("glibc-diff"))


def test_diff_of_two_plain_cores_is_by_chunk_size(cores, run_cli, tmp_path):
    first, second, pid = cores
    done = run_cli("diff", first, second, "--json", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["libtag"], doc["same_process"], doc["old"]["pid"], doc["new"]["pid"]) == (False, True, pid, pid)
    by = {r["usable_size"]: r for r in doc["size_classes"]}
    # 10 new chunks of 1000 usable bytes, and 5 of the 30 of 72 gone
    assert {k: by[1000][k] for k in ("old_chunks", "new_chunks", "chunks", "bytes", "kept", "added", "gone")} == {
        "old_chunks": 0, "new_chunks": 10, "chunks": 10, "bytes": 10_000, "kept": 0, "added": 10, "gone": 0}
    assert {k: by[72][k] for k in ("old_chunks", "new_chunks", "chunks", "bytes", "kept", "added", "gone")} == {
        "old_chunks": 30, "new_chunks": 25, "chunks": -5, "bytes": -360, "kept": 25, "added": 0, "gone": 5}
    # the largest growth comes first, and what is unknown is said
    assert doc["size_classes"][0]["usable_size"] == 1000, doc["size_classes"][:2]
    assert "allocation stacks" in doc["without_libtag"]["unknown"], doc["without_libtag"]
    # AND the human form shows the same rows
    human = run_cli("diff", first, second, env={"XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "200"})
    assert human.returncode == 0, human.stderr
    assert "10 new chunks, 5 gone" in human.stdout, human.stdout
    row = next(line for line in human.stdout.splitlines() if line.split()[:1] == ["1000"])
    assert [c.strip() for c in row.split("│")] == ["1000", "+10", "+10000", "0 -> 10", "0", "10", "0"], row


def test_filter_needs_stacks_and_kinds_do_not_mix(cores, run_cli, build_victim, run_victim, tmp_path):
    first, second, _ = cores
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    done = run_cli("diff", first, second, "--filter", "main", env=env)
    assert (done.returncode, done.stderr.strip()) == (2, (
        "forensics: error: diff: --filter and --exclude match allocation stacks, and cores without "
        "libtag have none (their diff is by chunk size)")), done.stderr
    # a libtag snapshot against a plain core
    snaps = tmp_path / "snaps"
    ran = run_victim(build_victim("truth"), "snapshot", snap_dir=snaps)
    assert ran.returncode == 0, ran.stderr
    pid = int(ran.stdout.split("pid ")[1].split()[0])
    tagged = S.wait_core(snaps, pid)
    done = run_cli("diff", tagged, second, env=env)
    assert (done.returncode, done.stderr.strip()) == (2, (
        f"forensics: error: diff: {second} is a core without libtag and the other is not: "
        f"give two of one kind")), done.stderr
