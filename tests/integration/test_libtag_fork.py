"""A program that forks keeps allocating in both processes: both finish with
the right output, no deadlock - also when another thread is allocating
heavily at the fork, and when a thread other than main forks.

tests/victims/lt_fork.c; every child arms alarm(30), so a deadlocked child
dies of SIGALRM and shows up as "signal14" instead of hanging the test.
"""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("instrument", [False, True], ids=["plain", "instrumented"])
def test_fork_both_processes_keep_allocating(build_victim, run_victim, tmp_path, instrument):
    # GIVEN a block made before fork, then malloc/calloc/realloc/free in both
    exe = build_victim("lt_fork", instrument=instrument)
    proc = run_victim(exe, "simple", snap_dir=tmp_path, env={"LIBTAG_QUIET": "1"},
                      timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # THEN the child is a process of its own for libtag
    assert "child pid_updated=1" in lines
    assert "child record_found=1" in lines
    # AND it inherited the parent's block, tagged by the parent, and frees it
    assert "child inherited_tag_ok=1 from_parent=1 content=1" in lines
    assert "child inherited_freed_state=2" in lines
    # AND its own blocks carry its own tid; nothing was taken for an anomaly
    assert "child bad_tags=0" in lines
    assert "child anomalies=0" in lines
    assert "child live_blocks_delta=-1" in lines
    assert "child done" in lines
    # AND the parent ran on, unaffected by the child's free of its block
    assert "parent block_still_live=1 content=1" in lines
    assert "parent bad_tags=0" in lines
    assert "parent anomalies=0" in lines
    assert "parent pid_kept=1" in lines
    assert "parent child_status=exit0" in lines


@pytest.mark.parametrize("instrument", [False, True], ids=["plain", "instrumented"])
def test_fork_while_other_threads_allocate(build_victim, run_victim, tmp_path, instrument):
    # GIVEN two threads allocating without pause (new stacks all the time)
    # WHEN main forks 30 times and each child allocates, from itself and a
    # new thread of its own
    exe = build_victim("lt_fork", instrument=instrument)
    proc = run_victim(exe, "threads", snap_dir=tmp_path, env={"LIBTAG_QUIET": "1"},
                      timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # THEN every child exited 0 (no deadlock, correct tags) ...
    assert "parent clean_children=30 of 30" in lines, proc.stdout
    # ... and the parent's threads ran on with correct tags
    assert "parent workers_ran=1" in lines
    assert "parent worker_bad_tags=0" in lines
    assert "parent anomalies=0" in lines


def test_fork_from_a_thread_child_has_its_own_record(build_victim, run_victim, tmp_path):
    # GIVEN a thread other than main that forks
    exe = build_victim("lt_fork", instrument=False)
    proc = run_victim(exe, "fromthread", snap_dir=tmp_path, env={"LIBTAG_QUIET": "1"},
                      timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "main stack_bound_ok=1" in lines
    assert "thread stack_bound_ok=1" in lines
    # THEN the child's record is its own and bounds the stack it runs on:
    # the forking thread's, not the main thread's (tid == pid in the child)
    assert "child pid_updated=1" in lines
    assert "child record_found=1 tid_is_pid=1" in lines
    assert "child stack_bound_ok=1" in lines
    assert "child bad_tags=0" in lines
    assert "child done" in lines
    assert "parent child_status=exit0" in lines
