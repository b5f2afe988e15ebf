"""forensics.reader.heap finds every block of a real libtag process, with its owner and stacks.

tests/victims/heap_threads.c allocates through make_record -> alloc_node ->
malloc from main and three worker threads, frees some blocks (they wait in
libtag's quarantine), keeps a dangling pointer, plants a copy of a tag in a
block's payload and makes the heap hand a big freed block's memory out again
(so a stale tag sits inside a live block), prints every fact, and takes
an on-demand snapshot of itself (SIGUSR2).  We read the snapshot's core - once
written by libtag itself, once by the kernel - and the running process through
/proc/PID/mem, and check every printed fact.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import forensics_test_support as S
import numpy as np
import pytest

from forensics.answers.documents import to_json
from forensics.answers.shapes import block_doc
from forensics.core import Core
from forensics.errors import InputError
from forensics.reader import abi
from forensics.reader.abi import NoLibtagError
from forensics.reader.control import Control
from forensics.reader.heap import Heap
from forensics.reader.live import LiveMemory
from forensics.reader.memory import CoreMemory

QUARANTINE = "1500"  # bytes per thread: the victim's small frees stay, its large ones go
WORKERS = 3


# ----------------------------------------------------------------- the victim --


@dataclass
class Printed:
    addr: int
    size: int
    tid: int
    state: str
    who: str  # the function that called make_record: "main" or "worker"


@dataclass
class Report:
    pid: int = 0
    blocks: list[Printed] = field(default_factory=list)
    copy: tuple[int, int] = (0, 0)  # (address of the copied tag, holder block)
    recycled: tuple[int, int] | None = None  # (stale block, the live block over it)
    dangling: int = 0
    stats: tuple[int, int] = (0, 0)  # libtag_stats live_blocks, live_bytes

    @property
    def tids(self) -> set[int]:
        return {b.tid for b in self.blocks}


def parse_report(text: str) -> Report:
    r = Report()
    for line in text.splitlines():
        key, *v = line.split()
        if key == "pid":
            r.pid = int(v[0])
        elif key == "block":
            r.blocks.append(Printed(int(v[0], 16), int(v[1]), int(v[2]), v[3], v[4]))
        elif key == "copy":
            r.copy = (int(v[0], 16), int(v[1], 16))
        elif key == "recycled":
            r.recycled = (int(v[0], 16), int(v[1], 16))
        elif key == "dangling":
            r.dangling = int(v[0], 16)
        elif key == "stats":
            r.stats = (int(v[0]), int(v[1]))
    assert r.recycled is not None, f"the heap did not recycle the big block as planned:\n{text}"
    assert len(r.blocks) == 4 * WORKERS + 5 and len(r.tids) == WORKERS + 1, text
    return r


@pytest.fixture(scope="module")
def victim(build_victim) -> Path:
    return Path(os.path.realpath(build_victim("heap_threads")))


@dataclass
class Case:
    kind: str
    report: Report
    core_path: Path
    core: Core
    heap: Heap
    exe: Path
    base: int  # load address of the victim (its mapping at file offset 0)


@pytest.fixture(scope="module", params=S.CORE_PATHS)
def case(request, victim, run_victim, tmp_path_factory) -> Case:
    snap_dir = tmp_path_factory.mktemp(f"snaps-{request.param}")
    snap_dir.chmod(0o700)
    done = run_victim(victim, "snapshot", snap_dir=snap_dir,
                      env={"LIBTAG_CORE": request.param, "LIBTAG_QUARANTINE": QUARANTINE})
    assert done.returncode == 0, done.stderr
    report = parse_report(done.stdout)
    core_path = S.wait_core(snap_dir, report.pid)
    core = Core(core_path)
    base = min(m.start for m in core.mappings if m.path == str(victim) and m.offset == 0)
    return Case(request.param, report, core_path, core, heap_of(CoreMemory(core)), victim, base)


# ------------------------------------------------------------- symbolisation --


def function_names(exe: Path, base: int, frames: list[tuple[int, int]]) -> list[str]:
    """The victim's functions along a raw stack, innermost first, consecutive
    repeats collapsed (a CALL frame and the ENTRY frame of the same function).
    Frames outside the victim (libc's start_thread ...) are left out."""
    size = exe.stat().st_size  # a small PIE: its code lies within its file size of base
    offs = []
    for pc, kind in frames:
        off = pc - base - (1 if kind == abi.TAG_FRAME_CALL else 0)  # a return address: its call
        if 0 <= off < size:
            offs.append(off)
    if not offs:
        return []
    out = subprocess.run(["addr2line", "-f", "-e", str(exe), *(hex(o) for o in offs)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    names = [n for n in out[0::2] if n != "??"]
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


def heap_of(mem, **kw) -> Heap:
    """The block index of mem, over its libtag control block."""
    return Heap(Control(mem), **kw)


def stack_names(heap: Heap, exe: Path, base: int, stack_id: int) -> list[str]:
    return function_names(exe, base, heap.control.raw_stack(stack_id))


# ---------------------------------------------------------------------- tests --


def check_blocks(heap: Heap, report: Report, exe: Path, base: int, free_records: bool = True) -> None:
    """free_records=False: the thread records (which name the quarantine rings
    that hold the free records) are unreadable, so who freed a block is unknown."""
    for p in report.blocks:
        b = heap.block_at(p.addr)
        assert b is not None, f"block {p.addr:#x} ({p.size} bytes from {p.who}) not found"
        assert (b.start, b.size, b.state, b.thread) == (p.addr, p.size, p.state, p.tid)
        assert b.tag_addr == p.addr - 16
        inner = heap.block_at(p.addr + p.size // 2)
        assert inner is not None and inner.start == p.addr
        assert block_doc(inner, lambda s: [], offset=p.size // 2).offset == p.size // 2
        assert stack_names(heap, exe, base, b.alloc_stack) == ["alloc_node", "make_record", p.who]
        if p.state == "freed" and free_records:
            assert b.free_thread == p.tid
            assert stack_names(heap, exe, base, b.free_stack) == ["release_record", p.who]
        else:
            assert (b.free_thread, b.free_stack, b.free_time_ms) == (None, None, None)


def test_every_printed_block_is_found_with_owner_state_and_stacks(case: Case):
    # GIVEN the snapshot core of the victim  WHEN each printed address is looked up
    # THEN its block has the printed size, state and thread, and its stacks name the callers
    check_blocks(case.heap, case.report, case.exe, case.base)


def test_dangling_pointer_is_a_freed_block_of_main(case: Case):
    main_tid = case.report.pid
    b = case.heap.block_at(case.report.dangling)
    assert b is not None
    assert (b.start, b.size, b.state, b.thread, b.free_thread) == (case.report.dangling, 100, "freed", main_tid,
                                                                  main_tid)


def test_block_json_has_spec_shape(case: Case):
    p = next(x for x in case.report.blocks if x.state == "freed" and x.who == "worker")
    b = case.heap.block_at(p.addr + 5)
    j = to_json(block_doc(b, lambda sid: [], offset=5))
    assert j == {"start": f"{p.addr:#x}", "size": p.size, "offset": 5, "state": "freed", "thread": p.tid,
                 "alloc_stack": [], "free_stack": [], "free_thread": p.tid, "alloc_kind": "malloc",
                 # given a frames function, not the Dump, the times are unknown
                 "alloc_time": None, "free_time": None, "age_s": None,
                 "guarded": False}


def test_bytes_past_the_end_are_near_the_block(case: Case):
    p = next(x for x in case.report.blocks if x.who == "worker" and x.state == "live")
    assert case.heap.block_at(p.addr + p.size + 3) is None
    near = case.heap.near(p.addr + p.size + 3)
    assert near is not None and (near[0].start, near[1]) == (p.addr, 3)


def test_a_copied_tag_in_a_payload_is_not_a_block(case: Case):
    copy, holder = case.report.copy
    assert case.heap.block_at(copy + 16).start == holder  # the copy's "user pointer" is in holder
    assert int(copy + 16) not in case.heap.index["start"].tolist()


def test_a_stale_tag_in_recycled_memory_is_not_a_block(case: Case):
    old, new = case.report.recycled
    b = case.heap.block_at(old)
    assert (b.start, b.size, b.state) == (new, 1200000, "live")
    assert old not in case.heap.index["start"].tolist()


def test_totals_equal_what_libtag_and_the_victim_counted(case: Case):
    heap, report = case.heap, case.report
    t = heap.totals
    assert (t.live_blocks, t.live_bytes) == report.stats
    c = heap.control.counters
    assert t.live_blocks == c["allocs"] - c["frees"]
    # the freed blocks are exactly those the victim freed and that fit the quarantine
    freed = {(b.start, b.size) for b in heap.blocks("freed")}
    assert freed == {(p.addr, p.size) for p in report.blocks if p.state == "freed"}
    assert t.freed_blocks == 2 * WORKERS + 1
    assert t.freed_bytes == sum(p.size for p in report.blocks if p.state == "freed")


def test_reason_threads_and_shadow_stacks(case: Case):
    control, report = case.heap.control, case.report
    assert control.reason == "on-demand"
    assert (control.anomaly, control.crash) == (None, None)
    assert control.pid == report.pid
    assert {t.tid for t in control.threads} == report.tids
    for t in control.threads:
        assert t.recorded and t.regs is None  # whose registers is Dump.threads' to say
        assert t.saved_regs is not None and t.saved_regs["rip"] != 0, f"thread {t.tid} saved no registers"
        want = ["take_snapshot", "main"] if t.tid == report.pid else ["wait_for_quit", "worker"]
        assert function_names(case.exe, case.base, t.shadow) == want
        assert t.shadow[0][1] == abi.TAG_FRAME_ENTRY
    workers = [t for t in control.threads if t.tid != report.pid]
    assert sorted(t.allocs for t in workers) == [4] * WORKERS
    assert sorted(t.frees for t in workers) == [2] * WORKERS


def test_progress_reports_every_region(case: Case):
    calls = []
    heap_of(CoreMemory(case.core), progress=lambda done, total: calls.append((done, total)))
    total = calls[0][1]
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_index_cache_is_reused_and_rebuilt_when_bad(case: Case, tmp_path):
    cache = tmp_path / "core.fxidx"
    first = heap_of(CoreMemory(case.core), cache_path=cache)
    assert first.from_cache is False and cache.is_file()
    assert cache.stat().st_mode & 0o777 == 0o600
    second = heap_of(CoreMemory(case.core), cache_path=cache)
    assert second.from_cache is True
    for k in first.index:
        assert np.array_equal(first.index[k], second.index[k]), k
    check_blocks(second, case.report, case.exe, case.base)
    assert second.totals == first.totals

    cache.write_bytes(b"not an npz")  # a bad cache is ignored and rewritten
    third = heap_of(CoreMemory(case.core), cache_path=cache)
    assert third.from_cache is False
    assert heap_of(CoreMemory(case.core), cache_path=cache).from_cache is True

    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    cache.unlink()
    cache.symlink_to(target)  # a symlink is never followed
    fourth = heap_of(CoreMemory(case.core), cache_path=cache)
    assert fourth.from_cache is False
    assert not cache.is_symlink() and target.read_bytes() == b"keep"


def test_cache_of_another_core_version_is_not_used(case: Case, tmp_path):
    cache = tmp_path / "core.fxidx"
    heap_of(CoreMemory(case.core), cache_path=cache)
    st = case.core_path.stat()
    os.utime(case.core_path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    try:
        assert heap_of(CoreMemory(case.core), cache_path=cache).from_cache is False
    finally:
        os.utime(case.core_path, ns=(st.st_atime_ns, st.st_mtime_ns))


# ------------------------------------------------------------- a live process --


def start_waiting(victim: Path, preload: Path | None, timeout: float = 30.0):
    env = dict(os.environ, LIBTAG_QUARANTINE=QUARANTINE)
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    else:
        env.pop("LD_PRELOAD", None)
    proc = subprocess.Popen([str(victim), "wait"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, deadline = b"", time.monotonic() + timeout
    while not out.endswith(b"ready\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            proc.kill()
            raise AssertionError(f"victim did not get ready: {out!r}")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise AssertionError(f"victim exited early ({proc.wait()}): {out!r} {proc.stderr.read()!r}")
        out += chunk
    return proc, out.decode()


def stop(proc) -> None:
    proc.stdin.close()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_tags_read_back_from_the_running_process(victim, libtag_so):
    # GIVEN the victim paused on stdin under libtag  WHEN its memory is read through /proc
    proc, out = start_waiting(victim, libtag_so)
    try:
        report = parse_report(out)
        with LiveMemory(proc.pid) as mem:
            heap = heap_of(mem)
            maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
            base = min(int(line.split("-")[0], 16) for line in maps
                       if line.endswith(str(victim)) and line.split()[2] == "00000000")
            # THEN the same blocks, owners and stacks as in a snapshot
            check_blocks(heap, report, victim, base)
            assert heap.control.reason == "none"
            assert (heap.totals.live_blocks, heap.totals.live_bytes) == report.stats
            assert heap.from_cache is False
            assert heap_of(mem, cache_path=str(Path(os.environ.get("TMPDIR", "/tmp")) / "never.npz")).from_cache is False
    finally:
        stop(proc)


def test_a_process_without_libtag_is_refused_clearly(victim):
    proc, _ = start_waiting(victim, None)
    try:
        with LiveMemory(proc.pid) as mem, pytest.raises(NoLibtagError) as err:
            heap_of(mem)
        assert str(err.value) == (f"no libtag control block in process {proc.pid}: "
                                  f"the process did not run under libtag")
    finally:
        stop(proc)


def test_live_memory_of_no_process_is_an_input_error():
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    with pytest.raises(InputError) as err:
        LiveMemory(pid_max + 1)
    assert str(err.value) == f"no such process: {pid_max + 1}"


# ------------------------------------------------------------ corrupt memory --


def _patched_core(case: Case, tmp_path: Path, patches: dict[str, int]) -> Path:
    """A copy of the snapshot core with control block fields overwritten."""
    addr = case.heap.control.addr
    seg = case.core.find_segment(addr)
    data = bytearray(case.core_path.read_bytes())
    offsets = abi.field_offsets(abi.Control)
    sizes = {s.name: s.sizeof() for s in abi.Control.subcons if s.name}
    for name, value in patches.items():
        at = seg.offset + (addr - seg.vaddr) + offsets[name]
        data[at : at + sizes[name]] = value.to_bytes(sizes[name], "little")
    out = tmp_path / "core.patched"
    out.write_bytes(bytes(data))
    return out


def test_wild_control_pointers_give_warnings_not_tracebacks(case: Case, tmp_path):
    # GIVEN a core whose control block claims 2^32-1 stack nodes and threads at a wild address
    path = _patched_core(case, tmp_path, {"stack_count": 0xFFFFFFFF, "threads": 0x10, "thread_count": 9})
    heap = heap_of(CoreMemory(Core(path)))
    # THEN the blocks are still all there (who freed them is unknown: the
    # quarantine rings are found through the thread records), and what could
    # not be read is a warning
    check_blocks(heap, case.report, case.exe, case.base, free_records=False)
    assert heap.control.threads == []
    assert any("the thread records at 0x10" in w for w in heap.warnings), heap.warnings
    assert any("stack table count 4294967295 exceeds" in w for w in heap.warnings), heap.warnings
    assert heap.control.raw_stack(0xFFFFFFFF) == []


def test_another_abi_version_is_named(case: Case, tmp_path):
    path = _patched_core(case, tmp_path, {"abi_version": 99})
    with pytest.raises(abi.AbiVersionError) as err:
        heap_of(CoreMemory(Core(path)))
    # (this forensics reads version 5: per-thread shards of the per-stack counters)
    assert "has ABI version 99, this forensics reads version 5" in str(err.value)
