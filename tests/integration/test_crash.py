"""Crashes under forensics run: the crash core lands in a *-crash snapshot
directory and its control block carries the fault; a program's own SIGSEGV
handler still runs (libtag chains to it).
"""

from __future__ import annotations

import signal

import pytest


import forensics_test_support as S
FAULT = 0xDEAD0000  # FAULT_ADDR in snap_segv.c


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_segfault_leaves_a_crash_core_with_the_fault(core_path, build_victim, run_cli, tmp_path):
    from forensics.snapshots import snapdir

    # GIVEN snap_segv, which dereferences FAULT_ADDR, under forensics run --dir
    exe = build_victim("snap_segv")
    snaps = tmp_path / "snaps"
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "LIBTAG_CORE": core_path}
    # WHEN
    result = run_cli("run", "--dir", snaps, "--", exe, "plain", env=env)
    # THEN forensics run exits 128 + SIGSEGV
    assert result.returncode == 128 + signal.SIGSEGV, (
        f"expected exit 139, got {result.returncode}: {result.stderr}")
    printed = int(result.stdout.strip().split("=", 1)[1], 16)
    assert printed == FAULT, f"expected the victim to print {FAULT:#x}, got {result.stdout!r}"
    # ... one snapshot dir, <comm>-<pid>-1-crash, with a complete core
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1 and dirs[0].name.endswith("-1-crash"), f"expected one *-1-crash dir, got {dirs}"
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    assert core is not None, f"expected a core in {snap.path}"
    # ... whose control block records SIGSEGV at the address the victim dereferenced
    ctl = S.read_control(core)
    assert ctl.reason == S.REASON_CRASH, f"expected reason 3 (crash), got {ctl.reason}"
    assert ctl.crash_signal == signal.SIGSEGV, f"expected signal 11, got {ctl.crash_signal}"
    assert ctl.crash_address == printed, f"expected address {printed:#x}, got {ctl.crash_address:#x}"
    assert ctl.crash_tid == ctl.pid == snap.pid, f"expected the main thread to crash: {ctl}"
    # ... and forensics run named it and the next command
    assert f"forensics: next: forensics inspect {core}" in result.stderr.splitlines(), result.stderr
    # ... and gdb opens it at the crashing function
    if S.have_gdb():
        gdb = S.gdb_bt(exe, core)
        assert gdb.returncode == 0, f"expected gdb exit 0, got {gdb.returncode}: {gdb.stderr}"
        assert "crash_here" in gdb.stdout, f"expected crash_here in the backtrace: {gdb.stdout}"


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_the_programs_own_segv_handler_still_runs(core_path, build_victim, run_cli, tmp_path):
    # GIVEN snap_segv with its own SIGSEGV handler (sigaction), which _exit(3)s
    exe = build_victim("snap_segv")
    snaps = tmp_path / "snaps"
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "LIBTAG_CORE": core_path}
    # WHEN
    result = run_cli("run", "--dir", snaps, "--", exe, "handler", env=env)
    # THEN the handler ran with the fault, and forensics run exits with its 3
    assert result.returncode == 3, f"expected exit 3, got {result.returncode}: {result.stderr}"
    lines = result.stdout.splitlines()
    assert lines == [f"fault={FAULT:#x}", f"handler called signal=11 addr={FAULT:#x}"], (
        f"expected the fault line and the handler's line, got {lines!r}")
    # ... and, the program having handled its crash itself, no crash snapshot
    assert S.snapshot_dirs(snaps) == [], f"expected no snapshot dir, got {S.snapshot_dirs(snaps)}"
