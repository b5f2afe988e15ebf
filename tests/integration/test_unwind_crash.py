"""The crash record's stack: libtag unwinds the faulting thread from the
signal's context with CFI (async-signal-safe: cached rules and module data,
no lock waited for), and it equals gdb's bt on the crash core.

tests/victims/uw_crash.c is built -O2 without frame pointers: a worker
thread writes to an unmapped address two calls deep, or main calls abort()
two calls deep.  The core's control block names the stack (crash.stack);
its frames, from the exact faulting pc (TAG_FRAME_SIGNAL) outward, must be
gdb's physical frames of the crashing thread, address for address.  Where
the core was taken inside libtag's own handler (abort re-raised by the
kernel path), gdb's frames start after "<signal handler called>".
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess

import pytest

import forensics_test_support as S
from forensics.core import Core
from forensics.reader import abi
from forensics.reader.control import Control
from forensics.reader.memory import CoreMemory

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")

FRAME_RE = re.compile(r"^#(\d+)\s+(?:(0x[0-9a-f]+) in )?(.*)$")


def _gdb_frames(exe, core, tid: int) -> list[tuple[str | None, str]]:
    """gdb's bt of thread tid in the core: (address or None, rest) per line."""
    argv = ["gdb", "--batch", "-nx",
            "-iex", "set debug-file-directory /nonexistent",
            "-iex", "set debuginfod enabled off",
            "-iex", "set backtrace past-main on",
            str(exe), str(core), "-ex", "thread apply all bt"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180).stdout
    frames, mine = [], False
    for line in out.splitlines():
        if line.startswith("Thread "):
            mine = f"(LWP {tid})" in line
        elif mine:
            m = FRAME_RE.match(line)
            if m:
                frames.append((m.group(2), m.group(3)))
    assert frames, f"no bt of thread {tid} in gdb's output:\n{out[-3000:]}"
    return frames


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
@pytest.mark.parametrize("how,sig,inner", [("thread", signal.SIGSEGV, "crash_here"),
                                           ("abort", signal.SIGABRT, "give_up")])
def test_crash_stack_equals_gdb_bt(build_victim, run_cli, tmp_path, core_path, how, sig, inner):
    from forensics.snapshots import snapdir

    # GIVEN the victim dying under forensics run
    exe = build_victim("uw_crash", instrument=False, extra_flags=("-O2", "-fomit-frame-pointer"))
    snaps = tmp_path / "snaps"
    result = run_cli("run", "--dir", snaps, "--", exe, how,
                     env={"XDG_STATE_HOME": str(tmp_path / "state"), "LIBTAG_CORE": core_path})
    assert result.returncode == 128 + sig, result.stderr
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1 and dirs[0].name.endswith("-1-crash"), dirs
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    # WHEN the crash record's stack is read from the core
    with Core(core) as c:
        control = Control(CoreMemory(c))
        assert int(control.fields.crash.signal) == sig
        tid = int(control.fields.crash.tid)
        frames = control.raw_stack(int(control.fields.crash.stack))
    # THEN its first frame is the exact faulting pc, then return addresses
    assert frames, "the crash record has no stack"
    assert [k for _, k in frames] == [abi.TAG_FRAME_SIGNAL] + [abi.TAG_FRAME_CALL] * (len(frames) - 1)
    # AND the frames are gdb's, address for address
    gdb = _gdb_frames(exe, core, tid)
    cut = next((i for i, (_, r) in enumerate(gdb) if "<signal handler called>" in r), -1)
    # without libc's debug files every frame is printed with its address (the
    # victim's faulting frame too: the faulting pc is mid-line)
    after = gdb[cut + 1:]
    want = [int(a, 16) for a, _ in after if a]
    assert len(want) == len(after), f"a frame without an address: {after}"
    got = [p for p, _ in frames]
    assert got == want, (f"libtag {[hex(p) for p in got]} != gdb {[hex(p) for p in want]}\n"
                         + "\n".join(r for _, r in gdb))
    # AND they run through the victim's functions
    named = " ".join(r for _, r in gdb)
    assert inner in named and ("worker" in named if how == "thread" else "check" in named)
