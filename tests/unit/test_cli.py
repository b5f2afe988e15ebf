"""The forensics command line, in-process: lib-path, argument errors, and
what `run` refuses before it starts anything.

Calls forensics.cli.main.main(argv) with stdout and stderr captured and the
environment patched - the code the console script runs, without a process;
tests/integration/test_run.py runs `forensics run` for real.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from forensics.cli.main import main


@pytest.fixture
def run_cli(capsys, monkeypatch, tmp_path):
    """cli(*args, env=None) -> CompletedProcess of main(args), in this process."""
    def cli(*args, env=None) -> subprocess.CompletedProcess:
        monkeypatch.chdir(tmp_path)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse: --help, usage errors
            code = e.code if isinstance(e.code, int) else 2
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["forensics", *map(str, args)], code, out.out, out.err)

    return cli


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


# ------------------------------------------------- run: refused at once --

def test_run_without_a_command_exits_2_with_one_line(run_cli, tmp_path):
    result = run_cli("run", "--dir", tmp_path / "snaps")
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    lines = stderr_lines(result)
    assert len(lines) == 1, f"expected exactly 1 line on stderr, got {lines!r}"
    assert lines[0].startswith("forensics: error: run: no command"), (
        f"expected 'forensics: error: run: no command', got {lines[0]!r}")


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


# ----------------------------------------------- what the gdb commands share --


def test_the_verbs_gdb_form_takes_an_expression_and_no_core():
    # GIVEN the parsers the gdb tag commands build from the verbs' add_arguments
    import argparse

    from forensics.cli import inspect, whoowns

    who = argparse.ArgumentParser(prog="tag whoowns")
    whoowns.add_arguments(who, gdb=True)
    insp = argparse.ArgumentParser(prog="tag inspect")
    inspect.add_arguments(insp, gdb=True)
    # THEN an expression keeps its words, options may come after it, and
    # inspect needs no CORE but keeps the verb's --top check
    args = who.parse_args(["(char", "*)s", "+", "4", "--json"])
    assert (args.address, args.json) == (["(char", "*)s", "+", "4"], True)
    assert not hasattr(args, "core") and not hasattr(args, "pid")
    args = insp.parse_args(["--top", "3", "--leaks"])
    assert (args.top, args.leaks, args.json) == (3, True, False)
    with pytest.raises(SystemExit):
        insp.parse_args(["--top", "0"])


def test_failure_words_every_kind_of_failure_in_one_line():
    from forensics.cli.main import failure
    from forensics.errors import NotFoundError, UsageError

    assert failure(UsageError("bad\nthing"), rerun="x") == ("bad thing", 2, False)
    assert failure(NotFoundError("no block"), rerun="x") == ("no block", 1, False)
    assert failure(KeyboardInterrupt(), rerun="x") == ("interrupted", 130, False)
    assert failure(ValueError("oops"), rerun="run 'tag inspect -v ...'") == (
        "internal error: ValueError: oops (run 'tag inspect -v ...' for the traceback and report it)", 3, True)
