"""forensics imports numpy with its BLAS on one thread, and leaves the
environment as it found it.

GIVEN a new Python process, with OPENBLAS_NUM_THREADS unset or set by the user
WHEN it imports forensics' numpy (forensics._np, what every module imports)
THEN the process has one thread (numpy's bundled OpenBLAS would start one per
further CPU: 2 threads on a 2-CPU machine) and the variable is as it was, so
a program forensics starts does not inherit it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import os, forensics._np; "
         "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS', 'unset'))")


@pytest.mark.parametrize("user_value", [None, "7"])
def test_numpy_starts_no_blas_threads_and_the_environment_is_restored(user_value):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user_value is not None:
        env["OPENBLAS_NUM_THREADS"] = user_value
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", user_value or "unset"]


def test_plain_numpy_would_start_a_thread_here():
    # the check above can fail: without forensics._np, numpy's OpenBLAS starts
    # its threads on a machine of more than one CPU
    cpus = len(os.sched_getaffinity(0))  # what OpenBLAS counts
    if cpus < 2:
        pytest.skip("one CPU: OpenBLAS starts no thread")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", "import os, numpy; print(len(os.listdir('/proc/self/task')))"],
                          env=env, capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == min(cpus, 64)  # its wheels' build caps threads at 64
