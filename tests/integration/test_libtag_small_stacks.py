"""Threads with small stacks (PTHREAD_STACK_MIN, 32 KiB) work under libtag as
without it.

glibc carves a preloaded library's static TLS out of every new thread's
stack.  libtag's per-thread state (~34 KiB: shadow stack, kept walks, caches)
used to be static TLS, so pthread_create of a thread with such a stack failed
with EINVAL under libtag - a program that works without it did not.  The
state is now mapped per thread; static TLS keeps a pointer to it.

tests/victims/lt_small_stacks.c: 4 threads per stack size allocate and free
(stacks captured at each), thread 0 of each down a call chain; stdout must
be the same with and without libtag, and libtag must have tagged each
thread's blocks with its tid and a stack.
"""
from __future__ import annotations

import re
import subprocess

import pytest

from forensics import libpath

NTHREADS = 4
KEEP = 8
CHAIN = 24
LINE = re.compile(r"^libtag (?P<label>\S+) thread (?P<i>\d+) kept=(?P<kept>\d+) "
                  r"tags_ok=(?P<ok>\d+) stacks_set=(?P<set>\d+) depth=(?P<depth>\d+)$")


def test_libtag_static_tls_is_small():
    # GIVEN the libtag.so the tests use: its static TLS (PT_TLS memsz), what
    # glibc takes from every thread's stack, stays far below 16 KiB
    out = subprocess.run(["readelf", "-lW", str(libpath.lib_path())], capture_output=True,
                         text=True, check=True).stdout
    tls = [l.split() for l in out.splitlines() if l.split()[:1] == ["TLS"]]
    assert len(tls) == 1, out
    assert int(tls[0][5], 16) < 2048, tls[0]


@pytest.mark.parametrize("instrument", [False, True], ids=["plain", "instrumented"])
def test_small_stack_threads_run_as_without_libtag(build_victim, run_victim, tmp_path,
                                                   instrument):
    exe = build_victim("lt_small_stacks", instrument=instrument)
    # WHEN it runs without libtag and under it
    bare = run_victim(exe, preload=False, timeout=60)
    assert bare.returncode == 0, bare.stderr
    proc = run_victim(exe, snap_dir=tmp_path, env={"LIBTAG_QUIET": "1"}, timeout=120)
    # THEN every thread was created (create=0) and the program's output is the same
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * NTHREADS, proc.stdout
    for line in lines:
        assert " create=0 join=0 " in line, line
    assert proc.stdout == bare.stdout
    # AND libtag tagged each thread's kept blocks with its tid and a stack,
    # and the call chain's block with the whole chain
    found = [LINE.match(l) for l in proc.stderr.splitlines()]
    found = [m for m in found if m]
    assert len(found) == 2 * NTHREADS, proc.stderr
    for m in found:
        assert int(m["ok"]) == KEEP and int(m["set"]) == KEEP, m.string
        if m["i"] == "0":
            assert int(m["depth"]) > CHAIN, m.string
