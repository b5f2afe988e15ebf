"""Private files and directories (forensics.files) and the caches beside a
core (forensics.reader.cachefile): 0600, atomic, never through a symlink.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from forensics import files
from forensics.errors import InputError
from forensics.reader import cachefile


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_write_private_replaces_the_file_whole_and_0600(tmp_path):
    target = tmp_path / "page.html"
    target.write_text("old")
    target.chmod(0o644)
    files.write_private(target, lambda f: f.write(b"new"), durable=True)
    assert (target.read_bytes(), mode(target)) == (b"new", 0o600)
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # no temporary left


def test_write_private_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "cache"
    target.write_bytes(b"old")

    def fail(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        files.write_private(target, fail)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]


def test_write_private_replaces_a_symlink_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = tmp_path / "link"
    link.symlink_to(victim)
    files.write_private(link, lambda f: f.write(b"x"))
    assert victim.read_bytes() == b"keep"
    assert not link.is_symlink() and link.read_bytes() == b"x"


def test_create_private_makes_an_empty_0600_file_once(tmp_path):
    db = tmp_path / "catalog.sqlite"
    files.create_private(db)
    db.write_bytes(b"rows")
    files.create_private(db)
    assert (db.read_bytes(), mode(db)) == (b"rows", 0o600)


def test_the_state_dir_follows_xdg_and_ignores_a_relative_one(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert files.state_dir() == tmp_path / "state" / "forensics"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert files.state_dir() == tmp_path / "home" / ".local" / "state" / "forensics"


def test_a_private_dir_is_made_0700_and_a_symlink_is_refused(tmp_path):
    made = files.ensure_private_dir(tmp_path / "a" / "b")
    assert (mode(made), mode(made.parent)) == (0o700, 0o700)
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(InputError, match="is a symlink"):
        files.ensure_private_dir(tmp_path / "link")


def test_a_cache_round_trips_mapped_and_only_for_its_own_meta(tmp_path):
    path = str(tmp_path / "core.fxidx")
    arrays = {"start": np.arange(5, dtype=np.uint64) * 16, "ok": np.array([1, 0, 1, 1, 0], bool),
              "empty": np.zeros(0, np.int64)}
    assert cachefile.save(path, [3, 1234, 5678], arrays) is None
    assert mode(path) == 0o600
    got = cachefile.load(path, [3, 1234, 5678])
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in arrays.items()}
    assert not got["start"].flags.writeable  # a view of the mapping, not a copy
    assert cachefile.load(path, [3, 1234, 5679]) is None  # another core, or a changed one


def test_a_damaged_cache_is_ignored(tmp_path):
    path = tmp_path / "core.fxptr"
    assert cachefile.save(str(path), [1], {"a": np.arange(1000, dtype=np.uint64)}) is None
    path.write_bytes(path.read_bytes()[:200])
    assert cachefile.load(str(path), [1]) is None
    path.write_bytes(b"FXCACHE1" + b"\xff" * 8)
    assert cachefile.load(str(path), [1]) is None
