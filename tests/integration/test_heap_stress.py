"""libtag's own heap under 16 threads: every size class, large and aligned
blocks, calloc and realloc, a third of the blocks freed by another thread,
and a fork midway whose child uses the heap it inherited.

tests/victims/heap_stress.c fills every block with a pattern of its own
address and checks it before the free: a block handed to two owners at once,
or memory shared by two blocks, breaks a pattern.
"""
from __future__ import annotations

import re

import forensics_test_support as S


def _fields(stdout: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", stdout)}


def test_sixteen_threads_cross_thread_frees_run_clean(build_victim, run_victim, tmp_path):
    # GIVEN 16 threads churning blocks of every class, handing a third over
    exe = build_victim("heap_stress", instrument=False, extra_flags=("-O2",))
    # WHEN they run under libtag
    proc = run_victim(exe, snap_dir=tmp_path, env={"LIBTAG_QUIET": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    f = _fields(proc.stdout)
    # THEN no block was damaged or shared, and every handed block came back
    assert f["corrupt"] == 0
    assert f["aligned_bad"] == 0
    assert f["zero_bad"] == 0
    assert f["handed"] > 1000
    assert f["received"] == f["handed"]
    # AND the fork child ran on the inherited heap and exited 0
    assert f["fork_child"] == 0
    # AND mallinfo2 reports the same bytes in use as libtag's own counters
    assert f["in_use"] == f["live_bytes"]
    # AND realloc keeps a block that still fits its slot, and moves one that does not
    assert f["realloc_in_place"] == 1
    assert f["realloc_moved"] == 1
    # AND a large block grew in place, at the heap's end and into a freed
    # neighbour's slices, its bytes kept
    assert f["grow_at_end"] == 1
    assert f["grow_into_free"] == 1
    assert f["kept"] == 1
    # AND libtag saw no anomaly in a correct program
    assert "anomaly" not in proc.stderr


def _smaps(pid: int) -> list[tuple[int, int, set[str]]]:
    """(start, end, VmFlags) of every mapping of pid."""
    out, cur = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                cur = [lo, hi]
            elif head == "VmFlags:" and cur is not None:
                out.append((cur[0], cur[1], set(line.split()[1:])))
    return out


def test_the_heaps_reservation_stays_out_of_cores(build_victim, tmp_path):
    # GIVEN a process under libtag that has allocated (the heap is reserved)
    exe = build_victim("snap_idle")
    proc, pid = S.start([str(exe)], S.victim_env("auto", tmp_path / "snaps"))
    try:
        maps = _smaps(pid)
    finally:
        out, _ = S.finish(proc)
    assert out.splitlines()[-1] == "done"
    # THEN every mapping of 1 GiB or more (the heap's reserved address space
    # and its slice table) says "do not dump" (dd): gdb's gcore writes an
    # anonymous mapping whole otherwise, and wrote 1 TiB of zeros
    big = [(lo, hi, flags) for lo, hi, flags in maps if hi - lo >= 1 << 30]
    assert len(big) >= 1, maps
    assert all("dd" in flags for _, _, flags in big), big
    # AND no mapping that is read-write is excluded: the blocks are dumped
    assert not [(lo, hi) for lo, hi, flags in maps if "dd" in flags and "wr" in flags]
