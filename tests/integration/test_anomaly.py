"""Anomalies: each kind of heap misuse leaves exactly one snapshot directory
named for it, and the core's control block names the kind and the address.

snap_anomaly prints the address concerned ("address=0x...": the pointer
passed to free(), or the first byte written where it must not be) and the
block involved ("block=0x...") before the misuse.  With LIBTAG_ON_ANOMALY=snapshot it runs on ("survived", exit 0);
with abort it dies of SIGABRT and still leaves exactly one snapshot.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest


import forensics_test_support as S
# victim argument -> (the reason / kind name, does the anomaly name a block?)
CASES = {
    "double-free": ("double-free", True),
    "invalid-free-stack": ("invalid-free", False),
    "invalid-free-interior": ("invalid-free", False),
    "heap-overflow": ("heap-overflow", True),
    "use-after-free": ("use-after-free", True),
}


def _run(exe, case, core_path, on_anomaly, snaps):
    import subprocess

    env = S.victim_env(core_path, snaps, LIBTAG_ON_ANOMALY=on_anomaly,
                       LIBTAG_QUARANTINE="4096")
    return subprocess.run([str(exe), case], env=env, capture_output=True, text=True, timeout=60)


def _the_one_snapshot(snaps: Path, pid: int, reason: str):
    from forensics.snapshots import snapdir

    dirs = S.snapshot_dirs(snaps)
    expected = f"snap_anomaly-i-{pid}-1-{reason}"
    assert [d.name for d in dirs] == [expected], f"expected exactly [{expected}], got {dirs}"
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    assert core is not None, f"expected a core in {snap.path}"
    assert snap.info["reason"] == reason, f"expected info reason {reason}, got {snap.info}"
    return core


def _address(stdout: str, key: str = "address") -> int:
    line = next((ln for ln in stdout.splitlines() if ln.startswith(f"{key}=")), None)
    assert line is not None, f"expected a {key}= line, got {stdout!r}"
    return int(line.split("=", 1)[1], 16)


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_anomaly_snapshot_and_run_on(case, core_path, build_victim, tmp_path):
    # GIVEN snap_anomaly CASE under libtag with LIBTAG_ON_ANOMALY=snapshot
    exe = build_victim("snap_anomaly")
    snaps = tmp_path / "snaps"
    reason, names_block = CASES[case]
    # WHEN it misuses the heap
    result = _run(exe, case, core_path, "snapshot", snaps)
    # THEN it survives (libtag skipped the faulty operation) ...
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    assert result.stdout.splitlines()[-1] == "survived", f"expected 'survived', got {result.stdout!r}"
    address = _address(result.stdout)
    pid = int(next(ln for ln in result.stderr.splitlines() if "snapshot 1" in ln)
              .split(f"-1-{reason}")[0].rsplit("-", 1)[1])
    # ... leaving exactly one snapshot named for the kind
    core = _the_one_snapshot(snaps, pid, reason)
    # ... whose control block names the kind and the address
    ctl = S.read_control(core)
    assert ctl.reason == S.REASON_ANOMALY, f"expected reason 2 (anomaly), got {ctl.reason}"
    assert ctl.anomaly_kind == S.ANOMALY_KINDS[reason], (
        f"expected kind {S.ANOMALY_KINDS[reason]} ({reason}), got {ctl.anomaly_kind}")
    assert ctl.anomaly_address == address, (
        f"expected address {address:#x}, got {ctl.anomaly_address:#x}")
    block = _address(result.stdout, "block") if names_block else 0
    assert ctl.anomaly_block == block, f"expected block {block:#x}, got {ctl.anomaly_block:#x}"
    assert (ctl.pid, ctl.anomaly_tid, ctl.anomaly_count) == (pid, pid, 1), (
        f"expected pid/tid {pid} and 1 anomaly, got {ctl}")


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
@pytest.mark.parametrize("case", ["double-free", "use-after-free"])
def test_anomaly_with_abort_dies_of_sigabrt_after_one_snapshot(case, core_path, build_victim,
                                                                tmp_path):
    # GIVEN LIBTAG_ON_ANOMALY=abort
    exe = build_victim("snap_anomaly")
    snaps = tmp_path / "snaps"
    reason, _ = CASES[case]
    # WHEN it misuses the heap
    result = _run(exe, case, core_path, "abort", snaps)
    # THEN it dies of SIGABRT without "survived" ...
    assert result.returncode == -signal.SIGABRT, (
        f"expected death by SIGABRT (-6), got {result.returncode}: {result.stderr}")
    assert "survived" not in result.stdout, f"expected no 'survived', got {result.stdout!r}"
    address = _address(result.stdout)
    pid = int(next(ln for ln in result.stderr.splitlines() if "snapshot 1" in ln)
              .split(f"-1-{reason}")[0].rsplit("-", 1)[1])
    # ... and leaves exactly one snapshot, the anomaly's (no crash dir, no 2nd core)
    core = _the_one_snapshot(snaps, pid, reason)
    ctl = S.read_control(core)
    assert (ctl.reason, ctl.anomaly_kind, ctl.anomaly_address) == (
        S.REASON_ANOMALY, S.ANOMALY_KINDS[reason], address), f"got {ctl}"
    assert not list(Path(tmp_path).glob("core*")), "expected no core of the process itself"


def test_run_with_abort_exits_134_and_catalogs_the_one_snapshot(build_victim, run_cli, tmp_path):
    # GIVEN forensics run --on-anomaly abort of a double free
    exe = build_victim("snap_anomaly")
    snaps = tmp_path / "snaps"
    state = tmp_path / "state"
    result = run_cli("run", "--dir", snaps, "--on-anomaly", "abort", "--", exe, "double-free",
                     env={"XDG_STATE_HOME": str(state), "LIBTAG_CORE": "self"})
    # THEN 128 + SIGABRT, one snapshot, named on stderr
    assert result.returncode == 128 + signal.SIGABRT, (
        f"expected exit 134, got {result.returncode}: {result.stderr}")
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1 and dirs[0].name.endswith("-1-double-free"), f"got {dirs}"
    assert f"forensics: next: forensics inspect {dirs[0] / 'core'}" in result.stderr.splitlines(), (
        result.stderr)


def test_double_free_of_an_unmapped_big_block_is_reported_not_fatal(build_victim, tmp_path):
    # GIVEN rev_cases bigfree: a 4 MiB block freed twice (its mapping is
    # gone after the first free)
    proc = S.run_case(build_victim("rev_cases"), "bigfree", tmp_path)
    # THEN libtag reports an invalid free and the program runs on instead of
    # faulting inside libtag
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "survived"
    dirs = S.snapshot_dirs(tmp_path / "snaps")
    assert len(dirs) == 1 and dirs[0].name.endswith("-1-invalid-free"), dirs
