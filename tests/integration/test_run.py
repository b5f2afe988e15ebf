"""forensics run, for real: the command it starts, its environment, its exit
status, and the snapshot directory it makes.
"""

from __future__ import annotations

import os
import signal
import stat


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


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


# ------------------------------------------------------------ --fail-on --


def test_fail_on_anomaly_exits_1_after_a_double_free(build_victim, run_cli, tmp_path):
    # GIVEN a program that frees a block twice and then exits 0
    exe = build_victim("snap_anomaly")
    # WHEN it runs under forensics run --fail-on anomaly
    result = run_cli("run", "--dir", tmp_path / "snaps", "--fail-on", "anomaly", "--",
                     str(exe), "double-free")
    # THEN it ran to the end, and the status is ASan's 1, with the reason on stderr
    assert "survived" in result.stdout, result.stdout
    assert result.returncode == 1, result.stderr
    pid_line = next(l for l in result.stderr.splitlines() if "--fail-on anomaly" in l)
    assert pid_line.startswith("forensics: libtag found an anomaly in pid "), pid_line
    # AND without --fail-on the status stays the program's own
    plain = run_cli("run", "--dir", tmp_path / "snaps2", "--", str(exe), "double-free")
    assert plain.returncode == 0, plain.stderr


def test_fail_on_anomaly_keeps_a_clean_programs_status(build_victim, run_cli, tmp_path):
    # GIVEN a program with no heap misuse that exits 7
    exe = build_victim("leak_exit")
    result = run_cli("run", "--dir", tmp_path / "snaps", "--fail-on", "anomaly", "--",
                     str(exe), "clean", "7")
    # THEN its own status comes back
    assert result.returncode == 7, result.stderr


def test_fail_on_leak_is_the_leak_check(build_victim, run_cli, tmp_path):
    # GIVEN a program that loses blocks and returns 0
    exe = build_victim("leak_exit")
    # WHEN run with --fail-on anomaly,leak
    result = run_cli("run", "--dir", tmp_path / "snaps", "--fail-on", "anomaly,leak", "--",
                     str(exe), "leak")
    # THEN LeakSanitizer's 23 (no anomaly came first)
    assert result.returncode == 23, result.stderr


def test_fail_on_an_anomaly_and_leaks_is_the_anomalys_1(build_victim, run_cli, tmp_path):
    # GIVEN a program that loses 3 blocks and frees another one twice, then returns 0
    exe = build_victim("leak_exit")
    # WHEN run with --fail-on anomaly,leak
    result = run_cli("run", "--dir", tmp_path / "snaps", "--fail-on", "anomaly,leak", "--",
                     str(exe), "both")
    # THEN the anomaly decides: 1, as ASan's status comes before LSan's 23,
    # and stderr says both what the leak check found and why the status is 1
    assert result.returncode == 1, result.stderr
    pid = int(result.stdout.splitlines()[0].split("=")[1])
    lines = result.stderr.splitlines()
    assert f"SUMMARY: pid {pid}: 300 bytes in 3 blocks definitely lost" in lines, result.stderr
    assert lines[-1] == f"forensics: libtag found an anomaly in pid {pid}: exit 1 (--fail-on anomaly)", (
        result.stderr)


def test_fail_on_anomaly_with_ignore_is_refused(run_cli, tmp_path):
    result = run_cli("run", "--dir", tmp_path / "snaps", "--fail-on", "anomaly",
                     "--on-anomaly", "ignore", "--", "true")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "forensics: error: run: --fail-on anomaly needs --on-anomaly snapshot or abort: "
        "with ignore, an anomaly leaves no trace for forensics to see"), result.stderr


def test_fail_on_an_unknown_kind_is_a_usage_error(run_cli, tmp_path):
    result = run_cli("run", "--dir", tmp_path / "snaps", "--fail-on", "crash", "--", "true")
    assert result.returncode == 2
    assert "'crash': give anomaly, leak or anomaly,leak" in result.stderr, result.stderr
