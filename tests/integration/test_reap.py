"""No zombie is left behind: after `forensics snapshot` of an idle process,
the snapshot's fork child is collected even though the process never
allocates again (forensics asks libtag to reap, TAG_REAP_REQUEST).

GIVEN snap_idle, blocked in read(2) and allocating nothing
WHEN forensics snapshot PID returns (both core paths)
THEN within 5 s the process has no child left, zombie or not, and it still
     ends normally when its stdin closes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import forensics_test_support as S


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_snapshot_of_an_idle_process_leaves_no_zombie(core_path, build_victim, tmp_path):
    exe = build_victim("snap_idle")
    env = S.victim_env(core_path, tmp_path / "snaps", XDG_STATE_HOME=str(tmp_path / "state"))
    proc, pid = S.start([str(exe)], env)
    try:
        done = subprocess.run([sys.executable, "-m", "forensics", "snapshot", str(pid), "--json"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 5
        while _children(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _children(pid) == []
    finally:
        out, _ = S.finish(proc)
    assert out.splitlines()[-1] == "done"
