"""8 threads allocate and free concurrently (including frees of each other's
blocks); at the end every per-thread counter, every total and every kept
tag is consistent.

tests/victims/lt_threads.c counts what each thread did itself and prints,
after the join, libtag's record of the thread next to that count.
"""
from __future__ import annotations

import re

import pytest

NTHREADS = 8
KEEP = 50
HANDOFF = 200
GOT_WANT = re.compile(r"^(?P<key>.*) got=(?P<got>-?\d+) want=(?P<want>-?\d+)$")


@pytest.mark.parametrize("instrument", [False, True], ids=["plain", "instrumented"])
def test_eight_threads_counters_and_tags_consistent(build_victim, run_victim, tmp_path,
                                                    instrument):
    # GIVEN 8 threads churning malloc/calloc/realloc/free and cross-thread frees
    exe = build_victim("lt_threads", instrument=instrument)
    proc = run_victim(exe, snap_dir=tmp_path, env={"LIBTAG_QUIET": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    pairs = {}
    for line in lines:
        m = GOT_WANT.match(line)
        if m:
            pairs[m["key"]] = (int(m["got"]), int(m["want"]))
    # THEN each thread's record holds exactly what the thread counted
    for i in range(NTHREADS):
        for field in ("allocs", "frees", "alloc_bytes", "free_bytes"):
            key = f"thread {i} {field}"
            assert key in pairs, f"no line for {key}: {proc.stdout}"
            got, want = pairs[key]
            assert got == want, key
        # every thread ends with exactly its KEEP blocks live
        assert pairs[f"thread {i} allocs"][1] - pairs[f"thread {i} frees"][1] == KEEP
        assert f"thread {i} exited=1" in lines
        # blocks it freed for its neighbour: freed by it, allocated by them
        assert f"thread {i} handoff freed_ok={HANDOFF} want={HANDOFF}" in lines
        # blocks it kept: valid live tags, its tid, intact canary and content
        assert f"thread {i} kept tags_ok={KEEP} content_ok={KEEP} want={KEEP}" in lines
    # AND libtag_stats agrees with the records, to the block and the byte
    for key in ("total allocs", "total frees", "total live_blocks", "total live_bytes"):
        got, want = pairs[key]
        assert got == want, key
    assert pairs["total workers_live_blocks"] == (NTHREADS * KEEP, NTHREADS * KEEP)
    assert pairs["threads_new"] == (NTHREADS, NTHREADS)
    assert pairs["anomalies"] == (0, 0)


PAGE_KB = 4
CHURN_THREADS = 2000
# Mappings libtag may make once in the window (main's own quarantine ring,
# 96 KiB of entries plus guard pages), far below one page per thread.
ONCE_KB = 128


def test_exited_threads_do_not_grow_the_address_space(build_victim, run_victim, tmp_path):
    # GIVEN 2000 short-lived threads, one after another, each freeing a block
    exe = build_victim("lt_thread_churn", instrument=False)
    proc = run_victim(exe, snap_dir=tmp_path, env={"LIBTAG_QUIET": "1"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"threads_added={CHURN_THREADS}" in lines
    growth = int(next(l for l in lines if l.startswith("vm_growth_kb=")).split("=")[1])
    # THEN nothing libtag keeps per exited thread is a mapping: leaking each
    # thread's 36 KiB quarantine ring grew VmSize by 72036 KiB here, and even
    # one page per thread would be 2000 * 4 = 8000 KiB.
    assert growth <= ONCE_KB, f"VmSize grew {growth} KiB over {CHURN_THREADS} threads"
    assert ONCE_KB < CHURN_THREADS * PAGE_KB
