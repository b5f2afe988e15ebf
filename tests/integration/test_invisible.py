"""libtag is invisible in the program's descriptor table.

libtag holds no descriptor while the program keeps its stderr: its lines go
to fd 2 itself, checked to still be the file it was at start (log.c).  Only
when the program closes or replaces fd 2 does libtag keep a duplicate
(O_CLOEXEC, 200 or above), so its lines still reach that stderr
(test_libtag_log.py covers those).

GIVEN programs that list their descriptors, close them all and reuse every
number libtag ever used, and CPython's own tests of descriptors, signals and
subprocesses
WHEN they run under libtag and make it report an anomaly and snapshot
THEN they see exactly the descriptors they see without libtag, libtag's line
and snapshot still arrive, and no file of the program's holds libtag's bytes.
"""
from __future__ import annotations

import os
import signal
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from forensics import libpath
import forensics_test_support as S


def freed(stdout: str) -> list[tuple[str, int]]:
    return [(a, int(p)) for a, p in re.findall(r"^freed twice (0x[0-9a-f]+) pid=(\d+)$", stdout, re.M)]


def fd_lines(stdout: str) -> list[str]:
    return [l for l in stdout.splitlines() if l.startswith(("start ", "after "))]


def test_descriptor_table_is_the_same_with_and_without_libtag(build_victim, run_victim, tmp_path):
    exe = build_victim("fd_table", instrument=False)
    bare = run_victim(exe, "list", preload=False, env={"FD_TABLE_BARE": "1"})
    assert bare.returncode == 0, bare.stderr
    # GIVEN the program's own table without libtag: stdin, stdout, stderr
    assert fd_lines(bare.stdout) == ["start 0,1,2", "after 0,1,2"]
    # WHEN it runs under libtag, which reports a double free and snapshots it
    snaps = tmp_path / "snaps"
    proc = run_victim(exe, "list", snap_dir=snaps, on_anomaly="snapshot",
                      env={"LIBTAG_CORE": "self"})
    assert proc.returncode == 0, proc.stderr
    # THEN the table it sees at start and after the anomaly is the same
    assert fd_lines(proc.stdout) == ["start 0,1,2", "after 0,1,2"]
    ((addr, pid),) = freed(proc.stdout)
    assert f"libtag: double-free of {addr} in thread {pid}" in proc.stderr
    assert len([p for p in snaps.iterdir() if p.name.endswith("-double-free")]) == 1


def test_closefrom_and_reused_numbers_keep_libtag_working_and_out_of_the_file(
        build_victim, run_victim, tmp_path):
    exe = build_victim("fd_table", instrument=False)
    own = tmp_path / "own.txt"
    snaps = tmp_path / "snaps"
    # GIVEN a program that closes every descriptor from 3 up and puts a file
    # of its own at every number from 3 to 255 (libtag's old 200 among them)
    proc = run_victim(exe, "closefrom", own, snap_dir=snaps, on_anomaly="snapshot",
                      env={"LIBTAG_CORE": "self"})
    assert proc.returncode == 0, proc.stderr
    ((addr, pid),) = freed(proc.stdout)
    # THEN libtag's line reaches the program's stderr, the snapshot is taken,
    # the program's file holds none of libtag's bytes, and its table is its own
    assert proc.stderr.splitlines()[0] == (
        f"libtag: double-free of {addr} in thread {pid} (LIBTAG_ON_ANOMALY=snapshot)")
    (snap,) = [p for p in snaps.iterdir() if p.name.endswith("-double-free")]
    assert (snap / "core").is_file() or any(snap.glob("core*")), sorted(snap.iterdir())
    assert own.read_bytes() == b""
    assert fd_lines(proc.stdout) == ["after 0,1,2,3"]


# test_signal runs on its own (test_cpython_signal_tests_...), bare then under
# libtag: its timer and stress tests measure intervals.
PYTHON_TESTS = ["test_subprocess", "test_os", "test_faulthandler"]
TESTSUITE = Path(f"/usr/lib/python3.{sys.version_info.minor}/test/test_subprocess.py")


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed / failed / error / skipped, from regrtest's JUnit XML."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")  # regrtest's: the full dotted test id
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = child.tag
        out[name] = kind
    return out


@pytest.mark.skipif(not TESTSUITE.is_file(),
                    reason=f"{TESTSUITE} missing: apt-get install libpython3.11-testsuite "
                           "(.ci/run installs it)")
def test_cpython_descriptor_tests_pass_as_without_libtag(tmp_path):
    # GIVEN Debian's python3 and its regression tests of subprocesses (pass_fds,
    # close_fds), os and faulthandler, under PYTHONMALLOC=malloc so
    # every object goes through libtag
    # WHEN they run bare and under libtag (at once: two CPUs)
    bare, under = _compare(tmp_path, PYTHON_TESTS, at_once=True)
    # THEN every test has the same outcome (test_pass_fds_redirected failed
    # when libtag kept a duplicate of stderr at fd 200)
    assert len(bare) > 400, len(bare)
    assert under["test.test_subprocess.POSIXProcessTestCase.test_pass_fds_redirected"] == "passed"


@pytest.mark.skipif(not TESTSUITE.is_file(),
                    reason=f"{TESTSUITE} missing: apt-get install libpython3.11-testsuite "
                           "(.ci/run installs it)")
def test_cpython_signal_tests_pass_as_without_libtag(tmp_path):
    # GIVEN CPython's signal tests (handlers, sigwait, pthread_kill, timers,
    # real-time signals, a stress test), which see every signal libtag holds
    # WHEN they run bare, then under libtag (one after the other: the timer
    # tests measure intervals, and a shared CPU alone failed them)
    bare, under = _compare(tmp_path, ["test_signal"], at_once=False)
    # THEN every test has the same outcome
    assert len(bare) > 50, len(bare)
    for test in ("PendingSignalsTests.test_pthread_sigmask_valid_signals",
                 "PendingSignalsTests.test_sigwaitinfo", "StressTest.test_stress_modifying_handlers"):
        assert under[f"test.test_signal.{test}"] == "passed", test


def _default_sigint() -> None:
    """SIGINT at its default in the child: a job a shell starts in the
    background (CI's) inherits it ignored, and then CPython's KeyboardInterrupt
    tests fail bare (test_sigint, test_pidfd_send_signal,
    test_keyboard_interrupt_exit_code did, in CI)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _compare(tmp_path: Path, tests: list[str], at_once: bool) -> tuple[dict, dict]:
    """Run CPython's regression tests bare and under libtag, with
    PYTHONMALLOC=malloc so every object goes through libtag; both runs must
    succeed and give each test the same outcome.  Returns the outcomes."""
    def start(name: str, preload: bool) -> tuple[subprocess.Popen, Path]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIBTAG_")}
        env["PYTHONMALLOC"] = "malloc"
        if preload:
            env["LD_PRELOAD"] = str(libpath.lib_path())
        else:
            env.pop("LD_PRELOAD", None)
        junit = tmp_path / f"{name}.xml"
        work = tmp_path / name
        work.mkdir()
        proc = subprocess.Popen(["/usr/bin/python3", "-m", "test", "--junit-xml", str(junit),
                                 *tests], env=env, cwd=work, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, preexec_fn=_default_sigint)
        return proc, junit

    results = {}
    if at_once:
        runs = {name: start(name, name == "libtag") for name in ("bare", "libtag")}
        for name, (proc, junit) in runs.items():
            out, _ = proc.communicate(timeout=900)
            results[name] = (proc.returncode, out, junit)
    else:
        for name in ("bare", "libtag"):
            proc, junit = start(name, name == "libtag")
            out, _ = proc.communicate(timeout=900)
            results[name] = (proc.returncode, out, junit)
    found = {}
    for name, (code, out, junit) in results.items():
        assert code == 0, (name, out[-3000:])
        found[name] = outcomes(junit)
    bare, under = found["bare"], found["libtag"]
    differ = {k: (bare.get(k), under.get(k)) for k in set(bare) | set(under)
              if bare.get(k) != under.get(k)}
    assert differ == {}
    return bare, under


def test_an_ignored_signal_sent_by_kill_stays_ignored(build_victim, tmp_path):
    # GIVEN rev_cases ignfpe: SIGFPE ignored, then kill(getpid(), SIGFPE)
    exe = build_victim("rev_cases")
    assert S.run_case(exe, "ignfpe", tmp_path, libtag=False).returncode == 0  # the reference
    # THEN under libtag it survives too (the crash hook honours SIG_IGN)
    proc = S.run_case(exe, "ignfpe", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "survived"


def test_sa_resethand_handler_runs_once_then_the_fault_kills(build_victim, tmp_path):
    # GIVEN rev_cases resethand: a SIGSEGV handler with SA_RESETHAND returns
    exe = build_victim("rev_cases")
    plain = S.run_case(exe, "resethand", tmp_path, libtag=False)
    assert (plain.returncode, plain.stdout.count("handler")) == (-signal.SIGSEGV, 1)
    # THEN under libtag the handler runs once and the repeated fault kills
    proc = S.run_case(exe, "resethand", tmp_path)
    assert proc.returncode == -signal.SIGSEGV, proc.stdout
    assert proc.stdout.count("handler") == 1
