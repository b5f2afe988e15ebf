"""The periodic sweep: a heap overflow of a block that is not freed is caught
from the trace hooks (every LIBTAG_SWEEP instrumented entries), once.

GIVEN snap_sweep, which writes 8 bytes past a 40-byte block and then makes
20000 instrumented calls before freeing it
WHEN it runs under libtag with LIBTAG_SWEEP=1000
THEN exactly one heap-overflow snapshot exists, taken before the free (its
     detecting stack is busy_step, not free's caller), naming the block and
     the first byte written past its end
"""

from __future__ import annotations

import subprocess


import forensics_test_support as S


def test_sweep_catches_an_overflow_before_free_and_reports_it_once(build_victim, tmp_path):
    from forensics.snapshots import snapdir
    from forensics.reader.dump import Dump

    exe = build_victim("snap_sweep")
    snaps = tmp_path / "snaps"
    env = S.victim_env("self", snaps, LIBTAG_SWEEP="1000")
    proc = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "survived"
    address = int(proc.stdout.splitlines()[0].split("=")[1], 16)
    written = S.overwritten(proc.stdout.splitlines()[1], ord("x"))

    dirs = S.snapshot_dirs(snaps)
    assert [d.name.split("-")[-2:] for d in dirs] == [["heap", "overflow"]], dirs
    snap_dir = snapdir.wait_complete(dirs[0], 60)
    with Dump.open(snapdir.find_core(snap_dir.path)) as dump:
        a = dump.control.anomaly
        assert a.kind == "heap-overflow"
        # the address is the first byte written past the end; the block is b
        assert (a.address, a.block.start, a.written) == (address + 40, address, written)
        assert a.block.size == 40 and a.block.state == "live"
        functions = [f.function for f in dump.stack(a.stack)]
        assert functions[:2] == ["busy_step", "main"], functions


import pytest


@pytest.mark.parametrize("blocked", [False, True], ids=["probe", "signals-blocked"])
def test_sweep_reads_unmapped_recent_blocks_without_a_fault_reaching_the_program(
        build_victim, tmp_path, blocked):
    # GIVEN sweep_unmapped: each round munmaps a recent 64 MiB block, then
    # overflows a 40-byte block and makes 3000 instrumented calls; it has
    # its own SIGSEGV handler (and, blocked, blocks every signal)
    exe = build_victim("sweep_unmapped")
    env = S.victim_env("self", tmp_path / "snaps", LIBTAG_SWEEP="1000",
                       LIBTAG_ON_ANOMALY="ignore", LIBTAG_GUARD_RATE="0", LIBTAG_STATS="1")
    args = [str(exe)] + (["block"] if blocked else [])
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    # THEN it runs to the end, its handler never ran (the probe's faults on
    # the unmapped blocks are libtag's), and every overflow was reported
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "segv_seen=0"
    assert "anomalies=20 " in proc.stderr, proc.stderr[-2000:]
