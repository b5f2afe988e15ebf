"""libtag's own memory is never a referrer: a block only libtag remembers (in
its per-thread TLS block, which for a worker thread sits inside the thread's
stack mapping) has no referrer in whoowns, and --leaks agrees it is lost.

tests/victims/who_lost.c: a worker allocates a block, drops every pointer to
it and blocks while main snapshots the process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from forensics.snapshots import snapdir
import forensics_test_support as S


def test_a_block_only_libtag_remembers_has_no_referrer(build_victim, run_victim, run_cli, tmp_path):
    # GIVEN the snapshot of a worker that lost its only pointer to a block
    exe = Path(os.path.realpath(build_victim("who_lost", instrument=False)))
    snaps = tmp_path / "snaps"
    done = run_victim(exe, snap_dir=snaps, env={"LIBTAG_CORE": "self"})
    assert done.returncode == 0, done.stderr
    facts = dict(line.split("=", 1) for line in done.stdout.splitlines())
    lost = facts["lost"]
    (snap_dir,) = S.snapshot_dirs(snaps)
    core = snapdir.find_core(snapdir.wait_complete(snap_dir, 60).path)
    # WHEN whoowns is asked about that block
    result = run_cli("whoowns", lost, "--core", str(core), "--json",
                     env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    # THEN it is the live block, and nothing points at it: not the word in
    # libtag's TLS inside the worker's stack mapping
    assert (doc["block"]["start"], doc["block"]["state"]) == (lost, "live"), doc["block"]
    assert doc["referrers"] == [], doc["referrers"]
    # AND inspect --leaks calls it a definite leak, allocated in lose_block
    result = run_cli("inspect", str(core), "--leaks", "--json",
                     env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert result.returncode == 0, result.stderr
    groups = [g for g in json.loads(result.stdout)["leaks"] if lost in g["examples"]]
    assert [(g["kind"], g["blocks"], g["bytes"]) for g in groups] == [("definite", 1, 200)], groups
    assert groups[0]["stack"][0]["function"] == "lose_block", groups[0]["stack"]
