"""Soak: 200 on-demand snapshots in a row of a victim whose 8 threads churn
allocations the whole time.  No deadlock (every wait is bounded), no lost
core (200 directories, seq 1..200, each complete), and the victim's own
checksums right at the end.  Self-written cores (LIBTAG_CORE=self), so that
path runs under load; the kernel path is covered in test_snapshot.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import time


import forensics_test_support as S
ROUNDS = 200
THREADS = 8
# A hang guard, not a speed requirement: 200 cores of ~100 MB each.
OVERALL_S = 1800
EACH_S = 120


def test_200_snapshots_in_a_row_under_churn(build_victim, tmp_path):
    from forensics.snapshots import snapdir

    # GIVEN snap_churn with 8 threads, snapshots to snaps/, self-written cores
    exe = build_victim("snap_churn")
    snaps = tmp_path / "snaps"
    proc, pid = S.start([str(exe), str(THREADS)], S.victim_env("self", snaps))
    deadline = time.monotonic() + OVERALL_S
    seen: list[tuple[int, str, int]] = []
    try:
        for i in range(1, ROUNDS + 1):
            # WHEN the test sends the snapshot signal and waits for the core
            os.kill(pid, signal.SIGUSR2)
            name = f"{exe.name[:15]}-{pid}-{i}-on-demand"
            S.wait_until(lambda: (snaps / name).is_dir() or proc.poll() is not None,
                         min(EACH_S, deadline - time.monotonic()), f"snapshot dir {name}")
            assert proc.poll() is None, f"victim died at snapshot {i}: {proc.returncode}"
            snap = snapdir.wait_complete(snaps / name,
                                           min(EACH_S, deadline - time.monotonic()))
            core = snapdir.find_core(snap.path)
            assert core is not None, f"snapshot {i}: no core in {snap.path}"
            seen.append((int(snap.info["seq"]), snap.info["reason"], core.stat().st_size))
            # the directory's job is done: free the disk
            shutil.rmtree(snap.path)
        alive = proc.poll()
    finally:
        out, err = S.finish(proc, timeout=120)

    # THEN 200 snapshots, seq 1..200, each with a non-empty core
    assert [s for s, _, _ in seen] == list(range(1, ROUNDS + 1)), f"seqs: {seen}"
    assert {r for _, r, _ in seen} == {"on-demand"}, f"reasons: {seen}"
    empty = [s for s, _, size in seen if size == 0]
    assert empty == [], f"expected no empty core, got empty cores at seq {empty}"
    assert sorted(os.listdir(snaps)) == [], f"expected no other snapshot dir, got {os.listdir(snaps)}"
    # ... the victim ran on, exited 0 with the right checksums
    assert alive is None, f"expected the victim running after {ROUNDS} snapshots"
    assert proc.returncode == 0, f"expected exit 0, got {proc.returncode}: {err[-2000:]}"
    S.check_churn_output(out, THREADS)
    assert "snapshot failed" not in err, f"expected no failed snapshot, got {err[-2000:]}"
