"""libtag's own heap under 16 threads: every size class, large and aligned
blocks, calloc and realloc, a third of the blocks freed by another thread,
and a fork midway whose child uses the heap it inherited.

tests/victims/heap_stress.c fills every block with a pattern of its own
address and checks it before the free: a block handed to two owners at once,
or memory shared by two blocks, breaks a pattern.

With "counts" it checks the per-stack counters instead: 16 threads allocate
from three call sites and free across threads, main from two more (one of
whose blocks a helper thread frees), counting per site themselves;
the counters summed over libtag's per-thread shards (the exited threads'
included) in the exit snapshot's core must say the same, exactly.
"""
from __future__ import annotations

import re
from collections import defaultdict

import forensics_test_support as S
import numpy as np

from forensics.reader.dump import Dump


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


def _site_counters(core) -> dict[str, dict[str, int]]:
    """The per-stack counters of the core, summed by the program's innermost
    frame (a site_* function of the victim)."""
    dump = Dump.open(core)
    stats = dump.control.stack_stats()
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for sid in np.nonzero(stats["allocs"])[0].tolist():
        site = next((f.function for f in dump.stack(sid)
                     if f.function and f.function.startswith("site_")), None)
        if site is None:
            continue
        row = stats[sid]
        for key in ("allocs", "temporaries", "live_bytes"):
            out[site][key] += int(row[key])
        out[site]["peak_bytes"] = max(out[site]["peak_bytes"], int(row["peak_bytes"]))
    tids = {int(t) for t in dump.control.shard_chunks()["tid"]}
    return out, tids


def test_sixteen_threads_per_stack_counters_sum_exactly(build_victim, run_victim, tmp_path):
    # GIVEN 16 threads allocating from four call sites, a third of their
    # blocks freed by the next thread, counting per site themselves
    exe = build_victim("heap_stress", instrument=False)
    snaps = tmp_path / "snaps"
    # WHEN they run under libtag, which snapshots the process at its exit
    # (every worker has exited by then)
    proc = run_victim(exe, "counts", snap_dir=snaps, timeout=300,
                      env={"LIBTAG_QUIET": "1", "LIBTAG_AT_EXIT": "snapshot"})
    assert proc.returncode == 0, proc.stderr
    printed = {m[0]: {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", m[1])}
               for m in re.findall(r"^count (\w+) (.*)$", proc.stdout, re.M)}
    assert set(printed) == {"site_cross", "site_own", "site_temp", "site_peak", "site_handoff"}, proc.stdout
    (snap,) = [d for d in snaps.iterdir() if d.name.endswith("-exit")]
    got, tids = _site_counters(snap / "core")
    # THEN every thread counted in a shard of its own: the 16 workers, main
    # and the helper that freed main's site_handoff blocks
    assert len(tids) == 18, sorted(tids)
    # AND each site's allocations, temporaries and live bytes, summed over
    # the shards, are the victim's own counts
    for site, want in printed.items():
        have = {k: got[site][k] for k in ("allocs", "temporaries", "live_bytes")}
        assert have == {k: want[k] for k in ("allocs", "temporaries", "live_bytes")}, site
    # AND the blocks crossed threads and some are still live: the sums are not trivial
    assert printed["site_cross"]["allocs"] > 100000 and printed["site_own"]["live_bytes"] > 0
    # AND the peak of a stack only main allocated from is exact: 10 x 1000
    # bytes held together
    assert got["site_peak"]["peak_bytes"] == 10000
    # AND the peak of a stack whose blocks one thread allocated and another
    # freed (2,000,000 bytes held at once, then 500,000) is the estimate
    # tag_abi.h defines: the allocating thread saw all 2,000,000, and no
    # more than one refresh's slack (TAG_SHARD_SLACK, 64 KiB) beyond
    assert 2_000_000 <= got["site_handoff"]["peak_bytes"] <= 2_000_000 + 65536
    assert (printed["site_handoff"]["allocs"], printed["site_handoff"]["live_bytes"]) == (250, 0)


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
