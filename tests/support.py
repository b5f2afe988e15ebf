"""Helpers shared by the integration tests: `import forensics_test_support as S`
(tests/conftest.py registers this file under that name; pytest's importlib
mode puts no test folder on sys.path).

read_control(core) finds libtag's control block in a core by its magic
(TAG_CONTROL_MAGIC) and unpacks it with forensics.reader.abi's mirror of
tag_abi.h (which tests/unit/test_abi_mirror.py checks against the header) -
not with the heap reader, whose answers these tests check.  A hit counts only
if its `self` field equals the virtual address it was found at (the magic
string also sits in libtag's read-only data, and user memory could hold it).
"""

from __future__ import annotations

import mmap
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from forensics import libpath
from forensics.core.core import Core
from forensics.reader import abi

REASON_ON_DEMAND, REASON_ANOMALY, REASON_CRASH = abi.TAG_REASON_ON_DEMAND, abi.TAG_REASON_ANOMALY, abi.TAG_REASON_CRASH
ANOMALY_KINDS = {name: kind for kind, name in abi.ANOMALY_NAMES.items()}


@dataclass
class Control:
    address: int
    pid: int
    reason: int
    snapshot_seq: int
    anomaly_count: int
    anomaly_kind: int
    anomaly_tid: int
    anomaly_address: int
    anomaly_block: int
    crash_signal: int
    crash_tid: int
    crash_address: int
    latent_uaf: int
    damaged_leaked: int


def _control(core_path: os.PathLike | str):
    """The parsed control block of a core and its address."""
    hits = []
    with Core(core_path) as core, open(core_path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            for seg in core.segments:
                start, end = seg.offset, seg.offset + seg.dumped
                pos = mm.find(abi.TAG_CONTROL_MAGIC, start, end)
                while pos >= 0:
                    vaddr = seg.vaddr + (pos - seg.offset)
                    raw = mm[pos:pos + abi.CONTROL_SIZE]
                    if len(raw) == abi.CONTROL_SIZE:
                        ctl = abi.Control.parse(raw)
                        if ctl.self == vaddr:
                            hits.append((vaddr, ctl))
                    pos = mm.find(abi.TAG_CONTROL_MAGIC, pos + 1, end)
        finally:
            mm.close()
    assert len(hits) == 1, f"expected exactly 1 control block in {core_path}, found {len(hits)}"
    return hits[0]


def read_control_field(core_path: os.PathLike | str, name: str) -> int:
    """One field of a core's control block (e.g. "stack_stats")."""
    return int(getattr(_control(core_path)[1], name))


def read_control(core_path: os.PathLike | str) -> Control:
    vaddr, c = _control(core_path)
    return Control(vaddr, c.pid, c.reason, c.snapshot_seq, c.anomaly_count, c.anomaly.kind, c.anomaly.tid,
                   c.anomaly.address, c.anomaly.block, c.crash.signal, c.crash.tid, c.crash.address,
                   c.latent_uaf, c.damaged_leaked)


def core_pattern() -> str:
    try:
        return Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return ""


def kernel_core_skip_reason() -> str | None:
    """Why LIBTAG_CORE=kernel cannot land a core in the snapshot dir here, or None."""
    pattern = core_pattern()
    if pattern.startswith("|"):
        return f"core_pattern is a pipe ({pattern!r}): the kernel writes no core file"
    if "/" in pattern:
        return f"core_pattern {pattern!r} sends kernel cores outside the snapshot dir"
    import resource
    if resource.getrlimit(resource.RLIMIT_CORE)[1] == 0:
        return "the hard core size limit is 0: the kernel writes no core"
    return None


def _core_paths() -> list:
    import pytest

    reason = kernel_core_skip_reason()
    return ["self", pytest.param("kernel", marks=pytest.mark.skipif(reason is not None,
                                                                     reason=reason or ""))]


# LIBTAG_CORE values for tests that run on both core paths: "kernel" skips,
# saying why, where the kernel will not write a core into the snapshot dir.
CORE_PATHS = _core_paths()


def victim_env(core_path: str, snap_dir: os.PathLike | str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{libpath.lib_path()} {env.get('LD_PRELOAD', '')}".strip()
    env["LIBTAG_DIR"] = str(snap_dir)
    env["LIBTAG_CORE"] = core_path
    env.update(extra)
    return env


def start(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[subprocess.Popen, int]:
    """Start a victim that prints "ready pid=N" first; returns (process, N)."""
    proc, fields = start_fields(argv, env, timeout)
    return proc, int(fields["pid"])


def start_fields(argv: list[str], env: dict[str, str],
                 timeout: float = 60) -> tuple[subprocess.Popen, dict[str, str]]:
    """Start a victim whose first line is "ready pid=N [key=value]..."; returns
    (process, its key=value fields)."""
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        proc.communicate(timeout=timeout)
        raise AssertionError(f"victim {argv} did not print 'ready' within {timeout} s")
    line = proc.stdout.readline()
    assert line.startswith("ready pid="), f"expected 'ready pid=N', got {line!r}"
    return proc, dict(kv.split("=", 1) for kv in line.split()[1:])


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    """Tell a churn/blocked victim to stop (close stdin) and collect its output."""
    try:
        out, err = proc.communicate(input="", timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=timeout)
        raise
    return out, err


def churn_checksum(index: int) -> int:
    """The checksum thread *index* of snap_churn.c computes every round."""
    m64 = (1 << 64) - 1
    s = 0x1000 + index

    def lcg() -> int:
        nonlocal s
        s = (s * 6364136223846793005 + 1442695040888963407) & m64
        return s >> 33

    sizes, blocks = [], []
    for _ in range(64):
        n = 1 + lcg() % 512
        sizes.append(n)
        blocks.append(bytearray(lcg() & 0xFF for _ in range(n)))
    for b in range(0, 64, 3):
        grow = sizes[b] + 1 + lcg() % 256
        blocks[b].extend(lcg() & 0xFF for _ in range(grow - sizes[b]))
        sizes[b] = grow
    total = 0
    for blk in blocks:
        for byte in blk:
            total = (total * 31 + byte) & m64
    return total


def check_churn_output(out: str, threads: int) -> None:
    lines = [ln for ln in out.splitlines() if ln.startswith("thread ")]
    assert len(lines) == threads, f"expected {threads} thread lines, got {out!r}"
    for i, line in enumerate(lines):
        fields = dict(kv.split("=") for kv in line.split()[2:])
        expected = f"0x{churn_checksum(i):016x}"
        assert line.split()[1] == str(i), f"expected thread {i} on line {line!r}"
        assert fields["checksum"] == expected, f"thread {i}: expected checksum {expected}, got {line!r}"
        assert fields["bad"] == "0", f"thread {i}: expected bad=0 (every round the same), got {line!r}"


def gdb_bt(exe: os.PathLike | str, core: os.PathLike | str, *extra: str) -> subprocess.CompletedProcess:
    argv = ["gdb", "--batch", "-nx", str(exe), str(core), "-ex", "bt"]
    for cmd in extra:
        argv += ["-ex", cmd]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def have_gdb() -> bool:
    return shutil.which("gdb") is not None


def overwritten(printed: str, value: int, n: int = 8) -> bytes:
    """The n bytes a victim printed it wrote past a block (print_written in
    tests/victims/overwrite.h: "written=HEX"), after checking each is value
    or ~value - overwrite() writes ~value over a canary byte that already
    held value, so that the first damaged byte is exact."""
    got = bytes.fromhex(printed.removeprefix("written="))
    assert len(got) == n and set(got) <= {value, 0xff ^ value}, printed
    return got


def snapshot_dirs(root: os.PathLike | str) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def wait_core(snap_dir: os.PathLike | str, pid: int, seq: int = 1, reason: str = "on-demand",
              timeout: float = 60.0) -> Path:
    """The core of pid's seq-th snapshot for reason in snap_dir, once it is
    complete (forensics.snapshots.snapdir.wait_complete: its writer exited, its size
    settled, no error file)."""
    from forensics.snapshots import snapdir

    snap_dir = Path(snap_dir)
    deadline = time.monotonic() + timeout
    while True:
        dirs = [d for d in snap_dir.glob(f"*-{pid}-{seq}-{reason}") if (d / "info").exists()]
        if dirs:
            break
        listing = sorted(snap_dir.iterdir()) if snap_dir.is_dir() else []
        assert time.monotonic() < deadline, f"no snapshot {seq} ({reason}) of {pid} in {listing}"
        time.sleep(0.02)
    assert len(dirs) == 1, dirs
    snap = snapdir.wait_complete(dirs[0], max(1.0, deadline - time.monotonic()))
    core = snapdir.find_core(snap.path)
    assert core is not None, f"no core in {dirs[0]}: {sorted(dirs[0].iterdir())}"
    return core


def run_case(exe: os.PathLike | str, mode: str, cwd: os.PathLike | str, *, libtag: bool = True,
             **env: str) -> subprocess.CompletedProcess:
    """Run a MODE victim (rev_cases) to its end: under libtag (quiet, cores
    written by libtag into cwd/snaps), or without it - the reference
    behaviour libtag must not change."""
    if libtag:
        e = victim_env("self", Path(cwd) / "snaps", LIBTAG_QUIET="1", **env)
    else:
        e = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([str(exe), mode], env=e, cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def zero_block_core(exe: os.PathLike | str, cwd: os.PathLike | str) -> tuple[Path, int]:
    """rev_cases zero: the core of a process holding malloc(0)'s block, and
    that block's address (the victim prints "ptr=ADDR")."""
    from forensics.snapshots.snapdir import parse_name

    proc = run_case(exe, "zero", cwd)
    assert proc.returncode == 0, proc.stderr
    address = int(proc.stdout.splitlines()[0].split("=")[1], 16)
    pid = parse_name(snapshot_dirs(Path(cwd) / "snaps")[0].name)[1]
    return wait_core(Path(cwd) / "snaps", pid), address


def gcore(pid: int, out: os.PathLike | str) -> Path:
    """gdb's gcore of the running process pid, written to out.PID."""
    done = subprocess.run(["gcore", "-o", str(out), str(pid)], capture_output=True, text=True,
                          timeout=120)
    core = Path(f"{out}.{pid}")
    assert done.returncode == 0 and core.is_file(), done.stdout + done.stderr
    return core


def growth_cores(exe: os.PathLike | str, work: Path, *args: str) -> tuple[Path, Path, int]:
    """Run tests/victims/glibc_growth.c (ARGS) without libtag and take gcore's
    core at each of its two waits: (at "ready 1", at "ready 2", its pid)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen([str(exe), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        pid = int(proc.stdout.readline().split()[1])
        cores = []
        for n in (1, 2):
            assert proc.stdout.readline().strip() == f"ready {n}"
            cores.append(gcore(pid, work / ("first", "second")[n - 1]))
            proc.stdin.write("go\n")
            proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return cores[0], cores[1], pid
