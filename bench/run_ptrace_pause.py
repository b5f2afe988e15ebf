#!/usr/bin/env python3
"""The pause of `forensics snapshot PID` by ptrace, beside a bare fork() and gcore.

A plain process (bench/ptracebench.c, no libtag) holds GIB GiB of live heap
in ~1 KiB blocks and THREADS threads.  For each size and thread count,
interleaved REPS times: the process forks itself once (its own time in
fork()), then `forensics snapshot PID --json` forks it by ptrace (its
pause_ms: first thread stopped to last released; reap_ms: the second,
short stop that collects the copy; and the whole command's wall time, which
includes writing the core).  gcore (gdb stops the process for the whole
dump) is timed GCORE_REPS times per case.  Cores are deleted as soon as
they are measured.

    python3 bench/run_ptrace_pause.py                       # 1 and 4 GiB, 1 and 16 threads
    python3 bench/run_ptrace_pause.py --sizes 1 --threads 1 --reps 3 --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import BENCH, build, machine, med, print_machine, spread, table  # noqa: E402


def run_case(exe: Path, gib: float, threads: int, reps: int, gcore_reps: int, tmp: Path) -> dict:
    p = subprocess.Popen([str(exe), str(gib), str(threads)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    res = {"fork": [], "pause": [], "reap": [], "wall": [], "gcore": [], "core_bytes": 0}
    try:
        ready = p.stdout.readline().split()
        assert ready and ready[0] == "ready", ready
        for _ in range(reps):
            p.stdin.write("fork\n")
            p.stdin.flush()
            w = p.stdout.readline().split()
            res["fork"].append(int(w[1]) / 1e6)
            d = Path(tempfile.mkdtemp(prefix="ptrace-", dir=tmp))
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "forensics", "snapshot", str(p.pid),
                                   "--json", "--dir", str(d)], capture_output=True, text=True,
                                  check=True, env=dict(os.environ, XDG_STATE_HOME=str(d)))
            res["wall"].append(time.perf_counter() - t0)
            doc = json.loads(done.stdout)
            res["pause"].append(doc["pause_ms"])
            res["reap"].append(doc["reap_ms"] or 0.0)
            res["core_bytes"] = doc["core_bytes"]
            shutil.rmtree(d)
        for _ in range(gcore_reps):
            d = Path(tempfile.mkdtemp(prefix="gcore-", dir=tmp))
            t0 = time.perf_counter()
            subprocess.run(["gcore", "-o", str(d / "core"), str(p.pid)], check=True,
                           capture_output=True)
            res["gcore"].append((time.perf_counter() - t0) * 1e3)
            shutil.rmtree(d)
    finally:
        p.stdin.write("quit\n")
        p.stdin.flush()
        p.wait(timeout=120)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4", help="GiB of live heap, comma separated")
    ap.add_argument("--threads", default="1,16", help="thread counts, comma separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gcore-reps", type=int, default=1)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if shutil.which("gcore") is None:
        args.gcore_reps = 0
    tmp = Path(args.tmp)
    work = Path(tempfile.mkdtemp(prefix="ptb-", dir=tmp))
    try:
        return run(args, build(BENCH / "ptracebench.c", work / "ptracebench", ["-O2", "-g", "-pthread"]), tmp)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, exe: Path, tmp: Path) -> int:
    m = machine()
    print_machine(m)
    rows = []
    for gib in (float(s) for s in args.sizes.split(",")):
        for n in (int(t) for t in args.threads.split(",")):
            r = run_case(exe, gib, n, args.reps, args.gcore_reps, tmp)
            fork, pause = med(r["fork"]), med(r["pause"])
            gcore = med(r["gcore"]) if r["gcore"] else None
            rows.append([f"{gib:g}", n, f"{fork:.2f} {spread(r['fork'])}",
                         f"{pause:.2f} {spread(r['pause'])}", f"{pause / fork:.2f}x",
                         f"{med(r['reap']):.2f}", f"{med(r['wall']):.2f}",
                         f"{gcore:.0f}" if gcore is not None else "-",
                         f"{gcore / pause:.0f}x" if gcore is not None else "-"])
    table("ptrace snapshot pause (ms) beside a bare fork and gcore",
          ["GiB", "threads", "bare fork", "ptrace pause", "pause/fork", "reap", "command s",
           "gcore ms", "gcore/pause"], rows, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
