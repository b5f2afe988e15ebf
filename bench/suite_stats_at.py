"""pytest plugin of bench/run_suite.py --stats-at: libtag's counters of the
pytest process at points in time, not only at its exit.

LIBTAG_STATS prints one line of counters when a process exits, and a forked
child starts with a copy of its parent's counters.  So at the first test
boundary after each of FX_STATS_AT's seconds (comma-separated, counted from
the session's start) this forks a child that only calls C's exit(): libtag's
destructor prints, under the child's pid, the counters the pytest process had
at the fork.  No Python code runs in the child (no atexit, no buffered output
written twice), and the parent waits for it before the next test.  Each fork
is one line "MARK ELAPSED PARENT_PID CHILD_PID" in FX_STATS_AT_LOG, so the
script can tell these lines from the suite's own processes' and subtract
them.  Without libtag the child prints nothing; the bare run forks the same
way, so both runs do the same work.
"""

from __future__ import annotations

import ctypes
import os
import time

_start = 0.0
_marks: list[float] = []
_exit = None


def pytest_sessionstart(session) -> None:
    global _start, _marks, _exit
    _start = time.monotonic()
    _marks = sorted(float(s) for s in os.environ.get("FX_STATS_AT", "").split(",") if s.strip())
    _exit = ctypes.CDLL(None).exit  # looked up here, not in the child


def pytest_runtest_logfinish(nodeid, location) -> None:
    while _marks and time.monotonic() - _start >= _marks[0]:
        mark = _marks.pop(0)
        elapsed = time.monotonic() - _start
        pid = os.fork()
        if pid == 0:
            _exit(0)  # C's exit: libtag's destructor prints the copied counters
            os._exit(0)
        os.waitpid(pid, 0)
        with open(os.environ["FX_STATS_AT_LOG"], "a") as f:
            f.write(f"{mark:g} {elapsed:.1f} {os.getpid()} {pid}\n")
