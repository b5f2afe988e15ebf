"""The forensics command line: lib-path, run, and argument errors.

Runs the installed ``forensics`` as a real process (``python -m forensics``
from a temporary cwd); needs no compiler and no gdb.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


# ---------------------------------------------------------------- lib-path --

def test_lib_path_prints_the_installed_libtag(run_cli):
    # WHEN
    result = run_cli("lib-path")
    # THEN
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    printed = result.stdout.strip()
    assert printed.endswith("libtag.so"), f"expected a path ending in libtag.so, got {printed!r}"
    assert Path(printed).is_absolute(), f"expected an absolute path, got {printed!r}"
    assert Path(printed).is_file(), f"expected {printed} to be an existing file"
    assert result.stderr == "", f"expected nothing on stderr, got {result.stderr!r}"


def test_lib_path_honours_FORENSICS_LIBTAG(run_cli, libtag_so, tmp_path):
    # GIVEN a libtag.so somewhere else
    other = tmp_path / "elsewhere" / "libtag.so"
    other.parent.mkdir()
    other.write_bytes(libtag_so.read_bytes())
    # WHEN
    result = run_cli("lib-path", env={"FORENSICS_LIBTAG": str(other)})
    # THEN
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    assert result.stdout.strip() == str(other), f"expected {other}, got {result.stdout!r}"


def test_expected_error_is_one_line_without_traceback(run_cli, tmp_path):
    # GIVEN FORENSICS_LIBTAG naming a file that does not exist
    env = {"FORENSICS_LIBTAG": str(tmp_path / "missing.so")}
    # WHEN
    result = run_cli("lib-path", env=env)
    # THEN
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    lines = stderr_lines(result)
    assert len(lines) == 1, f"expected exactly 1 line on stderr, got {lines!r}"
    assert lines[0].startswith("forensics: error: "), f"expected 'forensics: error: ', got {lines[0]!r}"
    assert "missing.so" in lines[0], f"expected the bad path in the message, got {lines[0]!r}"
    assert result.stdout == "", f"expected nothing on stdout, got {result.stdout!r}"


def test_verbose_shows_the_traceback(run_cli, tmp_path):
    env = {"FORENSICS_LIBTAG": str(tmp_path / "missing.so")}
    result = run_cli("-v", "lib-path", env=env)
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    assert "Traceback" in result.stderr, f"expected a traceback with -v, got {result.stderr!r}"
    assert stderr_lines(result)[-1].startswith("forensics: error: "), (
        f"expected the error line last, got {result.stderr!r}")


# ---------------------------------------------------------- usage errors --

def test_unknown_verb_exits_2_with_one_error_line(run_cli):
    result = run_cli("frobnicate")
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    lines = stderr_lines(result)
    assert len(lines) == 1, f"expected exactly 1 line on stderr, got {lines!r}"
    assert lines[0].startswith("forensics: error: "), f"expected 'forensics: error: ', got {lines[0]!r}"
    assert "frobnicate" in lines[0], f"expected the bad verb named, got {lines[0]!r}"


def test_no_verb_exits_2(run_cli):
    result = run_cli()
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    assert stderr_lines(result)[0].startswith("forensics: error: "), (
        f"expected 'forensics: error: ', got {result.stderr!r}")


def test_bad_address_exits_2_with_one_line(run_cli):
    result = run_cli("whoowns", "0xnothex")
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    lines = stderr_lines(result)
    assert len(lines) == 1, f"expected exactly 1 line on stderr, got {lines!r}"
    assert "0xnothex" in lines[0], f"expected the bad address named, got {lines[0]!r}"


def test_whoowns_core_and_pid_are_exclusive(run_cli):
    result = run_cli("whoowns", "0x10", "--core", "c", "--pid", "1")
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    assert "not allowed with" in result.stderr, f"expected a conflict message, got {result.stderr!r}"


def test_help_lists_every_verb(run_cli):
    result = run_cli("--help")
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}"
    for verb in ("run", "snapshot", "inspect", "whoowns", "diff", "list", "report", "lib-path"):
        assert verb in result.stdout, f"expected verb {verb!r} in --help, got {result.stdout!r}"


# --------------------------------------------------------------------- run --

def test_run_without_a_command_exits_2_with_one_line(run_cli, tmp_path):
    result = run_cli("run", "--dir", tmp_path / "snaps")
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    lines = stderr_lines(result)
    assert len(lines) == 1, f"expected exactly 1 line on stderr, got {lines!r}"
    assert lines[0].startswith("forensics: error: run: no command"), (
        f"expected 'forensics: error: run: no command', got {lines[0]!r}")


def test_run_of_a_missing_command_exits_127(run_cli, tmp_path):
    result = run_cli("run", "--dir", tmp_path / "snaps", "--", "/nonexistent")
    assert result.returncode == 127, f"expected exit 127, got {result.returncode}"
    lines = stderr_lines(result)
    assert len(lines) == 1, f"expected exactly 1 line on stderr, got {lines!r}"
    assert lines[0] == "forensics: error: run: command not found: /nonexistent", (
        f"expected the not-found line, got {lines[0]!r}")


def test_run_returns_the_command_status(run_cli, tmp_path):
    result = run_cli("run", "--dir", tmp_path / "snaps", "--", "sh", "-c", "exit 7")
    assert result.returncode == 7, f"expected exit 7, got {result.returncode}: {result.stderr}"


def test_run_maps_a_signal_death_to_128_plus_signal(run_cli, tmp_path):
    result = run_cli("run", "--dir", tmp_path / "snaps", "--", "sh", "-c", "kill -TERM $$")
    expected = 128 + signal.SIGTERM
    assert result.returncode == expected, f"expected exit {expected}, got {result.returncode}"


def test_run_preloads_libtag_first_and_keeps_existing_preload(run_cli, libtag_so, tmp_path):
    # GIVEN an LD_PRELOAD already set (ld.so warns about the missing file and runs on)
    env = {"LD_PRELOAD": "/nonexistent/libother.so"}
    # WHEN
    result = run_cli("run", "--dir", tmp_path / "snaps", "--", "sh", "-c", "echo $LD_PRELOAD",
                     env=env)
    # THEN
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    preload = result.stdout.split()
    assert preload == [str(libtag_so), "/nonexistent/libother.so"], (
        f"expected [{libtag_so}, /nonexistent/libother.so], got {preload!r}")
    assert "libtag.so" in preload[0], f"expected libtag.so first, got {preload!r}"


def test_run_sets_libtag_dir_and_on_anomaly(run_cli, tmp_path):
    snaps = tmp_path / "snaps"
    result = run_cli("run", "--dir", snaps, "--on-anomaly", "abort", "--",
                     "sh", "-c", 'echo "$LIBTAG_DIR|$LIBTAG_ON_ANOMALY"')
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    assert result.stdout.strip() == f"{snaps}|abort", (
        f"expected '{snaps}|abort', got {result.stdout!r}")


def test_run_defaults_on_anomaly_to_snapshot(run_cli, tmp_path):
    result = run_cli("run", "--dir", tmp_path / "snaps", "--", "sh", "-c", "echo $LIBTAG_ON_ANOMALY")
    assert result.stdout.strip() == "snapshot", f"expected 'snapshot', got {result.stdout!r}"


def test_run_creates_the_dir_0700(run_cli, tmp_path):
    # GIVEN a dir two levels below an existing folder
    snaps = tmp_path / "a" / "snaps"
    # WHEN
    result = run_cli("run", "--dir", snaps, "--", "true")
    # THEN
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    for d in (snaps, snaps.parent):
        mode = stat.S_IMODE(os.lstat(d).st_mode)
        assert mode == 0o700, f"expected {d} mode 0o700, got {oct(mode)}"


def test_run_defaults_to_the_xdg_state_dir(run_cli, tmp_path):
    state = tmp_path / "state"
    result = run_cli("run", "--", "sh", "-c", "echo $LIBTAG_DIR",
                     env={"XDG_STATE_HOME": str(state)})
    expected = state / "forensics" / "snapshots"
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    assert result.stdout.strip() == str(expected), f"expected {expected}, got {result.stdout!r}"
    mode = stat.S_IMODE(os.lstat(expected).st_mode)
    assert mode == 0o700, f"expected {expected} mode 0o700, got {oct(mode)}"


def test_run_refuses_a_symlinked_dir_and_creates_nothing(run_cli, tmp_path):
    # GIVEN --dir is a symlink to a folder that does not exist yet
    target = tmp_path / "target"
    link = tmp_path / "link"
    link.symlink_to(target)
    marker = tmp_path / "ran"
    # WHEN
    result = run_cli("run", "--dir", link, "--", "touch", marker)
    # THEN
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    lines = stderr_lines(result)
    assert len(lines) == 1, f"expected exactly 1 line on stderr, got {lines!r}"
    assert "symlink" in lines[0], f"expected 'symlink' in the message, got {lines[0]!r}"
    assert not target.exists(), f"expected {target} not to be created"
    assert not marker.exists(), "expected the command not to run"


def test_run_refuses_a_dir_owned_by_someone_else(run_cli, tmp_path):
    # GIVEN a directory owned by another uid (root can make one; others use /)
    if os.geteuid() == 0:
        other = tmp_path / "theirs"
        other.mkdir(mode=0o700)
        os.chown(other, 65534, 65534)
    else:
        other = Path("/")
    # WHEN
    result = run_cli("run", "--dir", other, "--", "true")
    # THEN
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    assert "belongs to uid" in result.stderr, f"expected an ownership message, got {result.stderr!r}"


def test_run_refuses_a_dir_that_is_a_file(run_cli, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    result = run_cli("run", "--dir", f, "--", "true")
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    assert "not a directory" in result.stderr, f"expected 'not a directory', got {result.stderr!r}"
