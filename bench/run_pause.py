#!/usr/bin/env python3
"""Snapshot pause vs a bare fork() vs gcore, at 1 GiB and 4 GiB of live heap.

The target (docs/benchmarks.md): the time the parent is stopped by a snapshot must be <= 1.3x a
bare fork() of the same process.  For each heap size and each core path
(LIBTAG_CORE=self: libtag's child writes the ELF core; kernel: the child
aborts and the kernel dumps it) one pausebench process under libtag
measures, in itself, REPS pairs of a bare fork then a snapshot (each core
waited for and deleted before the next pair).  gcore is then timed on the same process
(gdb stops it for the whole dump), in the first process of each size only.

    python3 bench/run_pause.py                 # 1 and 4 GiB, 5 reps
    python3 bench/run_pause.py --sizes 1 --reps 3 --markdown

Cores go to a temporary directory (--tmp, default /tmp) and are deleted as
soon as each is complete; the script checks free disk space first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import BENCH, build, lib_path, machine, med, print_machine, spread, table  # noqa: E402


def run_one(exe: Path, lib: Path, gib: float, reps: int, core: str, tmp: Path,
            gcore_reps: int) -> dict:
    snaps = Path(tempfile.mkdtemp(prefix="snaps-", dir=tmp))
    env = dict(os.environ, LD_PRELOAD=str(lib), LIBTAG_QUIET="1", LIBTAG_DIR=str(snaps),
               LIBTAG_CORE=core)
    p = subprocess.Popen([str(exe), str(gib), str(reps), str(snaps)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    res = {"fork": [], "pause": [], "clone": [], "call": [], "core_s": [], "core_bytes": 0,
           "gcore": [], "gcore_bytes": 0}
    try:
        for line in p.stdout:
            w = line.split()
            print(f"  [{gib:g} GiB, {core}] {line.rstrip()}", file=sys.stderr)
            if w[0] == "heap":
                res["blocks"] = int(w[4])
                res["rss_kib"] = int(w[10])
            elif w[0] == "fork":
                res["fork"].append(int(w[2]) / 1e6)
            elif w[0] == "snapshot":
                kv = dict(zip(w[1::2], w[2::2]))
                res["pause"].append(int(kv["pause_ns"]) / 1e6)
                res["clone"].append(int(kv["fork_ns"]) / 1e6)
                res["call"].append(int(kv["call_ns"]) / 1e6)
                res["core_s"].append(float(kv["core_s"]))
                res["core_bytes"] = int(kv["core_bytes"])
                res["core_disk"] = int(kv["core_disk"])
            elif w[0] == "GCORE-READY":
                pid = int(w[1])
                for _ in range(gcore_reps):
                    out = tmp / "gcore"
                    t0 = time.perf_counter()
                    # gdb must not run under libtag: a clean environment
                    genv = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "LIBTAG_"))}
                    subprocess.run(["gcore", "-o", str(out), str(pid)], env=genv, check=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    res["gcore"].append((time.perf_counter() - t0) * 1e3)
                    f = Path(f"{out}.{pid}")
                    res["gcore_bytes"] = f.stat().st_size
                    f.unlink()
                p.stdin.write("q\n")
                p.stdin.flush()
    finally:
        p.stdin.close()
        rc = p.wait()
        shutil.rmtree(snaps, ignore_errors=True)
    if rc != 0:
        sys.exit(f"pausebench exited {rc}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4", help="GiB of live heap, comma-separated (default 1,4)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gcore-reps", type=int, default=2)
    ap.add_argument("--cores", default="self,kernel", help="LIBTAG_CORE values to run")
    ap.add_argument("--tmp", default="/tmp", help="where cores are written (and deleted)")
    ap.add_argument("--lib", help="libtag.so (default: the installed one)")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = ap.parse_args()

    lib = lib_path(args.lib)
    m = machine()
    print_machine(m)
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    print(f"libtag: {lib}\ncore_pattern: {pattern!r}")
    cores = args.cores.split(",")
    if "kernel" in cores and (pattern.startswith("|") or "/" in pattern):
        print("core_pattern is not a plain file name: the kernel row is skipped")
        cores.remove("kernel")

    tmp = Path(tempfile.mkdtemp(prefix="fx-pause-", dir=args.tmp))
    os.chmod(tmp, 0o700)
    try:
        exe = build(BENCH / "pausebench.c", tmp / "pausebench", ["-O2", "-g", "-pthread"], ["-ldl"])
        rows, ratio_rows = [], []
        for gib in [float(s) for s in args.sizes.split(",")]:
            free = shutil.disk_usage(tmp).free / 2**30
            if free < 2.5 * gib + 2:
                print(f"skipping {gib:g} GiB: only {free:.0f} GiB free in {tmp}")
                continue
            for i, core in enumerate(cores):
                r = run_one(exe, lib, gib, args.reps, core, tmp, args.gcore_reps if i == 0 else 0)
                f, pz, cl, ca = med(r["fork"]), med(r["pause"]), med(r["clone"]), med(r["call"])
                rows.append([f"{gib:g} GiB, core={core}", r["blocks"], f"{r['rss_kib'] / 2**20:.2f}",
                             f"{f:.1f} {spread(r['fork'])}", f"{pz:.1f} {spread(r['pause'])}",
                             f"{cl:.1f}", f"{ca:.1f} {spread(r['call'])}",
                             f"{med(r['core_s']):.1f}", f"{r['core_bytes'] / 2**30:.2f} / {r['core_disk'] / 2**30:.2f}",
                             f"{med(r['gcore']) / 1e3:.1f} {spread(r['gcore'])}" if r["gcore"] else "-"])
                target = "meets" if pz / f <= 1.3 else "MISSES"
                pairs = [s / b for s, b in zip(r["pause"], r["fork"])]
                ratio_rows.append([f"{gib:g} GiB, core={core}", f"{pz / f:.2f}x ({target} ≤1.3x)",
                                   f"{med(pairs):.2f}x ({min(pairs):.2f}-{max(pairs):.2f})",
                                   f"{ca / f:.2f}x",
                                   f"{med(r['gcore']) / f:.0f}x" if r["gcore"] else "-"])
        table(f"Snapshot pause (ms, median of {args.reps}; ± = half the min-max range)",
              ["heap", "blocks", "RSS GiB", "bare fork ms", "snapshot pause ms", "of which clone ms",
               "libtag_snapshot() call ms", "core done s", "core GiB (size / on disk)", "gcore s"],
              rows, args.markdown)
        table("Ratios vs the bare fork of the same process",
              ["heap", "snapshot pause / fork (medians)", "per pair: median (min-max)",
               "snapshot call / fork", "gcore / fork"],
              ratio_rows, args.markdown)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
