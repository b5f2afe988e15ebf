#!/usr/bin/env python3
"""Allocation overhead of libtag on bench/allocbench, against the same binary
without it, with heaptrack and valgrind on the same run for reference.

The goal: every build of allocbench under libtag, with full stacks on every
allocation and free (no sampling), at most 1.5x the same binary without
libtag.

    python3 bench/run_alloc.py                     # calibrate, 5 reps each
    python3 bench/run_alloc.py --iters 2000000 --reps 5 --markdown

What runs, per binary (plain: gcc -O2 -g -pthread, no frame pointers; fp:
the same with -fno-omit-frame-pointer; instrumented: plus
-finstrument-functions), interleaved rep by rep so drift hits all alike:

  base           the binary alone
  libtag         LD_PRELOAD=libtag.so LIBTAG_QUIET=1 LIBTAG_DIR=<tmp>
  libtag Q=0     the same with LIBTAG_QUARANTINE=0 (separates the quarantine's
                 memory and time from the tags')
  heaptrack      heaptrack -o <tmp>/ht ./allocbench ...  (wall time of the
                 whole command, including heaptrack's own interpretation)
  memcheck       valgrind --tool=memcheck, with --valgrind-div times fewer
                 iterations; its time is scaled per operation to compare

Extra LIBTAG_* settings for every libtag run: --env (e.g. --env
LIBTAG_GUARD_RATE=1; without it libtag runs with its defaults).

Seconds are wall-clock medians with the min-max spread; ratios are against
the base run of the SAME binary.  Memory is peak RSS (wait4's ru_maxrss, taken\nby a small C launcher: a child of Python would count Python's RSS too).
Then, per binary and LIBTAG_UNWIND mode (auto, shadow, fp, cfi): allocbench's
time, the frames per capture libtag counted (LIBTAG_STATS), and the ns per
capture of bench/capturebench.c (allocbench's call pattern with
libtag_current_stack() in place of malloc and free, timed in-process).
Then: the stack table (bench/stackcount.c: allocbench's pattern + libtag_stats)
and callgrind instruction counts (deterministic, unlike the clock) with the
top 10 functions, so the cost is explained and not only measured.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (BENCH, Launcher, build, callgrind, callgrind_costs, lib_path, libtag_stats,  # noqa: E402
                      machine, med, print_machine, spread, table)

THREADS = 2
WINDOW = 4096  # allocbench.c's WINDOW: live blocks per thread


def capture_ns(exe: Path, env: dict, iters: int) -> float:
    """ns per capture printed by bench/capturebench.c."""
    out = subprocess.run([str(exe), str(iters)], env=env, capture_output=True, text=True, check=True).stdout
    return float(out.split("ns_per_capture")[1].split()[0])


def capture_stats(exe: Path, env: dict, iters: int) -> tuple[int, int]:
    """(captures, frames) libtag counted over one allocbench run (LIBTAG_STATS=1)."""
    got = libtag_stats([str(exe), str(THREADS), str(iters)], env)
    return got["captures"], got["capture_frames"]


def chunk(n: int) -> int:
    """glibc malloc's chunk size for a request of n bytes (x86_64)."""
    return max(32, (n + 8 + 15) & ~15)


def slot(n: int) -> int:
    """libtag's heap slot for n bytes (libtag/src/heap/heap.h, _tag_heap_class):
    16-byte steps to 128, then four classes a doubling."""
    if n <= 128:
        return (n + 15) & ~15
    step = 1 << ((n - 1).bit_length() - 3)
    return (n + step - 1) // step * step


def expected_overhead() -> tuple[float, float]:
    """Mean payload and mean extra bytes per block of libtag's slots (32-byte
    tag + 8-byte canary + 16-byte minimum payload, rounded up to a size
    class) over glibc's chunks, over allocbench's size distribution (7/8:
    8..263 B; 1/8: 1024..9215 B)."""
    small = range(8, 8 + 256)
    large = range(1024, 1024 + 8192)
    def mean(sizes, f):
        return sum(f(n) for n in sizes) / len(sizes)
    payload = 7 / 8 * mean(small, lambda n: n) + 1 / 8 * mean(large, lambda n: n)
    extra = lambda n: slot(max(n, 16) + 40) - chunk(n)
    return payload, 7 / 8 * mean(small, extra) + 1 / 8 * mean(large, extra)


def callgrind_top(cmd: list[str], env: dict, out: Path, top: int = 10) -> tuple[int, list[tuple[int, str]]]:
    """cmd's instructions under callgrind and its top functions by their own."""
    callgrind(cmd, env, out)
    total, funcs = callgrind_costs(out)
    return total, funcs[:top]


def short(fn: str) -> str:
    """'/path/to/file.c:func [/path/lib.so]' -> 'func (file.c, lib.so)'."""
    m = re.match(r"(.*?):(.*?)(?: \[(.*)\])?$", fn)
    if not m:
        return fn
    src, name, obj = m.groups()
    where = [os.path.basename(src)] if src != "???" else []
    if obj:
        where.append(os.path.basename(obj))
    return f"{name} ({', '.join(where)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, help="iterations per thread (default: calibrated to --target)")
    ap.add_argument("--target", type=float, default=1.5, help="seconds of a plain base run when calibrating")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--heaptrack-reps", type=int, default=3)
    ap.add_argument("--valgrind-div", type=int, default=20, help="memcheck runs ITERS/N iterations")
    ap.add_argument("--valgrind-reps", type=int, default=3)
    ap.add_argument("--callgrind-iters", type=int, default=100000)
    ap.add_argument("--no-heaptrack", action="store_true")
    ap.add_argument("--no-valgrind", action="store_true")
    ap.add_argument("--lib", help="libtag.so (default: the installed one)")
    ap.add_argument("--modes", default="auto,shadow,fp,cfi",
                    help="LIBTAG_UNWIND modes to compare (comma-separated; '' for none)")
    ap.add_argument("--capture-iters", type=int, default=2000000,
                    help="iterations of bench/capturebench.c (2 captures each)")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    ap.add_argument("--env", action="append", default=[], metavar="LIBTAG_X=V",
                    help="an extra setting for every libtag run (repeatable), e.g. LIBTAG_GUARD_RATE=1")
    args = ap.parse_args()

    bad = [kv for kv in args.env if "=" not in kv]
    if bad:
        ap.error(f"--env takes NAME=VALUE, not {bad[0]!r}")
    lib = lib_path(args.lib)
    print_machine(machine())
    print(f"libtag: {lib}{'  ' + ' '.join(args.env) if args.env else ''}")
    tmp = Path(tempfile.mkdtemp(prefix="fx-alloc-"))
    os.chmod(tmp, 0o700)
    try:
        return run(args, lib, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, lib: Path, tmp: Path) -> int:
    timed = Launcher(tmp).timed
    src = BENCH / "allocbench.c"
    flags = ["-O2", "-g", "-pthread"]
    builds = {"plain": [], "fp": ["-fno-omit-frame-pointer"], "instrumented": ["-finstrument-functions"]}
    bins = {b: build(src, tmp / f"allocbench-{b}", flags + extra) for b, extra in builds.items()}
    counters = {b: build(BENCH / "stackcount.c", tmp / f"stackcount-{b}", flags + extra, ["-ldl"])
                for b, extra in builds.items()}
    capture = {b: build(BENCH / "capturebench.c", tmp / f"capturebench-{b}", flags + extra)
               for b, extra in builds.items()}
    modes = [m for m in args.modes.split(",") if m]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "LIBTAG_"))}
    snaps = tmp / "snaps"
    settings = dict(kv.split("=", 1) for kv in args.env)
    tagged = dict(clean, LD_PRELOAD=str(lib), LIBTAG_QUIET="1", LIBTAG_DIR=str(snaps), **settings)
    tagged_q0 = dict(tagged, LIBTAG_QUARANTINE="0")

    iters = args.iters
    if not iters:
        probe = 200000
        dt, _ = timed([str(bins["plain"]), str(THREADS), str(probe)], clean)
        iters = max(100000, int(probe * args.target / dt) // 100000 * 100000)
    ops = iters * THREADS
    vg_iters = max(1000, iters // args.valgrind_div)
    print(f"allocbench: {THREADS} threads x {iters} iterations = {ops} ops per run "
          f"(memcheck: {vg_iters} iterations per thread); median of {args.reps}")

    configs = [("base", clean), ("libtag", tagged), ("libtag Q=0", tagged_q0)]
    res = {(b, c): [] for b in bins for c, _ in configs}
    per_mode = {m: dict(tagged, LIBTAG_UNWIND=m) for m in modes}
    mres = {(b, m): [] for b in bins for m in modes}
    cres = {(b, m): [] for b in bins for m in modes}
    for b in bins:
        res[(b, "heaptrack")] = []
        res[(b, "memcheck")] = []
    have_ht = shutil.which("heaptrack") and not args.no_heaptrack
    have_vg = shutil.which("valgrind") and not args.no_valgrind
    for rep in range(args.reps):
        for b, exe in bins.items():
            for c, env in configs:
                res[(b, c)].append(timed([str(exe), str(THREADS), str(iters)], env))
            for m, env in per_mode.items():
                mres[(b, m)].append(timed([str(exe), str(THREADS), str(iters)], env)[0])
                cres[(b, m)].append(capture_ns(capture[b], env, args.capture_iters))
            if have_ht and rep < args.heaptrack_reps:
                out = tmp / "ht"
                res[(b, "heaptrack")].append(timed(["heaptrack", "-o", str(out), str(exe),
                                                    str(THREADS), str(iters)], clean))
                for f in glob.glob(f"{out}*"):
                    os.unlink(f)
            if have_vg and rep < args.valgrind_reps:
                dt, rss = timed(["valgrind", "--tool=memcheck", "-q", str(exe), str(THREADS),
                                 str(vg_iters)], clean)
                # scale per operation to the full iteration count
                res[(b, "memcheck")].append((dt * iters / vg_iters, rss))
        print(f"  rep {rep + 1}/{args.reps} done", file=sys.stderr)
    shutil.rmtree(snaps, ignore_errors=True)

    # ---------------------------------------------------------------- time
    rows, verdict = [], []
    targets = {b: 1.5 for b in bins}
    for b in bins:
        base = med([t for t, _ in res[(b, "base")]])
        for c in ["base", "libtag", "libtag Q=0", "heaptrack", "memcheck"]:
            ts = [t for t, _ in res[(b, c)]]
            if not ts:
                continue
            m = med(ts)
            note = f" (÷{args.valgrind_div} iters, scaled)" if c == "memcheck" else ""
            rows.append([f"{b}: {c}{note}", len(ts), f"{m:.3f}", spread(ts), f"{m / ops * 1e9:.0f}",
                         f"{(m - base) / ops * 1e9:+.0f}" if c != "base" else "-",
                         f"{m / base:.2f}x"])
        lt = med([t for t, _ in res[(b, "libtag")]])
        ok = lt / base <= targets[b]
        verdict.append([b, f"{lt / base:.2f}x", f"≤ {targets[b]}x", "meets" if ok else "MISSES"])
    table("Time (wall seconds, median; ± = half the min-max range; ratio vs base of the same binary)",
          ["run", "n", "seconds", "spread", "ns/op", "extra ns/op", "ratio"], rows, args.markdown)
    table("Allocation overhead goal", ["binary", "libtag / base", "goal", ""], verdict, args.markdown)

    # ------------------------------------------------------ unwind modes
    if modes:
        urows = []
        for b, exe in bins.items():
            base = med([t for t, _ in res[(b, "base")]])
            for m in modes:
                caps, frames = capture_stats(exe, per_mode[m], iters)
                ts = mres[(b, m)]
                urows.append([f"{b}: {m}", f"{med(ts):.3f}", spread(ts), f"{med(ts) / base:.2f}x",
                              f"{frames / caps:.2f}" if caps else "-",
                              f"{med(cres[(b, m)]):.0f}", spread(cres[(b, m)])])
        table("Stack capture by LIBTAG_UNWIND (allocbench seconds and ratio vs its base; "
              "frames per capture from LIBTAG_STATS; ns per capture from bench/capturebench.c)",
              ["binary: mode", "seconds", "spread", "ratio", "frames/capture", "ns/capture",
               "spread"], urows, args.markdown)

    # -------------------------------------------------------------- memory
    live = THREADS * WINDOW
    payload, extra = expected_overhead()
    mrows = []
    for b in bins:
        rb = med([r for _, r in res[(b, "base")]])
        rt = med([r for _, r in res[(b, "libtag")]])
        rq = med([r for _, r in res[(b, "libtag Q=0")]])
        rh = med([r for _, r in res[(b, "heaptrack")]]) if res[(b, "heaptrack")] else None
        mrows.append([b, f"{rb / 1024:.1f}", f"{rt / 1024:.1f}", f"{rq / 1024:.1f}",
                      f"{(rq - rb) * 1024 / live:.0f}", f"{(rt - rq) / 1024:.2f}",
                      f"{rh / 1024:.1f}" if rh else "-"])
    table(f"Memory (peak RSS MiB, median; live blocks = {THREADS} threads x {WINDOW} = {live})",
          ["binary", "base", "libtag", "libtag Q=0", "bytes/live block (Q=0 - base)",
           "quarantine MiB (libtag - Q=0)", "heaptrack (whole pipeline)"], mrows, args.markdown)
    print(f"expected from the layout: mean payload {payload:.0f} B; 32 B tag + 8 B canary + "
          f"16 B minimum payload, rounded up to libtag's size classes, add {extra:.1f} B per block "
          f"over glibc's chunks ({extra / payload * 100:.1f}% of the payload) -> {extra * live / 2**20:.2f} MiB for {live} "
          f"live blocks; quarantine budget {THREADS} x 1 MiB of requested bytes")

    # --------------------------------------------------------- stack table
    srows = []
    for b, exe in counters.items():
        out = subprocess.run([str(exe), str(THREADS), str(iters)], env=tagged, capture_output=True,
                             text=True, check=True).stdout
        line = [l for l in out.splitlines() if l.startswith("stack_count")][0].split()
        kv = dict(zip(line[0::2], line[1::2]))
        n = int(kv["stack_count"])
        srows.append([b, n, kv["stack_full"], f"{n * 16 / 1024:.1f}", kv["table_map_kib"],
                      kv["table_rss_kib"], kv["shadow_overflows"]])
    table("Stack table after one full allocbench run (bench/stackcount.c)",
          ["binary", "stack nodes", "full", "node bytes KiB (16 B/node)", "table mapping KiB",
           "table resident KiB", "shadow overflows"], srows, args.markdown)

    # ----------------------------------------------------------- callgrind
    if have_vg:
        cg = args.callgrind_iters
        cops = cg * THREADS
        crow, tops = [], {}
        runs = [(b, c, env) for b in bins for c, env in (("base", clean), ("libtag", tagged))]
        totals = {}
        for b, c, env in runs:
            total, funcs = callgrind_top([str(bins[b]), str(THREADS), str(cg)], env, tmp / "cg.out")
            totals[(b, c)] = total
            if c == "libtag":
                tops[b] = (total, funcs)
        for b in bins:
            tb, tl = totals[(b, "base")], totals[(b, "libtag")]
            crow.append([b, f"{tb / cops:.0f}", f"{tl / cops:.0f}", f"{(tl - tb) / cops:+.0f}",
                         f"{tl / tb:.2f}x"])
        table(f"Instructions per op (callgrind, {THREADS} x {cg} iterations; deterministic)",
              ["binary", "base Ir/op", "libtag Ir/op", "extra Ir/op", "ratio"], crow, args.markdown)
        if modes:
            mrow = []
            for b in bins:
                tb = totals[(b, "base")]
                row = [b, f"{tb / cops:.0f}"]
                for m in modes:
                    tm, _ = callgrind_top([str(bins[b]), str(THREADS), str(cg)], per_mode[m], tmp / "cg.out")
                    row.append(f"{tm / cops:.0f} ({tm / tb:.2f}x)")
                mrow.append(row)
            table(f"Instructions per op by LIBTAG_UNWIND (callgrind, {THREADS} x {cg} iterations)",
                  ["binary", "base"] + modes, mrow, args.markdown)
        for b, (total, funcs) in tops.items():
            table(f"Top 10 functions by own instructions: {b} allocbench under libtag "
                  f"(total {total:,} Ir = {total / cops:.0f}/op)",
                  ["function", "Ir", "share", "Ir/op"],
                  [[short(f), f"{ir:,}", f"{ir / total * 100:.1f}%", f"{ir / cops:.0f}"]
                   for ir, f in funcs], args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
