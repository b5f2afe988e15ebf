"""LIBTAG_PAYLOAD=omit: snapshot cores keep tags and metadata, not block contents.

GIVEN snap_secret, whose 12 KiB block is filled with a known secret string
WHEN it snapshots itself with LIBTAG_PAYLOAD=omit (each core path) or keep
THEN with omit the core file does not contain the secret, while inspect and
     whoowns still name the block (size, allocation stack) and say the payload
     was omitted; with keep the secret is there (so the check can fail); the
     running process's own block is untouched either way.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# 64 bytes of what snap_secret computes into its block (SECRET_BYTE(i))
SECRET = bytes(b"KQZXJVWPMB"[(i * 7 + 3) % 10] for i in range(1000, 1064))


import forensics_test_support as S


def _snapshot(build_victim, tmp_path, core_path, payload):
    from forensics.snapshots import snapdir

    exe = build_victim("snap_secret")
    snaps = tmp_path / "snaps"
    env = S.victim_env(core_path, snaps, LIBTAG_PAYLOAD=payload)
    proc = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "intact"
    address = int(lines[0].split("=")[1], 16)
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1, dirs
    snap = snapdir.wait_complete(dirs[0], 60)
    return snapdir.find_core(snap.path), address


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_omit_leaves_the_secret_out_and_the_answers_in(core_path, build_victim, tmp_path):
    from forensics.reader.dump import Dump
    from forensics.answers.inspect import inspect_doc

    core, address = _snapshot(build_victim, tmp_path, core_path, "omit")
    assert SECRET not in core.read_bytes()
    with Dump.open(core) as dump:
        assert dump.control.payload_omitted is True
        block = dump.heap.block_at(address)
        assert (block.start, block.size, block.state) == (address, 4096 * 3, "live")
        assert [f.function for f in dump.stack(block.alloc_stack)][:2] == ["store_secret", "main"]
        assert inspect_doc(dump).payload == "omitted"


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_keep_has_the_secret(core_path, build_victim, tmp_path):
    from forensics.reader.dump import Dump

    core, address = _snapshot(build_victim, tmp_path, core_path, "keep")
    assert SECRET in core.read_bytes()
    with Dump.open(core) as dump:
        assert dump.control.payload_omitted is False
        assert dump.heap.block_at(address).size == 4096 * 3


def test_crash_core_with_omit_has_no_secret(build_victim, run_cli, tmp_path):
    exe = build_victim("snap_secret")
    snaps = tmp_path / "snaps"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env_extra = {"LIBTAG_PAYLOAD": "omit", "LIBTAG_QUIET": "1"}
    import os

    env = dict(os.environ, **env_extra, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.run([sys.executable, "-m", "forensics", "run", "--dir", str(snaps), "--",
                           str(exe), "crash"], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 139, proc.stderr
    crash_dirs = [d for d in S.snapshot_dirs(snaps) if d.name.endswith("-crash")]
    assert len(crash_dirs) == 1, S.snapshot_dirs(snaps)
    from forensics.snapshots import snapdir

    core = snapdir.find_core(snapdir.wait_complete(crash_dirs[0], 60).path)
    assert SECRET not in core.read_bytes()
    assert not [p for p in cwd.iterdir() if p.name.startswith("core")]  # no full core beside it
