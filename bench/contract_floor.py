#!/usr/bin/env python3
"""The floor of the heap issue's contract where nothing is instrumented:
bench/contract_floor.c, an interposer that does only what the contract asks
(a 16-byte tag and an 8-byte canary, a full stack at every malloc and free
walked from frame pointers and interned by one probe, the free checked by
slot arithmetic and against tag and canary, the first 256 bytes filled and
checked through a 1 MiB FIFO quarantine, the coarse clock) and nothing else
libtag does, timed against libtag on the same binaries, interleaved.

Not a product build and not a tool (see the C file's header for what it
leaves out).  Columns:

  base        the binary alone (glibc)
  libtag      libtag as it is (the installed one, or --lib)
  libtag/c    libtag doing what the floor does: no per-stack counters, no
              guard sampling, no sweep (LIBTAG_STACK_STATS=0,
              LIBTAG_GUARD_RATE=0, LIBTAG_SWEEP=0)
  floor       contract_floor.c on libtag's heap, full frame-pointer stacks
  floor/1     the same, the return address alone (CF_DEPTH=1): no walk
  floor/noq   the same as floor, no quarantine (CF_QUARANTINE=0)
  floor/mi    contract_floor.c on Debian's mimalloc (when libmimalloc-dev
              is installed), full stacks
  mimalloc    Debian's mimalloc alone

Programs: lua's binary_trees (bench/run_real.py's -O2 and frame-pointer
builds: in -O2 no frame pointers exist, so "floor" walks nothing and equals
floor/1 there), bench/allocbench.c built the same two ways, and Debian's
python3 under PYTHONMALLOC=malloc (run_real.py's workload; -O2, so one
frame a stack in the floor).

It prints the wall-time ratios and the peak-RSS ratios to base.

    python3 bench/contract_floor.py                      # 5 reps, ~4 min
    python3 bench/contract_floor.py --reps 7 --markdown
    python3 bench/contract_floor.py --programs allocbench --iters 10000 --reps 1   # a smoke run

The floors come from CMake (bench/CMakeLists.txt; benchlib.cmake_target
builds them in build/bench the first time).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_real  # noqa: E402
from benchlib import (BENCH, Launcher, build, cmake_target, lib_path, machine, med, print_machine,  # noqa: E402
                      spread, table)

MIMALLOC = Path("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2")
PROGRAMS = ("lua", "allocbench", "python3")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--lib", help="libtag.so (default: the installed one)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--programs", default=",".join(PROGRAMS),
                    help=f"comma-separated, from: {', '.join(PROGRAMS)} (default: all)")
    ap.add_argument("--iters", type=int, default=3_000_000, help="allocbench's iterations (default 3000000)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    progs = [s for s in args.programs.split(",") if s]
    if not progs or any(s not in PROGRAMS for s in progs):
        ap.error(f"--programs takes a comma-separated list from: {', '.join(PROGRAMS)}")
    lib = lib_path(args.lib)
    print_machine(machine())
    with tempfile.TemporaryDirectory(prefix="contract-floor-") as d:
        tmp = Path(d)
        floor = cmake_target("contract_floor")
        floor_mi = cmake_target("contract_floor_mi", optional=True) if MIMALLOC.exists() else None
        variants = {
            "base": {},
            "libtag": {"LD_PRELOAD": str(lib)},
            "libtag/c": {"LD_PRELOAD": str(lib), "LIBTAG_STACK_STATS": "0", "LIBTAG_GUARD_RATE": "0",
                         "LIBTAG_SWEEP": "0"},
            "floor": {"LD_PRELOAD": str(floor)},
            "floor/1": {"LD_PRELOAD": str(floor), "CF_DEPTH": "1"},
            "floor/noq": {"LD_PRELOAD": str(floor), "CF_QUARANTINE": "0"},
        }
        if floor_mi:
            variants["floor/mi"] = {"LD_PRELOAD": str(floor_mi)}
            variants["mimalloc"] = {"LD_PRELOAD": str(MIMALLOC)}
        lua = run_real.PROGRAMS["lua"]
        cmds = {}  # name: (argv, environment of every column)
        for mode in ("O2", "fp"):
            if "lua" in progs:
                cmds[f"lua {mode}"] = (lua.workload(run_real.built(lua, mode), tmp), {})
            if "allocbench" in progs:
                ab = build(BENCH / "allocbench.c", tmp / f"allocbench-{mode}",
                           [*run_real.MODES[mode], "-g", "-pthread"])
                cmds[f"allocbench {mode}"] = ([str(ab), "1", str(args.iters)], {})
        py = run_real.PROGRAMS["python3"]
        if "python3" in progs and Path(py.installed).is_file():
            cmds["python3 O2"] = (py.workload(Path(py.installed), tmp), py.env)
        if not cmds:
            sys.exit("contract_floor: nothing to run (python3 is not installed)")
        launcher = Launcher(tmp)
        env0 = {k: v for k, v in os.environ.items() if not k.startswith(("LIBTAG_", "CF_"))}
        env0["LIBTAG_DIR"] = str(tmp / "snapshots")
        times = {(c, v): [] for c in cmds for v in variants}
        rss = {(c, v): [] for c in cmds for v in variants}
        for r in range(args.reps):
            for c, (cmd, env) in cmds.items():
                for v, extra in variants.items():  # interleaved: drift hits every column alike
                    dt, kib = launcher.timed(cmd, dict(env0, **env, **extra))
                    times[(c, v)].append(dt)
                    rss[(c, v)].append(kib)
            print(f"  rep {r + 1}/{args.reps} done", file=sys.stderr)
        rows = []
        for c in cmds:
            base = med(times[(c, "base")])
            rows.append([c] + [f"{med(times[(c, v)]) / base:.2f}x {spread(times[(c, v)])}" for v in variants])
        table(f"wall time / base, medians of {args.reps} interleaved runs (base: "
              + ", ".join(f"{c} {med(times[(c, 'base')]):.3f} s" for c in cmds) + ")",
              ["program"] + list(variants), rows, args.markdown)
        rows = []
        for c in cmds:
            base = med(rss[(c, "base")])
            rows.append([c] + [f"{med(rss[(c, v)]) / base:.2f}x" for v in variants])
        table("peak RSS / base, medians (base: "
              + ", ".join(f"{c} {med(rss[(c, 'base')]) / 1024:.1f} MiB" for c in cmds) + ")",
              ["program"] + list(variants), rows, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
