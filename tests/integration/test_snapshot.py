"""forensics snapshot PID and forensics list, against real multi-threaded
victims under the real libtag, on both core paths (kernel and self-written).

GIVEN / WHEN / THEN; every victim and command runs with a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest


import forensics_test_support as S
THREADS = 4


@pytest.fixture
def state(tmp_path):
    """XDG_STATE_HOME for the CLI: the catalog goes to a temporary folder."""
    d = tmp_path / "state"
    d.mkdir()
    return d


def cli_env(state: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(state)}


def error_line(result) -> str:
    """The one error line on stderr (notes aside: e.g. a foreign mount namespace)."""
    lines = [ln for ln in result.stderr.splitlines()
             if ln.strip() and not ln.startswith("forensics: note: ")]
    assert len(lines) == 1, f"expected exactly 1 error line on stderr, got {lines!r}"
    return lines[0]


# ------------------------------------------------------------ on demand --

@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_snapshot_of_a_running_multithreaded_victim(core_path, build_victim, run_cli, state,
                                                    tmp_path):
    # GIVEN snap_churn with 4 threads churning allocations, snapshots to snaps/
    exe = build_victim("snap_churn")
    snaps = tmp_path / "snaps"
    proc, pid = S.start([str(exe), str(THREADS)], S.victim_env(core_path, snaps))
    try:
        # WHEN forensics snapshot PID --json, while it runs
        result = run_cli("snapshot", pid, "--json", "--timeout", "60", env=cli_env(state))
        still_running = proc.poll()
    finally:
        out, err = S.finish(proc)

    # THEN one JSON document with the fields and types of docs/json.md
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    doc = json.loads(result.stdout)
    assert {"pid", "core", "reason", "pause_ms", "core_bytes"} <= set(doc), f"fields: {doc}"
    assert type(doc["pid"]) is int and doc["pid"] == pid, f"expected pid {pid}, got {doc['pid']!r}"
    assert type(doc["core"]) is str and os.path.isabs(doc["core"]), f"core: {doc['core']!r}"
    assert doc["reason"] == "on-demand", f"expected reason 'on-demand', got {doc['reason']!r}"
    assert type(doc["pause_ms"]) is float and doc["pause_ms"] > 0.0, f"pause_ms: {doc['pause_ms']!r}"
    assert type(doc["core_bytes"]) is int, f"core_bytes: {doc['core_bytes']!r}"
    core = Path(doc["core"])
    assert core.is_file(), f"expected the core {core} to exist"
    assert doc["core_bytes"] == core.stat().st_size, (
        f"expected core_bytes {core.stat().st_size}, got {doc['core_bytes']}")
    # ... in <snaps>/snap_churn-<pid>-1-on-demand/, 0700, the core 0600
    expected_dir = snaps / f"{exe.name[:15]}-{pid}-1-on-demand"  # comm is 15 chars at most
    assert core.parent == expected_dir, f"expected the core in {expected_dir}, got {core}"
    assert core.parent.parent == snaps, f"expected the snapshot dir in {snaps}, got {core.parent}"
    assert stat.S_IMODE(core.parent.stat().st_mode) == 0o700, (
        f"expected dir mode 0o700, got {oct(stat.S_IMODE(core.parent.stat().st_mode))}")
    assert stat.S_IMODE(core.stat().st_mode) == 0o600, (
        f"expected core mode 0o600, got {oct(stat.S_IMODE(core.stat().st_mode))}")
    # ... the core's control block says on-demand snapshot 1 of this pid
    ctl = S.read_control(core)
    assert (ctl.reason, ctl.snapshot_seq, ctl.pid) == (S.REASON_ON_DEMAND, 1, pid), (
        f"expected reason 1, seq 1, pid {pid}; got {ctl}")
    # ... and the victim ran on and computed the right checksums
    assert still_running is None, f"expected the victim still running, it exited {still_running}"
    assert proc.returncode == 0, f"expected the victim to exit 0, got {proc.returncode}: {err}"
    S.check_churn_output(out, THREADS)

    # THEN gdb opens the core and the backtrace names a victim function
    if not S.have_gdb():
        pytest.skip("gdb is not installed")
    gdb = S.gdb_bt(exe, core, "thread apply all bt")
    assert gdb.returncode == 0, f"expected gdb exit 0, got {gdb.returncode}: {gdb.stderr}"
    assert " main (" in gdb.stdout, f"expected main in the backtrace, got {gdb.stdout}"
    assert "snap_churn.c" in gdb.stdout, f"expected snap_churn.c in the backtrace, got {gdb.stdout}"


def test_snapshot_is_recorded_in_the_catalog_and_listed(build_victim, run_cli, state, tmp_path):
    # GIVEN a churn victim and two snapshots of it
    exe = build_victim("snap_churn")
    snaps = tmp_path / "snaps"
    proc, pid = S.start([str(exe), "2"], S.victim_env("self", snaps))
    try:
        first = run_cli("snapshot", pid, "--json", env=cli_env(state))
        second = run_cli("snapshot", pid, env=cli_env(state))
    finally:
        out, _ = S.finish(proc)
    assert first.returncode == 0, f"expected exit 0, got {first.returncode}: {first.stderr}"
    assert second.returncode == 0, f"expected exit 0, got {second.returncode}: {second.stderr}"
    core1 = json.loads(first.stdout)["core"]
    core2 = str(snaps / Path(core1).parent.name.replace(f"-{pid}-1-", f"-{pid}-2-") / "core")
    # ... the human output names the core and the next command
    assert second.stdout.splitlines()[0] == core2, f"expected {core2} first, got {second.stdout!r}"
    assert f"forensics inspect {core2}" in second.stdout, f"expected the next command: {second.stdout!r}"
    # ... the catalog database is private
    db = state / "forensics" / "catalog.sqlite"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600, "expected catalog mode 0o600"
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700, "expected catalog dir mode 0o700"

    # WHEN forensics list --json
    listed = run_cli("list", "--json", env=cli_env(state))
    # THEN both snapshots, oldest first, with pid, exe, reason and sizes
    assert listed.returncode == 0, f"expected exit 0, got {listed.returncode}: {listed.stderr}"
    rows = json.loads(listed.stdout)
    assert [r["core"] for r in rows] == [core1, core2], f"expected [{core1}, {core2}], got {rows}"
    for r in rows:
        assert r["pid"] == pid, f"expected pid {pid}, got {r['pid']}"
        assert r["exe"] == str(exe), f"expected exe {exe}, got {r['exe']}"
        assert r["reason"] == "on-demand", f"expected on-demand, got {r['reason']}"
        assert r["core_bytes"] == os.path.getsize(r["core"]), f"core_bytes of {r}"
    # WHEN forensics list (human)
    human = run_cli("list", env=cli_env(state))
    assert human.returncode == 0, f"expected exit 0, got {human.returncode}: {human.stderr}"
    assert str(pid) in human.stdout, f"expected pid {pid} in the table, got {human.stdout!r}"


def test_list_finds_snapshots_taken_without_forensics(build_victim, run_cli, state, tmp_path):
    # GIVEN a victim whose snapshots go to the default XDG dir, signalled by hand
    exe = build_victim("snap_churn")
    env = S.victim_env("self", "unused")
    del env["LIBTAG_DIR"]
    env["XDG_STATE_HOME"] = str(state)
    proc, pid = S.start([str(exe), "1"], env)
    try:
        os.kill(pid, signal.SIGUSR2)
        default = state / "forensics" / "snapshots"
        S.wait_until(lambda: any(default.glob(f"*-{pid}-1-on-demand/info")), 60, "the info file")
        from forensics.snapshots import snapdir
        snap = snapdir.wait_complete(next(default.glob(f"*-{pid}-1-on-demand")), 60)
    finally:
        S.finish(proc)
    # WHEN forensics list --json
    listed = run_cli("list", "--json", env=cli_env(state))
    # THEN the snapshot is in the catalog
    assert listed.returncode == 0, f"expected exit 0, got {listed.returncode}: {listed.stderr}"
    rows = json.loads(listed.stdout)
    assert [(r["pid"], r["reason"], r["core"]) for r in rows] == [
        (pid, "on-demand", str(snap.path / "core"))], f"got {rows}"


# --------------------------------------------------------------- errors --

def test_snapshot_of_a_missing_pid(run_cli, state):
    # GIVEN a pid that is not in use (above the kernel's pid_max)
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    result = run_cli("snapshot", pid, env=cli_env(state))
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}"
    assert error_line(result) == f"forensics: error: no process with pid {pid}", result.stderr
    assert result.stdout == "", f"expected nothing on stdout, got {result.stdout!r}"


def test_snapshot_of_a_process_without_libtag(run_cli, state):
    # GIVEN sleep, not preloaded: it is forked by ptrace (test_ptrace_snapshot.py
    # checks that path whole), its core goes to the caller's snapshot directory
    proc = subprocess.Popen(["sleep", "30"])
    try:
        result = run_cli("snapshot", proc.pid, "--json", env=cli_env(state))
        assert proc.poll() is None, "sleep must run on"
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["method"] == "ptrace" and doc["threads_stopped"] == 1, doc
    assert doc["dir"] == str(state / "forensics" / "snapshots" / f"sleep-{proc.pid}-1-on-demand")


def test_snapshot_of_a_statically_linked_victim(build_victim, run_cli, state, tmp_path):
    # GIVEN snap_churn with libtag.a linked in (no LD_PRELOAD, no libtag.so mapped)
    exe = build_victim("snap_churn", static_libtag=True)
    env = S.victim_env("self", tmp_path / "snaps")
    del env["LD_PRELOAD"]
    proc, pid = S.start([str(exe), "2"], env)
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
        result = run_cli("snapshot", pid, "--json", env=cli_env(state))
    finally:
        out, _ = S.finish(proc)
    assert "libtag.so" not in maps, "expected no libtag.so mapped in the static victim"
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    assert json.loads(result.stdout)["reason"] == "on-demand", result.stdout
    S.check_churn_output(out, 2)


def _nobody_can_run_python() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run the CLI as another user"
    try:
        r = subprocess.run([sys.executable, "-c", "import forensics, psutil"], user=65534,
                           capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot run python as nobody: {e}"
    if r.returncode != 0:
        return f"nobody (uid 65534) cannot import forensics here: {r.stderr.decode()[-200:]}"
    return None


def test_snapshot_of_another_users_process_is_refused(build_victim, tmp_path):
    # GIVEN a libtag process owned by root, and the CLI run as another user.
    # (Root may signal anyone, so the uid check is only testable this way round.)
    reason = _nobody_can_run_python()
    if reason:
        pytest.skip(reason)
    exe = build_victim("snap_churn")
    proc, pid = S.start([str(exe), "1"], S.victim_env("self", tmp_path / "snaps"))
    home = tmp_path / "nobody"
    home.mkdir()
    os.chown(home, 65534, 65534)
    try:
        # WHEN nobody runs forensics snapshot PID
        env = dict(os.environ, XDG_STATE_HOME=str(home), HOME=str(home))
        env.pop("PYTHONPATH", None)
        result = subprocess.run([sys.executable, "-m", "forensics", "snapshot", str(pid)],
                                user=65534, cwd=home, env=env, capture_output=True, text=True,
                                timeout=60)
        alive = proc.poll()
    finally:
        out, _ = S.finish(proc)
    # THEN a clear refusal, and no snapshot was taken
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}: {result.stderr}"
    assert error_line(result) == (
        f"forensics: error: no permission to snapshot pid {pid}: it runs as uid 0 and you are "
        f"uid 65534; run forensics as the process's user (or root)"), result.stderr
    assert alive is None, "expected the victim still running"
    assert S.snapshot_dirs(tmp_path / "snaps") == [], "expected no snapshot directory"


def test_snapshot_times_out_when_the_victim_blocks_the_signal(build_victim, run_cli, state,
                                                               tmp_path):
    # GIVEN a victim that blocks libtag's request signal and SIGUSR2 with sigprocmask
    exe = build_victim("snap_blocked")
    snaps = tmp_path / "snaps"
    proc, pid = S.start([str(exe)], S.victim_env("self", snaps))
    try:
        # WHEN forensics snapshot PID --timeout 1
        result = run_cli("snapshot", pid, "--timeout", "1", env=cli_env(state))
        alive = proc.poll()
    finally:
        out, _ = S.finish(proc)
    # THEN exit 2 with the timeout message, and the victim lives on
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}: {result.stderr}"
    line = error_line(result)
    expected = (f"forensics: error: timed out after 1 s waiting for the core of pid {pid} "
                f"(snapshot dir {snaps}: no new snapshot appeared; does the process block or "
                f"ignore libtag's request signal {signal.SIGRTMAX - 1}?)")
    assert line == expected, f"expected {expected!r}, got {line!r}"
    assert alive is None, f"expected the victim still running, it exited {alive}"
    assert proc.returncode == 0 and out.strip() == "alive", f"expected 'alive', got {out!r}"


def _private_mount(snaps: Path, how: str) -> list[str] | None:
    """argv prefix running a command in a private mount namespace where snaps is
    read-only ("ro") or a 1 MiB tmpfs ("full"); None if that is not possible here."""
    if os.geteuid() != 0 or not Path("/usr/bin/unshare").exists():
        return None
    if how == "ro":
        setup = f"mount --bind '{snaps}' '{snaps}' && mount -o remount,bind,ro '{snaps}'"
    else:
        setup = f"mount -t tmpfs -o size=1m,mode=700 tmpfs '{snaps}'"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"{setup} && true"],
                           capture_output=True, timeout=60)
    if probe.returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c", f'{setup} && exec env "$@"', "sh"]


def test_snapshot_to_a_read_only_dir_is_handed_over_and_the_victim_runs_on(
        build_victim, run_cli, state, tmp_path):
    # GIVEN a victim whose snapshot dir is read-only where it runs.  (chmod 0500
    # does not stop root, so a read-only bind mount in a private mount namespace.)
    if os.geteuid() != 0:
        pytest.skip("handing a core over needs root here (ptrace access to the victim's "
                    "snapshot child, which is not the caller's child)")
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    prefix = _private_mount(snaps, "ro")
    if prefix is None:
        pytest.skip("as root a read-only dir needs a private mount namespace "
                    "(unshare -m + mount), which is not available here")
    exe = build_victim("snap_churn")
    env = S.victim_env("self", snaps)
    preload = env.pop("LD_PRELOAD")  # for the victim only, not unshare/sh/mount
    proc, pid = S.start([*prefix, f"LD_PRELOAD={preload}", str(exe), "2"], env)
    try:
        # WHEN forensics snapshot PID
        result = run_cli("snapshot", pid, "--timeout", "60", "--json", env=cli_env(state))
        alive = proc.poll()
    finally:
        out, err = S.finish(proc)
    # THEN the core was handed over to the caller's own snapshot directory,
    # with a note saying why, and the victim ran on to the right checksums
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    mine = state / "forensics" / "snapshots"
    assert result.stderr.strip() == (
        f"forensics: note: pid {pid} cannot write its own snapshot directory ({snaps} is on "
        f"a read-only file system): its core is handed over to {mine}"), result.stderr
    doc = json.loads(result.stdout)
    core = Path(doc["core"])
    assert doc["handed_over"] is True and doc["reason"] == "on-demand", doc
    assert core == mine / f"{exe.name[:15]}-{pid}-1-on-demand" / "core", core
    assert stat.S_IMODE(core.stat().st_mode) == 0o600, oct(core.stat().st_mode)
    assert stat.S_IMODE(core.parent.stat().st_mode) == 0o700, oct(core.parent.stat().st_mode)
    assert doc["core_bytes"] == core.stat().st_size
    assert S.snapshot_dirs(snaps) == [], "expected nothing written into the read-only dir"
    assert alive is None, "expected the victim still running"
    assert proc.returncode == 0, f"expected the victim to exit 0, got {proc.returncode}: {err}"
    S.check_churn_output(out, 2)
    # and the handed-over core reads like any other: every thread, the churn's blocks
    inspect = run_cli("inspect", core, "--json", env=cli_env(state))
    assert inspect.returncode == 0, inspect.stderr
    heap = json.loads(inspect.stdout)
    assert heap["process"]["pid"] == pid, heap["process"]
    assert heap["reason"] == "on-demand", heap["reason"]


def test_snapshot_on_a_full_disk_reports_the_childs_error(build_victim, run_cli, state, tmp_path):
    # GIVEN a victim whose snapshot dir is a 1 MiB tmpfs (its cores are ~10+ MB),
    # writing its own core (LIBTAG_CORE=self reports ENOSPC; the kernel would not)
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    prefix = _private_mount(snaps, "full")
    if prefix is None:
        pytest.skip("needs root and a private mount namespace to mount a tiny tmpfs")
    exe = build_victim("snap_churn")
    env = S.victim_env("self", snaps)
    preload = env.pop("LD_PRELOAD")
    proc, pid = S.start([*prefix, f"LD_PRELOAD={preload}", str(exe), "2"], env)
    try:
        # WHEN forensics snapshot PID, with the snapshot dir looked at through
        # the victim's mount namespace (where the tmpfs is)
        env_cli = dict(cli_env(state))
        result = run_cli("snapshot", pid, "--timeout", "60", env=env_cli)
        alive = proc.poll()
    finally:
        out, err = S.finish(proc)
    # THEN exit 2 with the child's own words, the victim ran on
    assert result.returncode == 2, f"expected exit 2, got {result.returncode}: {result.stderr}"
    assert "cannot write core: no space left on device (errno 28)" in error_line(result), result.stderr
    assert alive is None, "expected the victim still running"
    S.check_churn_output(out, 2)


# ------------------------------------------------------------------ run --

def test_run_catalogs_the_snapshots_and_names_the_next_command(build_victim, run_cli, state,
                                                               tmp_path):
    # GIVEN a victim that double-frees, under forensics run --dir
    exe = build_victim("snap_anomaly")
    snaps = tmp_path / "snaps"
    env = dict(cli_env(state), LIBTAG_CORE="self")
    # WHEN
    result = run_cli("run", "--dir", snaps, "--", exe, "double-free", env=env)
    # THEN CMD's status, and stderr names the core and `forensics inspect <core>`
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1, f"expected 1 snapshot dir, got {dirs}"
    core = dirs[0] / "core"
    assert f"forensics: next: forensics inspect {core}" in result.stderr.splitlines(), result.stderr
    assert "forensics: snapshot (double-free) of pid" in result.stderr, result.stderr
    listed = json.loads(run_cli("list", "--json", env=cli_env(state)).stdout)
    assert [(r["core"], r["reason"]) for r in listed] == [(str(core), "double-free")], listed


def test_a_later_snapshot_has_no_registers_of_an_exited_thread(build_victim, tmp_path):
    from forensics.core import Core
    from forensics.snapshots.snapdir import parse_name

    # GIVEN rev_cases stale: a snapshot with a worker alive, the worker
    # joined, a second snapshot
    proc = S.run_case(build_victim("rev_cases"), "stale", tmp_path)
    assert proc.returncode == 0, proc.stderr
    pid = parse_name(S.snapshot_dirs(tmp_path / "snaps")[0].name)[1]
    first = S.wait_core(tmp_path / "snaps", pid, seq=1)
    second = S.wait_core(tmp_path / "snaps", pid, seq=2)
    # THEN the first core holds both threads, the second the main one only
    with Core(first) as c:
        assert len(c.threads) == 2
    with Core(second) as c:
        assert [t.tid for t in c.threads] == [pid]
