"""Allocation and free stacks name the right functions, in order (docs/architecture.md).

tests/victims/lt_stack.c allocates three calls deep (level1 -> level2 ->
level3 -> malloc) and frees two deep (free_level1 -> free_level2 -> free),
then prints the tag's stack frames (kind, pc).  Built -no-pie, so the pcs
are link-time addresses that `addr2line -f` names directly.

Without -finstrument-functions the stack comes from the frame-pointer
fallback; with it, from the shadow stack (which also records the ENTRY of
the innermost instrumented function).
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("addr2line") is None, reason="needs addr2line")

CALL, ENTRY = 1, 2


def _stacks(stdout: str) -> dict[str, list[tuple[int, int]]]:
    """{"alloc": [(kind, pc), ...], "free": [...]} innermost first."""
    stacks: dict[str, list[tuple[int, int]]] = {}
    current = None
    for line in stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("alloc", "free"):
            current = stacks.setdefault(word, [])
        elif word == "frame":
            _, kind, pc = line.split()
            current.append((int(kind), int(pc, 16)))
        elif word == "end":
            assert int(line.split()[1]) == len(current)
            current = None
    return stacks


def _names(exe, frames: list[tuple[int, int]]) -> list[str]:
    # A CALL pc is a return address: look up the call instruction before it.
    addrs = [hex(pc - 1 if kind == CALL else pc) for kind, pc in frames]
    out = subprocess.run(["addr2line", "-f", "-e", str(exe), *addrs],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.splitlines()[0::2]


def _run(build_victim, run_victim, tmp_path, instrument, *args):
    exe = build_victim("lt_stack", instrument=instrument, extra_flags=("-no-pie",))
    proc = run_victim(exe, *args, snap_dir=tmp_path, env={"LIBTAG_QUIET": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "alloc size=42" in proc.stdout.splitlines()
    stacks = _stacks(proc.stdout)
    return exe, stacks


@pytest.mark.parametrize("where,outer", [("main", "main"), ("thread", "thread_main")])
def test_frame_pointer_fallback_names_the_three_calls(build_victim, run_victim, tmp_path,
                                                      where, outer):
    # GIVEN a victim with NO instrumentation, built with frame pointers
    args = ("thread",) if where == "thread" else ()
    exe, stacks = _run(build_victim, run_victim, tmp_path, False, *args)
    # THEN the allocation stack, innermost first, is the three calls and
    # their caller, all CALL frames
    alloc = stacks["alloc"]
    assert [k for k, _ in alloc[:4]] == [CALL] * 4
    assert _names(exe, alloc)[:4] == ["level3", "level2", "level1", outer]
    # AND the free stack is free_level2 <- free_level1 <- report <- main
    free = stacks["free"]
    assert _names(exe, free)[:4] == ["free_level2", "free_level1", "report", "main"]
    # AND the walk stops within the fallback's depth bound (32)
    assert len(alloc) <= 32


@pytest.mark.parametrize("where,outer", [("main", "main"), ("thread", "thread_main")])
def test_shadow_stack_names_the_three_calls(build_victim, run_victim, tmp_path, where, outer):
    # GIVEN the same victim built with -finstrument-functions
    args = ("thread",) if where == "thread" else ()
    exe, stacks = _run(build_victim, run_victim, tmp_path, True, *args)
    alloc = stacks["alloc"]
    # THEN: the return address in level3, level3's entry, then the call
    # sites in level2, level1 and the outer function
    assert [k for k, _ in alloc[:5]] == [CALL, ENTRY, CALL, CALL, CALL]
    assert _names(exe, alloc)[:5] == ["level3", "level3", "level2", "level1", outer]
    # AND the ENTRY frame is level3's entry address exactly
    nm = subprocess.run(["nm", str(exe)], capture_output=True, text=True, timeout=60,
                        check=True).stdout
    level3 = next(int(l.split()[0], 16) for l in nm.splitlines() if l.endswith(" level3"))
    assert alloc[1] == (ENTRY, level3)
    free = stacks["free"]
    assert _names(exe, free)[:5] == ["free_level2", "free_level2", "free_level1", "report", "main"]


def test_fork_from_thread_child_walks_its_own_stack(build_victim, run_victim, tmp_path):
    # GIVEN a thread that forks; its child allocates three calls deep from
    # uninstrumented code (the frame-pointer walk, bounded by the child's
    # record of its stack)
    exe, stacks = _run(build_victim, run_victim, tmp_path, False, "forkthread")
    # THEN the stack names the calls on the forking thread's stack
    assert _names(exe, stacks["alloc"])[:4] == ["level3", "level2", "level1", "fork_thread_main"]
    assert _names(exe, stacks["free"])[:4] == ["free_level2", "free_level1", "report",
                                               "fork_thread_main"]
