"""libtag's start-up checks and snapshot-directory rules, from the outside.

GIVEN a garbage LIBTAG_* value WHEN a program starts under libtag THEN it
stops with exit 2 and exactly one line naming the variable and what it takes.
GIVEN a snapshot directory reached through a symlink, or owned by another
user WHEN the program asks for a snapshot THEN no snapshot is written there,
libtag says why in one line, and the program runs on to its normal end.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from forensics import libpath
import forensics_test_support as S


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_PRELOAD"] = str(libpath.lib_path())
    env.update(extra)
    return env


@pytest.mark.parametrize("name,value,expected", [
    ("LIBTAG_ON_ANOMALY", "explode", "expected snapshot, abort or ignore"),
    ("LIBTAG_CORE", "maybe", "expected auto, kernel or self"),
    ("LIBTAG_QUARANTINE", "lots", "expected a number"),
    ("LIBTAG_QUARANTINE", "12q", "expected a number, optionally with a k, m or g suffix"),
    ("LIBTAG_FP_DEPTH", "0", "expected a number from 1 to 256"),
    ("LIBTAG_SIGNAL", "HUPPP", "expected a signal"),
    ("LIBTAG_DIR", "relative/dir", "expected an absolute path"),
    ("LIBTAG_PAYLOAD", "some", "expected keep or omit"),
    ("LIBTAG_UNWIND", "dwarf", "expected auto, shadow, fp or cfi"),
])
def test_a_garbage_variable_stops_the_program_at_start_with_one_line(name, value, expected):
    proc = subprocess.run(["/bin/true"], env=_env(**{name: value}), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"libtag: error: {name}={value}: {expected}"), lines[0]


def _snapshot_into(directory: str, build_victim) -> subprocess.CompletedProcess:
    exe = build_victim("snap_secret")  # allocates, raise(SIGUSR2), prints "intact"
    return subprocess.run([str(exe)], env=_env(LIBTAG_DIR=directory, LIBTAG_CORE="self"),
                          capture_output=True, text=True, timeout=60)


def test_a_symlink_in_the_snapshot_path_is_refused(build_victim, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    proc = _snapshot_into(str(tmp_path / "link" / "snaps"), build_victim)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "intact"
    assert list(real.iterdir()) == []  # nothing was created through the link
    assert "libtag: snapshot failed: cannot create the snapshot directory" in proc.stderr


def test_a_snapshot_directory_of_another_user_is_refused(build_victim, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)  # nobody
    proc = _snapshot_into(str(theirs), build_victim)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "intact"
    assert list(theirs.iterdir()) == []
    assert "libtag: snapshot failed" in proc.stderr and "(errno 1)" in proc.stderr  # EPERM


def test_a_group_writable_snapshot_directory_is_refused(build_victim, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    proc = _snapshot_into(str(shared), build_victim)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "intact"
    assert list(shared.iterdir()) == []
    assert "libtag: snapshot failed" in proc.stderr


def test_snapshot_files_are_private(build_victim, tmp_path):
    snaps = tmp_path / "snaps"
    proc = _snapshot_into(str(snaps), build_victim)
    assert proc.returncode == 0
    from forensics.snapshots import snapdir

    (d,) = list(snaps.iterdir())
    snapdir.wait_complete(d, 60)  # the child writes the core after the parent ran on
    assert d.stat().st_mode & 0o777 == 0o700
    assert snaps.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in d.iterdir()) == ["core", "info"]
    for p in d.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, p


def test_list_ignores_a_snapshot_dir_of_another_user(build_victim, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    from forensics.snapshots import snapdir

    # GIVEN our snapshot, and beside it a directory owned by another user
    # (anyone who can write the root could plant one)
    core, _ = S.zero_block_core(build_victim("rev_cases"), tmp_path)
    ours = core.parent
    planted = ours.parent / "planted-4242-1-crash"
    planted.mkdir(mode=0o700)
    (planted / "info").write_text("pid=4242\nchild=0\nseq=1\nreason=crash\ntime_ms=99999999999999\n")
    (planted / "core").write_bytes(core.read_bytes()[:4096])
    for p in (planted, planted / "info", planted / "core"):
        os.chown(p, 65534, 65534)
    # THEN list does not catalog it
    assert [d.name for d in snapdir.list_dirs(ours.parent)] == [ours.name]
