"""forensics.core reads real cores of a live three-thread probe exactly.

tests/victims/core_probe.c prints its pid, its threads' tids and the addresses
of a global, a heap buffer and a stack array filled with a pid-dependent
pattern, then waits on stdin.  We take a core of it twice: with gdb's gcore
(while it runs), and from the kernel (SIGABRT with RLIMIT_CORE raised), and
check every fact the probe printed against what the reader finds in the core.
"""

from __future__ import annotations

import os
import re
import resource
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from forensics.core import Core, CoreParseError, TruncatedError

VICTIM_SRC = Path(__file__).resolve().parents[1] / "victims" / "core_probe.c"
SEEDS = {"global": 1, "heap": 2, "stack": 3}  # as in core_probe.c
SI_USER = 0


def pattern(seed: int, pid: int, n: int) -> bytes:
    """Bytes 0..n-1 as core_probe.c's pattern(seed, pid, i) writes them."""
    i = np.arange(n, dtype=np.uint64)
    return ((seed * 67 + pid * 13 + i * 151 + (i >> 8)) & 0xFF).astype(np.uint8).tobytes()


@dataclass
class Probe:
    proc: subprocess.Popen[bytes]
    pid: int = 0
    tids: list[int] = field(default_factory=list)
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (addr, len)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # EOF: the probe returns from main
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_probe(exe: Path, cwd: Path, preexec_fn=None, timeout: float = 20.0) -> Probe:
    """Run the probe and read its report up to "ready"."""
    proc = subprocess.Popen(
        [str(exe)], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=preexec_fn
    )
    probe = Probe(proc)
    assert proc.stdout is not None
    out, deadline = b"", time.monotonic() + timeout
    while not out.endswith(b"ready\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            probe.stop()
            raise AssertionError(f"probe did not report ready in {timeout}s: {out!r}")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise AssertionError(f"probe exited early ({proc.wait()}): {out!r}")
        out += chunk
    for line in out.decode().splitlines():
        key, *vals = line.split()
        if key == "pid":
            probe.pid = int(vals[0])
        elif key == "tid":
            probe.tids.append(int(vals[0]))
        elif key in SEEDS:
            probe.buffers[key] = (int(vals[0], 16), int(vals[1]))
    assert probe.pid == proc.pid and len(probe.tids) == 3 and set(probe.buffers) == set(SEEDS)
    return probe


@pytest.fixture(scope="module")
def probe_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc) to build tests/victims/core_probe.c")
    exe = tmp_path_factory.mktemp("victims") / "core_probe"
    subprocess.run(
        [gcc, "-O0", "-g", "-Wall", "-Werror", "-pthread", "-o", str(exe), str(VICTIM_SRC)],
        check=True,
        timeout=120,
    )
    return Path(os.path.realpath(exe))


@dataclass
class CoreCase:
    kind: str
    path: Path
    probe: Probe
    exe: Path


@pytest.fixture(scope="module")
def gcore_case(probe_exe: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoreCase]:
    if shutil.which("gcore") is None:
        pytest.skip("gcore (gdb) is not installed")
    workdir = tmp_path_factory.mktemp("gcore")
    probe = start_probe(probe_exe, workdir)
    try:
        prefix = workdir / "core"
        # gcore runs gdb --nx --batch itself (see /usr/bin/gcore); works whatever core_pattern is.
        done = subprocess.run(
            ["gcore", "-o", str(prefix), str(probe.pid)], capture_output=True, text=True, timeout=180
        )
        path = Path(f"{prefix}.{probe.pid}")
        assert done.returncode == 0 and path.is_file(), done.stderr
    finally:
        probe.stop()
    yield CoreCase("gcore", path, probe, probe_exe)


def _raise_core_limit() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@pytest.fixture(scope="module")
def kernel_case(probe_exe: Path, tmp_path_factory: pytest.TempPathFactory) -> CoreCase:
    pattern_ = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if not pattern_ or pattern_.startswith("|") or "/" in pattern_:
        pytest.skip(f"kernel core_pattern is {pattern_!r}: cores do not land in the cwd")
    workdir = tmp_path_factory.mktemp("kernel")  # holds nothing but the core to come
    probe = start_probe(probe_exe, workdir, preexec_fn=_raise_core_limit)
    os.kill(probe.pid, signal.SIGABRT)
    assert probe.proc.wait(timeout=60) == -signal.SIGABRT
    cores = [p for p in workdir.iterdir() if p.is_file()]
    if len(cores) != 1:
        pytest.skip(f"the kernel wrote no core to {workdir} (core_pattern {pattern_!r})")
    return CoreCase("kernel", cores[0], probe, probe_exe)


@pytest.fixture(params=["gcore", "kernel"])
def case(request: pytest.FixtureRequest) -> CoreCase:
    return request.getfixturevalue(f"{request.param}_case")


def test_pid_and_threads(case: CoreCase) -> None:
    # GIVEN a core of the probe WHEN opened
    with Core.open(case.path) as core:
        # THEN the pid and the exact set of thread ids are the ones the probe printed
        assert core.pid == case.probe.pid
        assert sorted(t.tid for t in core.threads) == sorted(case.probe.tids)
        assert core.prpsinfo is not None and core.prpsinfo.fname == "core_probe"


def test_buffers_read_back_exactly(case: CoreCase) -> None:
    # GIVEN the addresses the probe printed WHEN read from the core
    with Core.open(case.path) as core:
        for name, (addr, length) in case.probe.buffers.items():
            # THEN the bytes are the pattern the probe wrote, byte for byte
            assert core.read(addr, length) == pattern(SEEDS[name], case.probe.pid, length), name


def test_buffers_through_numpy_views(case: CoreCase) -> None:
    # GIVEN the heap buffer WHEN found via the segment's zero-copy numpy view THEN same bytes
    with Core.open(case.path) as core:
        addr, length = case.probe.buffers["heap"]
        seg = core.find_segment(addr)
        assert seg is not None and seg.writable and seg.path is None
        view = core.segment_array(seg)
        assert view.base is not None and not view.flags.owndata  # a view of the map
        start = addr - seg.vaddr
        assert view[start : start + length].tobytes() == pattern(SEEDS["heap"], case.probe.pid, length)


def test_word_reads(case: CoreCase) -> None:
    with Core.open(case.path) as core:
        addr, _ = case.probe.buffers["global"]
        expected = pattern(SEEDS["global"], case.probe.pid, 8)
        assert core.read_u64(addr) == int.from_bytes(expected, "little")
        assert core.read_u32(addr + 4) == int.from_bytes(expected[4:8], "little")


def test_registers_point_into_the_core(case: CoreCase) -> None:
    # GIVEN each thread's registers WHEN their pc and sp are looked up
    with Core.open(case.path) as core:
        assert len(core.threads) == 3
        for thread in core.threads:
            where = (case.kind, thread.tid, hex(thread.pc), hex(thread.sp))
            assert thread.regs["rip"] == thread.pc and thread.regs["rsp"] == thread.sp
            assert len(thread.regs) == 27
            # THEN sp is in a writable segment whose bytes are in the core
            sp_seg = core.find_segment(thread.sp)
            assert sp_seg is not None and sp_seg.writable, where
            assert len(core.read(thread.sp, 8)) == 8
            # AND pc is in libc's code (every thread waits in read() or pause())
            pc_map = core.mapping_at(thread.pc)
            assert pc_map is not None and "libc.so" in os.path.basename(pc_map.path), where
            pc_seg = core.find_segment(thread.pc)
            if case.kind == "kernel":
                # The kernel writes a PT_LOAD for every mapping, dumped or not.
                assert pc_seg is not None and pc_seg.executable, where
            else:
                # gcore leaves out file-backed code it can reread from the file.
                assert pc_seg is None or pc_seg.executable, where


def test_main_thread_stack_holds_the_stack_buffer(case: CoreCase) -> None:
    # GIVEN the main thread (tid == pid) WHEN its sp's segment is found THEN it holds stack_buf
    with Core.open(case.path) as core:
        main = next(t for t in core.threads if t.tid == case.probe.pid)
        stack_addr, _ = case.probe.buffers["stack"]
        assert core.find_segment(main.sp) is core.find_segment(stack_addr)
        assert main.sp <= stack_addr


def test_file_mappings_and_exe(case: CoreCase) -> None:
    # GIVEN the probe ran from probe_exe WHEN the mappings are read
    with Core.open(case.path) as core:
        exe = str(case.exe)
        # THEN NT_FILE lists it, exe is its path, and AT_ENTRY falls in one of its mappings
        assert exe in {m.path for m in core.mappings}
        assert core.exe == exe
        assert core.execfn == exe  # started by absolute path
        entry_map = core.mapping_at(core.auxv.entry)
        assert entry_map is not None and entry_map.path == exe
        assert core.auxv.phdr is not None and core.auxv.base is not None
        assert core.find_segment(core.auxv.phdr).path == exe


def test_kernel_core_siginfo_is_sigabrt_from_us(kernel_case: CoreCase) -> None:
    # GIVEN the kernel core of the probe killed by our SIGABRT
    with Core.open(kernel_case.path) as core:
        # THEN the signal is SIGABRT, sent by this process with kill(), and no fault address
        assert core.siginfo is not None
        assert (core.siginfo.signo, core.siginfo.code) == (signal.SIGABRT, SI_USER)
        assert core.siginfo.sender_pid == os.getpid()
        assert core.siginfo.addr is None
        assert core.threads[0].signal == signal.SIGABRT
        assert core.truncated is False


def test_gcore_cut_before_its_notes_is_refused(gcore_case: CoreCase, tmp_path: Path) -> None:
    # GIVEN a gcore (notes after the memory) cut in half
    data = gcore_case.path.read_bytes()
    cut = len(data) // 2
    path = tmp_path / "core.half"
    path.write_bytes(data[:cut])
    # WHEN opened THEN refused, naming the notes' offset past the end
    expected = f"truncated core: {path} is {cut} bytes but its notes at offset 0x"
    with pytest.raises(CoreParseError, match=f"^{re.escape(expected)}"):
        Core.open(path)


def test_kernel_core_cut_after_the_global_still_reads_it(kernel_case: CoreCase, tmp_path: Path) -> None:
    # GIVEN a kernel core cut just after the page holding the global
    pid = kernel_case.probe.pid
    with Core.open(kernel_case.path) as whole:
        g_addr, g_len = kernel_case.probe.buffers["global"]
        g_seg = whole.find_segment(g_addr)
        cut = g_seg.offset + (g_addr - g_seg.vaddr) + g_len
        h_addr, h_len = kernel_case.probe.buffers["heap"]
        h_seg = whole.find_segment(h_addr)
    assert h_seg.offset > cut  # the heap is dumped after the executable's data
    path = tmp_path / "core.cut"
    path.write_bytes(kernel_case.path.read_bytes()[:cut])
    # WHEN opened
    with Core.open(path) as core:
        # THEN it opens truncated; the global reads back; the heap raises a clear error
        assert core.truncated is True
        assert core.read(g_addr, g_len) == pattern(SEEDS["global"], pid, g_len)
        expected = f"truncated core: {path} is {cut} bytes but segment at {h_seg.vaddr:#x}"
        with pytest.raises(TruncatedError, match=f"^{re.escape(expected)}"):
            core.read(h_addr, h_len)
        assert core.find_segment(h_addr).dumped == 0
