"""On-demand requests are never dropped: one that arrives while another
snapshot is being taken gets a snapshot of its own, started after it asked.

tests/victims/snap_overlap.c sends the snapshot signal to one of its threads,
waits until that snapshot has started (its directory exists; threads that
block libtag's register signal keep it busy for 200 ms) and sends it again,
to another thread, which takes it at once.
"""

from __future__ import annotations

import forensics_test_support as S
from forensics.snapshots import snapdir


def test_a_request_during_a_snapshot_gets_the_next_one(build_victim, run_victim, tmp_path):
    # GIVEN a second SIGUSR2 sent while the first snapshot is under way
    exe = build_victim("snap_overlap", instrument=False)
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    done = run_victim(exe, snap_dir=snaps, env={"LIBTAG_CORE": "self"})
    assert done.returncode == 0, done.stderr
    facts = dict(line.split("=", 1) for line in done.stdout.splitlines())
    # THEN two on-demand snapshots, 1 and 2: the second was not dropped
    dirs = S.snapshot_dirs(snaps)
    assert [d.name.split("-", 3)[-1] for d in dirs] == ["1-on-demand", "2-on-demand"], dirs
    assert facts["snapshots"] == "2", done.stdout
    # ... and the second serves a request made after the first one started
    first, second = (snapdir.wait_complete(d, 60).read_info() for d in dirs)
    assert int(second["request_ns"]) > int(first["request_ns"]), (first, second)
