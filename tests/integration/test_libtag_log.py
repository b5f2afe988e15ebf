"""libtag's own lines (LIBTAG_LOG): where they go when the program does what
real programs do to fd 2, and when they must go nowhere near it.

GIVEN a program (tests/victims/log_fds.c) that closes or reuses its
descriptors and then makes libtag report a double free
WHEN LIBTAG_LOG is stderr (the default), a PATH, or off
THEN the line reaches the stderr the program was started with, or PATH.<pid>
(0600, never through a symlink), and never a file the program opened.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess

import pytest

from forensics import libpath


@pytest.fixture(scope="module")
def victim(build_victim):
    return build_victim("log_fds")


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_PRELOAD"] = str(libpath.lib_path())
    env["LIBTAG_ON_ANOMALY"] = "ignore"
    for k in ("LIBTAG_LOG", "LIBTAG_QUIET", "LIBTAG_STATS"):
        env.pop(k, None)
    env.update(extra)
    return env


def freed(stdout: str) -> list[tuple[str, int]]:
    """(address, pid) of every double free the victim made."""
    return [(a, int(p)) for a, p in re.findall(r"^freed twice (0x[0-9a-f]+) pid=(\d+)$", stdout, re.M)]


def expected_line(addr: str, pid: int) -> str:
    return f"libtag: double-free of {addr} in thread {pid} (LIBTAG_ON_ANOMALY=ignore)"


def run(argv, env, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True,
                          timeout=60, **kw)


def test_stats_line_survives_coreutils_closing_fd_2(tmp_path):
    # GIVEN cat, which closes stdout and stderr in an atexit handler
    proc = subprocess.Popen(["cat", "/dev/null"], env=env_with(LIBTAG_STATS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    # THEN libtag's exit line still reaches the stderr cat was started with
    assert proc.returncode == 0, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"libtag: stats pid={proc.pid} allocs="), lines


@pytest.mark.parametrize("mode", [
    "reuse-2",    # close(2), then a file of its own gets fd 2
    "closefrom",  # close every fd from 3 (libtag's duplicate too) and reuse each number
])
def test_a_program_that_reuses_descriptors_does_not_get_the_line_in_its_file(tmp_path, victim, mode):
    own = tmp_path / "own.txt"
    result = run([victim, mode, own], env_with())
    assert result.returncode == 0, result.stderr
    ((addr, pid),) = freed(result.stdout)
    # THEN the line reaches the stderr the program was started with (libtag's
    # duplicate, or fd 2 when the duplicate was closed but fd 2 was not)
    assert own.read_text() == "", "libtag wrote into the program's own file"
    assert result.stderr.splitlines() == [expected_line(addr, pid)]


def test_log_path_writes_per_pid_0600_and_nothing_to_stderr(tmp_path, victim):
    log = tmp_path / "tag.log"
    result = run([victim, "fork"], env_with(LIBTAG_LOG=str(log), LIBTAG_STATS="1"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "with LIBTAG_LOG=PATH nothing goes to the program's stderr"
    (child_addr, child), (addr, pid) = freed(result.stdout)
    files = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("tag.log"))
    assert files == sorted([f"tag.log.{pid}", f"tag.log.{child}"]), files
    for p, a in ((pid, addr), (child, child_addr)):
        path = tmp_path / f"tag.log.{p}"
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        lines = path.read_text().splitlines()
        assert lines[0] == expected_line(a, p), lines
        assert lines[1].startswith("libtag: stats pid="), lines


def test_log_path_never_follows_a_symlink(tmp_path, victim):
    # GIVEN the process's log file name is a symlink to a file of the user's
    target = tmp_path / "precious.txt"
    target.write_text("keep\n")
    log = tmp_path / "tag.log"
    proc = subprocess.Popen([str(victim), "wait"], env=env_with(LIBTAG_LOG=str(log)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    pid = int(proc.stdout.readline().split("=")[1])
    os.symlink(target, tmp_path / f"tag.log.{pid}")
    out, err = proc.communicate("go\n", timeout=60)
    # THEN the line is dropped, not written through the link nor to stderr
    assert proc.returncode == 0, err
    assert freed(out) and err == ""
    assert target.read_text() == "keep\n"
    assert os.path.islink(tmp_path / f"tag.log.{pid}")


def test_log_off_is_silent_but_a_bad_option_still_says_why(tmp_path, victim):
    result = run([victim, "reuse-2", tmp_path / "own.txt"], env_with(LIBTAG_LOG="off", LIBTAG_STATS="1"))
    assert (result.returncode, result.stderr) == (0, "")
    bad = run([victim, "wait"], env_with(LIBTAG_LOG="off", LIBTAG_SIGNAL="bogus"), input="")
    assert bad.returncode == 2
    assert bad.stderr.startswith("libtag: error: LIBTAG_SIGNAL=bogus: expected a signal"), bad.stderr


def test_a_relative_log_path_is_refused(tmp_path, victim):
    result = run([victim, "wait"], env_with(LIBTAG_LOG="tag.log"), input="")
    assert result.returncode == 2
    assert result.stderr == ("libtag: error: LIBTAG_LOG=tag.log: expected stderr, off, or an "
                             "absolute path shorter than 496 bytes\n")


def test_the_snapshot_line_names_the_real_directory_without_xdg_state_home(tmp_path, victim):
    # GIVEN no LIBTAG_DIR and no XDG_STATE_HOME: snapshots go under $HOME
    env = env_with(HOME=str(tmp_path), LIBTAG_ON_ANOMALY="snapshot", LIBTAG_CORE="self")
    env.pop("XDG_STATE_HOME", None)
    env.pop("LIBTAG_DIR", None)
    result = run([victim, "reuse-2", tmp_path / "own.txt"], env)
    assert result.returncode == 0, result.stderr
    ((addr, pid),) = freed(result.stdout)
    root = tmp_path / ".local" / "state" / "forensics" / "snapshots"
    comm = victim.name[:15]  # the kernel's comm: the file name, 15 bytes at most
    assert result.stderr.splitlines()[1] == (
        f"libtag: snapshot 1 (double-free) -> {root}/{comm}-{pid}-1-double-free"), result.stderr
    assert "$XDG_STATE_HOME" not in result.stderr
