"""forensics snapshot PID on processes that behave as daemons do: they own
the signals daemons use, rewrite their argv and environment (setproctitle),
and drop to another user.  The victim counts every call of its own handlers:
the tool must never reach one.

GIVEN / WHEN / THEN; every victim and command runs with a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

import forensics_test_support as S

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="dropping to uid 65534 needs root")

ZERO_COUNTS = "counts usr1=0 usr2=0 hup=0 winch=0 pwr=0 urg=0 ttin=0 rt=0"


def _counts(proc) -> str:
    proc.stdin.write("count\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def test_a_worker_that_dropped_to_nobody_hands_its_core_over(build_victim, run_cli, tmp_path):
    # GIVEN a daemon-like victim that owns USR1/USR2/HUP/WINCH/PWR/URG/TTIN,
    # wrote its title over its environment, and became uid 65534
    exe, snaps, proc, pid, fields = _start_daemonlike(build_victim, tmp_path, "drop")
    state = tmp_path / "state"
    try:
        assert fields["uid"] == "65534", fields
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"LIBTAG_DIR" not in environ, f"expected the environment overwritten: {environ!r}"
        # WHEN forensics snapshot PID, with no extra flags
        result = run_cli("snapshot", pid, "--json", "--timeout", "60",
                         env={"XDG_STATE_HOME": str(state)})
        counts = _counts(proc)
    finally:
        out, err = S.finish(proc)
    # THEN exit 0: the core was handed over to the caller (the worker cannot
    # enter root's 0700 directory), with a note that says so
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    mine = state / "forensics" / "snapshots"
    # the first directory on the way that others may not enter (pytest's 0700 base)
    blocked = next(p for p in [*reversed(snaps.parents), snaps] if not p.stat().st_mode & 0o001)
    assert result.stderr.strip() == (
        f"forensics: note: pid {pid} cannot write its own snapshot directory (uid 65534 "
        f"cannot enter {blocked} (permission denied)): its core is handed over to {mine}"), \
        result.stderr
    doc = json.loads(result.stdout)
    assert doc["handed_over"] is True, doc
    core = Path(doc["core"])
    assert core.parent.parent == mine, core
    assert core.stat().st_uid == os.geteuid(), "expected the core to be the caller's"
    assert stat.S_IMODE(core.stat().st_mode) == 0o600
    assert doc["threads_stopped"] == 1, f"expected the churn thread stopped, got {doc}"
    # ... none of the program's handlers ran
    assert counts == ZERO_COUNTS, f"expected no handler called, got {counts!r}"
    assert proc.returncode == 0, f"expected the victim to exit 0, got {proc.returncode}: {err}"
    # ... and whoowns names the marker block and where it was made
    marker = fields["marker"]
    who = run_cli("whoowns", marker, "--core", core, "--json",
                  env={"XDG_STATE_HOME": str(state)})
    assert who.returncode == 0, who.stderr
    ans = json.loads(who.stdout)
    assert ans["owner"] == "heap", ans
    assert ans["block"]["size"] == 4242 and ans["block"]["state"] == "live", ans["block"]
    assert ans["block"]["thread"] == pid, ans["block"]
    functions = [f["function"] for f in ans["block"]["alloc_stack"]]
    assert functions[:2] == ["make_marker", "main"], functions


def test_a_daemon_that_owns_usr2_is_asked_on_libtags_own_signal(build_victim, run_cli, tmp_path):
    # GIVEN the same victim keeping its user: its own LIBTAG_DIR is writable,
    # but it owns SIGUSR2 (LIBTAG_SIGNAL's default) and its environment is gone
    exe, snaps, proc, pid, fields = _start_daemonlike(build_victim, tmp_path)
    state = tmp_path / "state"
    try:
        # WHEN forensics snapshot PID
        result = run_cli("snapshot", pid, "--json", "--timeout", "60",
                         env={"XDG_STATE_HOME": str(state)})
        counts = _counts(proc)
    finally:
        out, err = S.finish(proc)
    # THEN the process wrote its core where its LIBTAG_DIR says, found from its
    # memory, and no handler of the program ran
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    doc = json.loads(result.stdout)
    assert doc["handed_over"] is False, doc
    assert Path(doc["core"]).parent.parent == snaps, doc["core"]
    assert counts == ZERO_COUNTS, f"expected no handler called, got {counts!r}"
    assert (f"libtag: the program installed its own handler for signal {int(signal.SIGUSR2)}"
            in err), err


def test_a_daemon_that_owns_every_trigger_gets_no_signal(build_victim, run_cli, tmp_path):
    # GIVEN the victim owning libtag's request signal (SIGRTMAX-1) as well
    exe, snaps, proc, pid, fields = _start_daemonlike(build_victim, tmp_path, "rt")
    try:
        # WHEN forensics snapshot PID
        result = run_cli("snapshot", pid, "--timeout", "10",
                         env={"XDG_STATE_HOME": str(tmp_path / "state")})
        counts = _counts(proc)
    finally:
        S.finish(proc)
    # THEN exit 2 in one line, nothing sent, nothing written
    assert result.returncode == 2, result.stderr
    rt = int(signal.SIGRTMAX) - 1
    assert result.stderr.strip() == (
        f"forensics: error: pid {pid} has no snapshot trigger: the program installed its own "
        f"handlers on the signals libtag listens on (its request signal {rt} and "
        f"LIBTAG_SIGNAL); nothing was sent.  Restart it with LIBTAG_SIGNAL set to a signal "
        f"it leaves alone (for example RTMIN+3), or pass --signal SIG if you know one "
        f"libtag handles"), result.stderr
    assert counts == ZERO_COUNTS, f"expected no handler called, got {counts!r}"
    assert S.snapshot_dirs(snaps) == []


def _start_daemonlike(build_victim, tmp_path: Path, *args: str):
    """daemonlike with LIBTAG_DIR=<tmp_path>/snaps (root's, 0700): (exe,
    snaps, process, its pid, the fields of its ready line)."""
    exe = build_victim("daemonlike")
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    proc, fields = S.start_fields([str(exe), *args], S.victim_env("auto", snaps))
    return exe, snaps, proc, int(fields["pid"]), fields


def test_a_process_in_its_own_pid_and_mount_namespace(build_victim, run_cli, tmp_path):
    # GIVEN the victim in a new pid and mount namespace (as in a container):
    # it sees itself as pid 1 or 2 and names its snapshot directories so
    probe = subprocess.run(["unshare", "-p", "-m", "-f", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid and mount namespace here: {probe.stderr.strip()}")
    import psutil

    exe = build_victim("daemonlike")
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    env = S.victim_env("auto", snaps)
    preload = env.pop("LD_PRELOAD")  # for the victim only
    proc, fields = S.start_fields(["unshare", "-p", "-m", "-f", "--mount-proc", "env",
                                   f"LD_PRELOAD={preload}", str(exe)], env)
    try:
        inner = int(fields["pid"])
        (host,) = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)
                   if p.exe() == str(exe)]
        assert host != inner, "expected the victim to see another pid than the host's"
        # WHEN forensics snapshot <its host pid>
        result = run_cli("snapshot", host, "--json", "--timeout", "60",
                         env={"XDG_STATE_HOME": str(tmp_path / "state")})
        counts = _counts(proc)
    finally:
        S.finish(proc)
    # THEN the process wrote its core into its LIBTAG_DIR, read through
    # /proc/PID/root, in the directory named with the pid it sees
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    doc = json.loads(result.stdout)
    assert doc["handed_over"] is False and doc["pid"] == host, doc
    assert Path(doc["core"]).parent == snaps / f"{exe.name[:15]}-{inner}-1-on-demand", doc
    assert Path(doc["core"]).stat().st_size == doc["core_bytes"] > 0
    assert counts == ZERO_COUNTS, counts


def test_list_finds_the_snapshots_of_a_process_preloaded_by_hand(build_victim, run_cli,
                                                                 tmp_path):
    # GIVEN a victim preloaded by hand with its own LIBTAG_DIR, which took a
    # snapshot on a `kill -USR2` (forensics never heard of it or its folder)
    exe = build_victim("snap_churn")
    snaps = tmp_path / "by-hand"
    proc, pid = S.start([str(exe), "2"], S.victim_env("self", snaps))
    try:
        os.kill(pid, signal.SIGUSR2)
        S.wait_until(lambda: any((d / "info").exists() for d in S.snapshot_dirs(snaps)), 60,
                     "the victim's own snapshot")
        (snap,) = S.snapshot_dirs(snaps)
        S.wait_until(lambda: "child=" in (snap / "info").read_text(), 60, "its info")
        # WHEN forensics list runs with a catalog that knows nothing, while it runs
        live = run_cli("list", "--json", env={"XDG_STATE_HOME": str(tmp_path / "s1")})
    finally:
        S.finish(proc)
    # THEN the snapshot is found in the running process's folder
    assert live.returncode == 0, live.stderr
    # (other processes under libtag on this machine may add their own)
    mine = [(e["pid"], e["core"]) for e in json.loads(live.stdout)
            if e["core"].startswith(str(snaps))]
    assert mine == [(pid, str(snap / "core"))], live.stdout
    # ... and once the process is gone: not found by a new catalog, until --dir names it
    fresh = {"XDG_STATE_HOME": str(tmp_path / "s2")}
    none = run_cli("list", env=fresh)
    assert none.returncode == 0 and "forensics list --dir DIR" in none.stdout, none.stdout
    named = run_cli("list", "--dir", snaps, "--json", env=fresh)
    assert [e["pid"] for e in json.loads(named.stdout)] == [pid], named.stdout
    again = run_cli("list", "--json", env=fresh)  # remembered
    assert [e["pid"] for e in json.loads(again.stdout)] == [pid], again.stdout
