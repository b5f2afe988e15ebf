#!/usr/bin/env python3
"""Load soak: 16 threads churn allocations under libtag while another process
snapshots them every second.

    python bench/load_soak.py --seconds 300 [--interval 1] [--out report.json]

Builds tests/victims/rob_churn.c (-finstrument-functions), runs it under the
installed libtag for --seconds, and from a thread of this process runs
``forensics snapshot PID --json`` (a separate process each time) every
--interval seconds.  Each core is checked as soon as it is complete, then
deleted (they are ~60 MB of data each):

- ``forensics inspect --json`` reads it: exit 0, no warnings, no anomalies;
- every non-NULL slot of the victim's table (read from the core) points at a
  live tagged block starting there, whose size and thread are the ones the
  block's own header says (the victim fills a block before publishing it);

and the victim's own result (every byte it read back from its blocks equals
what a heap-free replay predicts) must be "ok".  Prints a summary with the
parent's pause per snapshot (min / median / p95 / max of libtag's pause_ns,
as ``forensics snapshot`` reports it) and writes the full report as JSON.
tests/integration/test_load.py runs this for 30 s and checks the report.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import queue
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from forensics import libpath
from forensics.cli.main import main as forensics_main
from forensics.core import Core
from forensics.reader.control import Control
from forensics.reader.heap import Heap
from forensics.reader.memory import CoreMemory

HERE = Path(__file__).resolve().parent
VICTIM = HERE.parent / "tests" / "victims" / "rob_churn.c"
THREADS, SLOTS = 16, 512
MAGIC = 0x524F42434855524E


def build(out_dir: Path) -> Path:
    exe = out_dir / "rob_churn"
    subprocess.run(["gcc", "-g", "-O1", "-pthread", "-fno-omit-frame-pointer", "-finstrument-functions",
                    f"-I{libpath.include_dir()}", "-o", str(exe), str(VICTIM)], check=True)
    return exe


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = forensics_main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def check_core(core_path: Path, table: int) -> dict:
    """What one core says: inspect's verdict and the slot-table check."""
    code, out, err = cli("inspect", "--json", str(core_path))
    rec: dict = {"inspect_exit": code, "inspect_error": err.strip()}
    if code != 0:
        return rec
    doc = json.loads(out)
    rec.update(warnings=doc["warnings"], anomalies=doc["anomalies"], reason=doc["reason"],
               live_blocks=doc["heap"]["live_blocks"], threads=len(doc["threads"]))
    mismatches, slots = [], 0
    with Core(core_path) as core:
        heap = Heap(Control(CoreMemory(core)))
        words = struct.unpack(f"<{THREADS * SLOTS}Q", core.read(table, THREADS * SLOTS * 8))
        for i, p in enumerate(words):
            if not p:
                continue
            slots += 1
            magic, tid, slot, _seq, size = struct.unpack("<QIIQQ", core.read(p, 32))
            b = heap.block_at(p)
            got = None if b is None else (b.start, b.state, b.size, b.thread)
            want = (p, "live", size, tid)
            if (magic, slot) != (MAGIC, i % SLOTS) or got != want:
                mismatches.append({"slot": i, "address": hex(p), "block": got, "header": want})
    rec.update(slots=slots, mismatches=mismatches[:20], mismatch_count=len(mismatches))
    return rec


def soak(seconds: float, interval: float, work: Path) -> dict:
    exe = build(work)
    snap_dir = work / "snaps"
    snap_dir.mkdir(mode=0o700)
    env = {**os.environ, "LD_PRELOAD": str(libpath.lib_path()), "LIBTAG_DIR": str(snap_dir),
           "XDG_STATE_HOME": str(work / "state")}
    victim = subprocess.Popen([str(exe), str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
    head = [victim.stdout.readline().split(), victim.stdout.readline().split()]
    pid, table = int(head[0][1]), int(head[1][1], 16)
    done: queue.Queue = queue.Queue()

    def finished(p: subprocess.Popen) -> subprocess.CompletedProcess:
        out, err = p.communicate(timeout=120)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def snapshotter() -> None:
        # One `forensics snapshot` process per interval, whether or not the
        # previous one has finished (writing a 16-thread core takes longer
        # than a second here): snapshots overlap, as they would under a cron
        # or a monitoring agent.  Results are handed over in the order asked.
        inflight: list[subprocess.Popen] = []
        t_next = time.monotonic() + interval
        while victim.poll() is None:
            time.sleep(max(0.0, t_next - time.monotonic()))
            t_next += interval
            if victim.poll() is not None:
                break
            inflight.append(subprocess.Popen(
                [sys.executable, "-m", "forensics", "snapshot", str(pid), "--json", "--timeout", "60"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work))
            while inflight and inflight[0].poll() is not None:
                done.put(finished(inflight.pop(0)))
        for p in inflight:
            r = finished(p)
            if r.returncode != 0 and ("no process" in r.stderr or "exited before" in r.stderr):
                continue  # asked as the victim was finishing: not a lost snapshot
            done.put(r)
        done.put(None)

    th = threading.Thread(target=snapshotter, daemon=True)
    th.start()
    records = []
    checked: dict[int, dict] = {}  # seq -> the core's check
    os.environ["XDG_STATE_HOME"] = str(work / "state")
    while (r := done.get()) is not None:
        rec: dict = {"exit": r.returncode, "error": r.stderr.strip()}
        if r.returncode == 0:
            snap = json.loads(r.stdout)
            seq = snap["seq"]
            rec.update(seq=seq, pause_ms=snap["pause_ms"], core_bytes=snap["core_bytes"],
                       threads_stopped=snap.get("threads_stopped"))
            # Two requests whose signals arrive together are served by one
            # snapshot (a standard signal pending twice is delivered once):
            # both commands report that core.  Check it once, keep it until
            # no later request can name it, and say it was shared.
            rec["shared"] = seq in checked
            if seq not in checked:
                checked[seq] = check_core(Path(snap["core"]), table)
                for old in [k for k in checked if k < seq - 4]:
                    shutil.rmtree(snap["dir"].replace(f"-{seq}-on-demand", f"-{old}-on-demand"),
                                  ignore_errors=True)
            rec.update(checked[seq])
        records.append(rec)
    out, err = victim.communicate(timeout=120)
    th.join(timeout=120)
    # Snapshots no request reported: two requests racing (separate processes
    # whose signals can arrive in either order) may both take the first
    # snapshot that started after they asked, leaving the other one to
    # nobody.  Such a snapshot is an extra one, not a lost one: it must be
    # complete all the same.
    from forensics.snapshots import snapdir
    unclaimed = []
    for d in snapdir.list_dirs(snap_dir, pid):
        if d.seq in checked:
            continue
        try:
            snapdir.wait_complete(d, 60)
            ok = snapdir.find_core(d.path) is not None
        except Exception as e:  # noqa: BLE001 - reported, not raised
            ok = f"{type(e).__name__}: {e}"
        unclaimed.append({"seq": d.seq, "reason": d.reason, "complete": ok})
    pauses = sorted(r["pause_ms"] for r in records if "pause_ms" in r)
    return {
        "seconds": seconds,
        "interval": interval,
        "victim_exit": victim.returncode,
        "victim_result": out.splitlines()[-1] if out else "",
        "victim_threads": [ln for ln in out.splitlines() if ln.startswith("thread ")],
        "victim_stderr": [ln for ln in err.splitlines() if not ln.startswith("libtag: snapshot ")],
        "snapshots": records,
        "unclaimed": unclaimed,
        "pause_ms": {
            "n": len(pauses),
            "min": pauses[0] if pauses else None,
            "median": statistics.median(pauses) if pauses else None,
            "p95": pauses[int(0.95 * (len(pauses) - 1))] if pauses else None,
            "max": pauses[-1] if pauses else None,
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--out", help="write the full report here (JSON)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="load-soak-") as tmp:
        report = soak(args.seconds, args.interval, Path(tmp))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        return 0
    snaps = report["snapshots"]
    bad = [s for s in snaps if s["exit"] != 0 or s.get("inspect_exit") != 0 or s.get("mismatch_count")
           or s.get("warnings") or s.get("anomalies")]
    p = report["pause_ms"]
    print(f"victim: exit {report['victim_exit']}, {report['victim_result']}, "
          f"{sum(int(t.split()[4]) for t in report['victim_threads'])} operations in {args.seconds:.0f} s")
    shared = sum(1 for s in snaps if s.get("shared"))
    print(f"snapshots: {len(snaps)} asked, {len(snaps) - shared} distinct cores ({shared} requests "
          f"served by the core of a request made at the same time), {len(bad)} failed or inconsistent, "
          f"{sum(s.get('slots', 0) for s in snaps if not s.get('shared'))} published blocks checked "
          f"against their tags")
    if p["n"]:
        print(f"parent pause per snapshot (ms): min {p['min']:.2f}  median {p['median']:.2f}  "
              f"p95 {p['p95']:.2f}  max {p['max']:.2f}  (n={p['n']})")
    else:  # a run shorter than the first snapshot
        print("parent pause per snapshot (ms): no snapshot was taken")
    for s in bad[:10]:
        print("  bad:", json.dumps(s)[:400])
    return 0 if not bad and report["victim_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
