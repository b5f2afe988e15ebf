"""Corner cases found in review, each on a real victim under libtag.

- GIVEN a 4 MiB block freed twice (glibc unmaps it at the first free) THEN
  libtag reports an anomaly and the program runs on instead of faulting
  inside libtag.
- GIVEN SIGFPE ignored by the program and sent with kill() THEN the program
  survives, as it does without libtag (the crash hook honours SIG_IGN).
- GIVEN a SIGSEGV handler installed with SA_RESETHAND that returns THEN it
  runs once and the repeated fault kills the process, as without libtag.
- GIVEN a snapshot taken while a worker lived, then another after it exited
  THEN the second self-written core holds the one live thread only (no stale
  registers of the exited one).
- GIVEN malloc(0)'s pointer THEN whoowns finds the block (size 0) and exits 0.
- GIVEN a core whose executable path is now a FIFO THEN inspect answers
  (the module just has no symbols) instead of hanging on the FIFO.
- GIVEN a snapshot directory in the root owned by another user THEN list
  does not catalog it (anyone who can write the root could plant one).
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

import forensics_test_support as S


def _run(exe, mode, tmp_path, **env):
    e = S.victim_env("self", tmp_path / "snaps", LIBTAG_QUIET="1", **env)
    return subprocess.run([str(exe), mode], env=e, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def _plain(exe, mode, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([str(exe), mode], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def exe(build_victim):
    return build_victim("rev_cases")


def test_double_free_of_an_unmapped_big_block_is_reported_not_fatal(exe, tmp_path):
    proc = _run(exe, "bigfree", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "survived"
    dirs = S.snapshot_dirs(tmp_path / "snaps")
    assert len(dirs) == 1 and dirs[0].name.endswith("-1-invalid-free"), dirs


def test_an_ignored_signal_sent_by_kill_stays_ignored(exe, tmp_path):
    assert _plain(exe, "ignfpe", tmp_path).returncode == 0  # the reference behaviour
    proc = _run(exe, "ignfpe", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "survived"


def test_sa_resethand_handler_runs_once_then_the_fault_kills(exe, tmp_path):
    plain = _plain(exe, "resethand", tmp_path)
    assert (plain.returncode, plain.stdout.count("handler")) == (-signal.SIGSEGV, 1)
    proc = _run(exe, "resethand", tmp_path)
    assert proc.returncode == -signal.SIGSEGV, proc.stdout
    assert proc.stdout.count("handler") == 1


def test_a_later_snapshot_has_no_registers_of_an_exited_thread(exe, tmp_path):
    from forensics.core import Core

    proc = _run(exe, "stale", tmp_path)
    assert proc.returncode == 0, proc.stderr
    from forensics.snapshots.snapdir import parse_name

    pid = parse_name(S.snapshot_dirs(tmp_path / "snaps")[0].name)[1]
    first = S.wait_core(tmp_path / "snaps", pid, seq=1)
    second = S.wait_core(tmp_path / "snaps", pid, seq=2)
    with Core(first) as c:
        assert len(c.threads) == 2  # main and the worker, both alive then
    with Core(second) as c:
        assert [t.tid for t in c.threads] == [pid]


def _zero_core(exe, tmp_path):
    proc = _run(exe, "zero", tmp_path)
    assert proc.returncode == 0, proc.stderr
    address = int(proc.stdout.splitlines()[0].split("=")[1], 16)
    from forensics.snapshots.snapdir import parse_name

    pid = parse_name(S.snapshot_dirs(tmp_path / "snaps")[0].name)[1]
    return S.wait_core(tmp_path / "snaps", pid), address


def _cli(*args, tmp_path, timeout=60):
    import sys

    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "forensics", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)


def test_whoowns_finds_a_zero_size_block(exe, tmp_path):
    import json

    core, address = _zero_core(exe, tmp_path)
    done = _cli("whoowns", hex(address), "--core", str(core), "--json", tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["owner"], doc["block"]["start"], doc["block"]["size"]) == ("heap", hex(address), 0)


def test_a_module_path_that_became_a_fifo_does_not_hang(build_victim, tmp_path):
    import shutil

    exe = tmp_path / "rev_fifo"
    shutil.copy(build_victim("rev_cases"), exe)
    core, _ = _zero_core(exe, tmp_path)
    exe.unlink()
    os.mkfifo(exe)  # the path the core's NT_FILE note names
    done = _cli("inspect", str(core), "--json", tmp_path=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr


def test_list_ignores_a_snapshot_dir_of_another_user(exe, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    core, _ = _zero_core(exe, tmp_path)
    ours = core.parent
    planted = ours.parent / "planted-4242-1-crash"
    planted.mkdir(mode=0o700)
    (planted / "info").write_text("pid=4242\nchild=0\nseq=1\nreason=crash\ntime_ms=99999999999999\n")
    (planted / "core").write_bytes(core.read_bytes()[:4096])
    for p in (planted, planted / "info", planted / "core"):
        os.chown(p, 65534, 65534)
    from forensics.snapshots import snapdir

    assert [d.name for d in snapdir.list_dirs(ours.parent)] == [ours.name]
