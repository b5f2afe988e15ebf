"""The cores systemd-coredump holds: `forensics list` shows them, with what
each is, and every verb that takes a core takes `--coredump MATCH`.

Which path this takes: this machine does not run systemd, and installing
Debian's systemd-coredump would rewrite core_pattern (its postinst runs
systemd-sysctl on 50-coredump.conf), which the tests must never change.  So
the tests write what systemd-coredump writes, as it writes it, into a folder
of their own (FORENSICS_COREDUMP_DIR): REAL cores made by the kernel (`sleep`
killed with SIGABRT, its core limit raised in the child; once plain, once
with libtag preloaded), compressed by the real zstd, lz4 and xz tools, named
core.COMM.UID.BOOTID.PID.TIMESTAMP.EXT, with the user.coredump.* extended
attributes set by os.setxattr.  coredumpctl's side is its `--json=short
list` document (the journal's records, one with no file left), printed by a
script named by FORENSICS_COREDUMPCTL; the tests without it set that to the
empty string (no coredumpctl: the folder alone, as in a container).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import forensics_test_support as S
from forensics import libpath

BOOT = "8d4c1e2f3a4b5c6d7e8f901234567890"
SLEEP = shutil.which("sleep") or "/bin/sleep"
TOOLS = {"zst": ["zstd", "-q", "-c"], "lz4": ["lz4", "-q", "-c"], "xz": ["xz", "-c", "-T1"]}
KINDS = {"zst": "zstd", "lz4": "lz4", "xz": "xz"}


@dataclass
class Crash:
    plain: Path  # the kernel's core
    pid: int
    libtag: bool
    stored: Path | None = None  # the file in the coredump folder
    time_us: int = 0


def _raise_core_limit() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _crash(work: Path, libtag: bool) -> Crash:
    """The kernel's core of sleep killed with SIGABRT (libtag preloaded or not)."""
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if libtag:
        env["LD_PRELOAD"] = str(libpath.lib_path())
        env["LIBTAG_QUIET"] = "1"
        # no LIBTAG_DIR: libtag then leaves the crash's core to the kernel
        # (as under systemd-coredump), writing no crash snapshot of its own
        env["XDG_STATE_HOME"] = str(work / "state")
    proc = subprocess.Popen([SLEEP, "60"], cwd=work, env=env, preexec_fn=_raise_core_limit)
    time.sleep(0.5)  # past exec and libtag's start
    proc.send_signal(signal.SIGABRT)
    assert proc.wait(timeout=30) == -signal.SIGABRT
    core = work / "core"
    assert core.is_file(), sorted(work.iterdir())
    return Crash(core, proc.pid, libtag)


def store(crash: Crash, folder: Path, ext: str, time_us: int, *, xattrs: bool = True) -> Path:
    """crash's core as systemd-coredump stores it: compressed, named, with its xattrs."""
    if shutil.which(TOOLS[ext][0]) is None:
        pytest.skip(f"the {TOOLS[ext][0]} tool is not installed (.ci/run installs it)")
    uid = os.getuid()
    path = folder / f"core.sleep.{uid}.{BOOT}.{crash.pid}.{time_us}.{ext}"
    with open(path, "wb") as f:
        subprocess.run([*TOOLS[ext], str(crash.plain)], stdout=f, check=True, timeout=120)
    os.chmod(path, 0o640)
    if xattrs:
        for key, value in (("pid", crash.pid), ("uid", uid), ("gid", os.getgid()),
                           ("signal", int(signal.SIGABRT)), ("timestamp", time_us),
                           ("rlimit", 2**64 - 1), ("hostname", "testhost"), ("comm", "sleep"),
                           ("exe", os.path.realpath(SLEEP))):
            try:
                os.setxattr(path, f"user.coredump.{key}", str(value).encode())
            except OSError as exc:
                pytest.skip(f"this file system takes no user xattrs ({exc.strerror}): "
                            f"systemd-coredump's files cannot be made here")
    crash.stored, crash.time_us = path, time_us
    return path


@pytest.fixture(scope="module")
def crashes(tmp_path_factory) -> dict[str, Crash]:
    """Three real crashes of sleep stored as systemd-coredump stores them:
    "old" (plain, zstd), "lz4" (plain, lz4), "new" (under libtag, xz)."""
    if S.core_pattern() != "core":
        pytest.skip(f"core_pattern is {S.core_pattern()!r}, not 'core': the kernel's core is not ours")
    work = tmp_path_factory.mktemp("crashes")
    folder = work / "coredump"
    folder.mkdir()
    now = int(time.time() * 1e6)
    out = {"old": _crash(work / "old", False), "lz4": _crash(work / "lz4", False),
           "new": _crash(work / "new", True)}
    store(out["old"], folder, "zst", now - 300_000_000)
    store(out["lz4"], folder, "lz4", now - 200_000_000)
    store(out["new"], folder, "xz", now - 100_000_000)
    # not systemd's: skipped by name
    (folder / "README").write_text("not a core\n")
    return out


@pytest.fixture
def cli(run_cli, tmp_path, crashes):
    """run_cli reading the test's coredump folder (no coredumpctl unless given)."""
    folder = crashes["old"].stored.parent

    def run(*args: str, coredumpctl: str = ""):
        return run_cli(*args, env={"XDG_STATE_HOME": str(tmp_path / "state"),
                                   "XDG_CACHE_HOME": str(tmp_path / "cache"),
                                   "FORENSICS_COREDUMP_DIR": str(folder),
                                   "FORENSICS_COREDUMPCTL": coredumpctl})
    return run


def listed(cli, **kw) -> list[dict]:
    result = cli("list", "--json", **kw)
    assert result.returncode == 0, result.stderr
    # the catalog may list other workers' live snapshots: only systemd's here
    return [d for d in json.loads(result.stdout) if d["source"] == "systemd-coredump"]


def inspect_doc(cli, *args: str) -> dict:
    result = cli("inspect", "--json", *args)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    doc.pop("core")
    return doc


def test_list_shows_each_stored_core_and_what_it_is_from_the_folder(cli, crashes):
    # path: the folder alone (FORENSICS_COREDUMPCTL empty: no coredumpctl)
    docs = listed(cli)
    got = [(d["core"], d["pid"], d["exe"], d["signal"], d["libtag"], d["kind"], d["compression"],
            d["time"], d["reason"], d["id"], d["corefile"], d["summary"]["comm"],
            d["summary"]["uid"], d["summary"]["boot_id"], d["summary"]["from"])
           for d in docs]
    expected = [(str(c.stored), c.pid, os.path.realpath(SLEEP), "SIGABRT", c.libtag, "crash",
                 KINDS[c.stored.suffix[1:]], c.time_us / 1e6, "crash", None, "present", "sleep",
                 os.getuid(), BOOT, ["directory"])
                for c in (crashes["old"], crashes["lz4"], crashes["new"])]  # oldest first
    assert got == expected
    for d, c in zip(docs, (crashes["old"], crashes["lz4"], crashes["new"])):
        assert (d["exists"], d["core_bytes"], d["dir"]) == (True, c.stored.stat().st_size,
                                                             str(c.stored.parent))


def test_list_text_says_coredump_libtag_or_plain_and_the_compression(cli, crashes):
    result = cli("list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for c, what in ((crashes["old"], "plain"), (crashes["new"], "libtag")):
        i = lines.index(f"    {c.stored}")
        head = lines[i - 1]
        assert head.startswith("coredump  "), head
        assert f"pid {c.pid} sleep  {what} crash SIGABRT  " in head, head
        assert head.endswith(", " + KINDS[c.stored.suffix[1:]]), head


def test_coredump_by_program_is_the_newest_and_reads_as_the_plain_core(cli, crashes):
    new = crashes["new"]
    result = cli("inspect", "--json", "--coredump", "sleep")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["core"] == str(new.stored)
    assert inspect_doc(cli, "--coredump", "sleep") == inspect_doc(cli, str(new.plain))
    # by its path too
    assert json.loads(cli("inspect", "--json", "--coredump", os.path.realpath(SLEEP)).stdout)[
        "core"] == str(new.stored)


def test_coredump_by_pid_picks_that_crash_in_every_verb(cli, crashes):
    old, lz4 = crashes["old"], crashes["lz4"]
    doc = inspect_doc(cli, "--coredump", str(old.pid))
    assert doc == inspect_doc(cli, str(old.plain))
    assert doc["process"]["pid"] == old.pid
    # whoowns: the address of the crashing thread's stack pointer is its stack
    sp = doc["threads"][0]["sp"]
    result = cli("whoowns", sp, "--coredump", str(old.pid), "--json")
    assert result.returncode in (0, 1), result.stderr
    who = json.loads(result.stdout)
    assert (who["core"], who["owner"], who["thread"]) == (str(old.stored), "stack", old.pid)
    # diff: OLD then NEW, both from the folder
    result = cli("diff", "--coredump", str(old.pid), "--coredump", str(lz4.pid), "--json")
    assert result.returncode == 0, result.stderr
    d = json.loads(result.stdout)
    assert (d["old"]["core"], d["new"]["core"], d["old"]["pid"], d["new"]["pid"]) == (
        str(old.stored), str(lz4.stored), old.pid, lz4.pid)


def test_no_such_coredump_is_one_error_line(cli, crashes):
    result = cli("inspect", "--coredump", "nosuchprogram")
    folder = crashes["old"].stored.parent
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        f"forensics: error: --coredump nosuchprogram: no core of program nosuchprogram in "
        f"{folder} (and no coredumpctl); `forensics list` shows the cores there are"]
    both = cli("inspect", str(crashes["old"].plain), "--coredump", "sleep")
    assert both.returncode == 2
    assert both.stderr.splitlines() == ["forensics: error: inspect: give a CORE or --coredump "
                                        "MATCH, not both"]


def _systemd_tool(name: str, sub: str) -> str | None:
    """systemd's own program *name*: on PATH, else unpacked by .ci/run from
    Debian's packages (not installed: systemd-coredump's postinst would set
    core_pattern) under $XDG_CACHE_HOME/forensics/systemd."""
    found = shutil.which(name)
    if found:
        return found
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = cache / "forensics" / "systemd" / sub / name
    return str(path) if os.access(path, os.X_OK) else None


def _journal_coredumpctl(tmp_path, crashes) -> str:
    """The real coredumpctl reading a real journal file of the crashes,
    written by systemd-journal-remote from journal export entries as
    systemd-coredump logs them (MESSAGE_ID fc2e22bc...: a core dumped)."""
    ctl = _systemd_tool("coredumpctl", "usr/bin")
    remote = _systemd_tool("systemd-journal-remote", "lib/systemd")
    if ctl is None or remote is None:
        pytest.skip("coredumpctl and systemd-journal-remote are not here (.ci/run unpacks them "
                    "from Debian's packages); the same records are tested as coredumpctl's JSON")
    entries = []
    records = [(c.time_us, c.pid, signal.SIGABRT, os.path.realpath(SLEEP), str(c.stored))
               for c in crashes.values()]
    records.append((crashes["new"].time_us + 50_000_000 - 40_000, 4242, signal.SIGSEGV,
                    "/usr/bin/gone", str(tmp_path / "core.gone.0.x.4242.1.zst")))
    for t, pid, sig, exe, core in records:
        fields = {"__REALTIME_TIMESTAMP": t + 40_000, "_BOOT_ID": BOOT, "_HOSTNAME": "testhost",
                  "MESSAGE_ID": "fc2e22bc6ee647b6b90729ab34a250b1",
                  "MESSAGE": f"Process {pid} ({os.path.basename(exe)}) of user {os.getuid()} dumped core.",
                  "COREDUMP_PID": pid, "COREDUMP_UID": os.getuid(), "COREDUMP_GID": os.getgid(),
                  "COREDUMP_SIGNAL": int(sig), "COREDUMP_SIGNAL_NAME": signal.Signals(sig).name,
                  "COREDUMP_EXE": exe, "COREDUMP_COMM": os.path.basename(exe)[:15],
                  "COREDUMP_TIMESTAMP": t, "COREDUMP_FILENAME": core}
        entries.append("".join(f"{k}={v}\n" for k, v in fields.items()))
    journal = tmp_path / "coredumps.journal"
    subprocess.run([remote, "-o", str(journal), "-"], input="\n".join(entries) + "\n", text=True,
                   check=True, capture_output=True, timeout=60)
    script = tmp_path / "coredumpctl"
    script.write_text(f"#!/bin/sh\nexec '{ctl}' --file '{journal}' \"$@\"\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture(params=["journal", "json"])
def coredumpctl(request, tmp_path, crashes) -> str:
    """A coredumpctl for the three stored crashes (logged a moment after
    each) and one whose core systemd no longer holds: the real one over a
    real journal ("journal"), or a script that prints what its `--json=short
    list` prints ("json"), for a machine without it."""
    if request.param == "journal":
        return _journal_coredumpctl(tmp_path, crashes)
    rows = [{"time": c.time_us + 40_000, "pid": c.pid, "uid": os.getuid(), "gid": os.getgid(),
             "sig": int(signal.SIGABRT), "corefile": "present", "exe": os.path.realpath(SLEEP),
             "size": c.stored.stat().st_size} for c in crashes.values()]
    rows.append({"time": crashes["new"].time_us + 50_000_000, "pid": 4242, "uid": os.getuid(),
                 "gid": os.getgid(), "sig": int(signal.SIGSEGV), "corefile": "missing",
                 "exe": "/usr/bin/gone", "size": None})
    doc = tmp_path / "list.json"
    doc.write_text(json.dumps(rows))
    script = tmp_path / "coredumpctl"
    script.write_text(f"#!/bin/sh\n[ \"$*\" = '--json=short --no-pager list' ] || exit 2\n"
                      f"exec cat '{doc}'\n")
    script.chmod(0o755)
    return str(script)


def test_list_joins_coredumpctls_records_and_shows_a_crash_with_no_file(cli, crashes, coredumpctl):
    # path: coredumpctl's JSON (FORENSICS_COREDUMPCTL) beside the folder
    docs = listed(cli, coredumpctl=coredumpctl)
    assert [(d["pid"], d["core"], d["corefile"], d["summary"]["from"]) for d in docs] == [
        (c.pid, str(c.stored), "present", ["directory", "coredumpctl"])
        for c in (crashes["old"], crashes["lz4"], crashes["new"])
    ] + [(4242, None, "missing", ["coredumpctl"])]
    gone = docs[-1]
    assert (gone["exe"], gone["signal"], gone["exists"], gone["libtag"], gone["core_bytes"]) == (
        "/usr/bin/gone", "SIGSEGV", False, None, None)
    text = cli("list", coredumpctl=coredumpctl).stdout.splitlines()
    assert any(line.startswith("coredump  ") and "pid 4242 gone  unreadable crash SIGSEGV  "
               "no core file (missing)" in line for line in text), text


def test_coredump_of_a_crash_with_no_file_says_so(cli, coredumpctl):
    result = cli("inspect", "--coredump", "4242", coredumpctl=coredumpctl)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        "forensics: error: --coredump 4242: systemd-coredump recorded a crash of pid 4242 but "
        "holds no core file for it (coredumpctl: corefile missing)"]


def test_triage_reads_every_core_a_match_names_and_says_which_crash_has_none(cli, crashes, coredumpctl):
    # path: `triage --coredump MATCH` takes every core of MATCH, not the newest
    # alone; a core two MATCHes name is read once; a crash coredumpctl
    # recorded with no core left is skipped with why
    old, lz4, new = crashes["old"], crashes["lz4"], crashes["new"]
    result = cli("triage", "--json", "--coredump", "sleep", "--coredump", str(old.pid),
                 "--coredump", "4242", coredumpctl=coredumpctl)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    gone_at = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(new.time_us / 1e6 + 50))
    assert (doc["cores"], doc["unsigned"], doc["skipped"]) == (3, [], [{
        "path": None,
        "error": f"--coredump 4242: systemd-coredump recorded a crash of pid 4242 (gone) at "
                 f"{gone_at} but holds no core file for it (coredumpctl: corefile missing)"}])
    # grouped as inspect's signature of each plain core groups them
    expected: dict[str, list[str]] = {}
    for c in (old, lz4, new):
        sig = inspect_doc(cli, str(c.plain))["signature"]
        assert sig["kind"] == "SIGABRT", sig
        expected.setdefault(sig["id"], []).append(str(c.stored))
    got = {g["id"]: g for g in doc["groups"]}
    assert {i: sorted(g["cores"]) for i, g in got.items()} == {
        i: sorted(paths) for i, paths in expected.items()}
    assert sum(g["count"] for g in doc["groups"]) == 3
    assert sorted(pid for g in doc["groups"] for p in g["processes"] for pid in p["pids"]) == \
        sorted([old.pid, lz4.pid, new.pid])
    assert {h for g in doc["groups"] for h in g["hosts"]} == {"testhost"}
    # the newest core is its group's example
    assert got[inspect_doc(cli, str(new.plain))["signature"]["id"]]["example"] == str(new.stored)


def test_triage_coredump_errors_are_one_line(cli, crashes, coredumpctl):
    folder = crashes["old"].stored.parent
    result = cli("triage", "--coredump", "nosuchprogram", coredumpctl=coredumpctl)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        f"forensics: error: --coredump nosuchprogram: no core of program nosuchprogram in "
        f"{folder}; `forensics list` shows the cores there are"]
    # only a crash with no core left: nothing to read
    result = cli("triage", "--coredump", "gone", coredumpctl=coredumpctl)
    assert (result.returncode, result.stdout) == (2, "")
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(
        "forensics: error: triage: no core could be read (1 skipped; the first: --coredump gone: "
        "systemd-coredump recorded a crash of pid 4242 (gone) at "), result.stderr
    result = cli("triage")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        "forensics: error: triage: give at least one CORE_OR_DIR or --coredump MATCH"]
