#!/usr/bin/env python3
"""What each part of libtag costs per malloc+free pair on bench/allocbench.c:
instructions (callgrind: deterministic) and wall nanoseconds (medians of
interleaved runs: noisy on a shared machine), by turning one part off at a
time and measuring what goes away.

    python3 bench/parts.py                        # 3 builds, 5 reps
    python3 bench/parts.py --builds O2 --reps 7 --markdown
    python3 bench/parts.py --program lua --builds O2   # a real program instead

--program runs one of bench/run_real.py's programs (built the same way, from
the same cache) on its workload instead of allocbench; its pairs are the
frees libtag counts in one untimed run (LIBTAG_STATS=1), and callgrind runs
the whole workload.

Each build of allocbench (O2: -O2; fp: -O2 -fno-omit-frame-pointer; instr:
-O2 -finstrument-functions) runs one thread (no contention between the two
CPUs of a small machine muddles the per-op figures):

  base            the binary without libtag
  libtag          libtag with its defaults (full stacks at every malloc and free)
  -quarantine     LIBTAG_QUARANTINE=0: no quarantine ring, fill or check
  -full stacks    LIBTAG_UNWIND=shadow: one-frame stacks where nothing is
                  instrumented (O2, fp); the shadow stack alone (instr)
  -sweep          LIBTAG_SWEEP=0 (instrumented builds only sweep)
  -stack stats    LIBTAG_STACK_STATS=0
  -guard          LIBTAG_GUARD_RATE=0 (the default samples 1 in 5000)
  core            all of the above off: the tag, the canary, the checks at
                  free, a one-frame (or shadow) capture, the clock reads
  header          not libtag: bench/header_shim.c, a 40-byte header and
                  canary a block through glibc, written and checked, nothing
                  else - the floor any tagging interposer pays

A part's cost is libtag minus libtag without it.  The instrumented build's
hooks run in base too (glibc's empty ones); their extra cost is in "core" and
"full stacks".  The clock reads are counted by callgrind in libtag's run
(functions named clock_gettime / __vdso_*).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import BENCH, Launcher, build, header_shim, lib_path, machine, med, print_machine, spread, table  # noqa: E402

BUILDS = {"O2": ["-O2"], "fp": ["-O2", "-fno-omit-frame-pointer"],
          "instr": ["-O2", "-finstrument-functions"]}
PARTS = [  # (name, what turns it off)
    ("quarantine", {"LIBTAG_QUARANTINE": "0"}),
    ("full stacks", {"LIBTAG_UNWIND": "shadow"}),
    ("sweep", {"LIBTAG_SWEEP": "0"}),
    ("stack stats", {"LIBTAG_STACK_STATS": "0"}),
    ("guard sampling", {"LIBTAG_GUARD_RATE": "0"}),
]
CORE = {k: v for _, off in PARTS for k, v in off.items()}


def callgrind(cmd: list[str], env: dict, out: Path) -> tuple[int, int]:
    """(total instructions, instructions in clock reads) of cmd."""
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ann = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out)],
                         capture_output=True, text=True, check=True).stdout
    total = clock = 0
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(.*)$", line)
        if not m:
            continue
        n, what = int(m.group(1).replace(",", "")), m.group(2)
        if "PROGRAM TOTALS" in what:
            total = n
        elif re.search(r"clock_gettime|__vdso_", what):
            clock += n
    return total, clock


def frees_of(cmd: list[str], env: dict) -> int:
    """The frees libtag counted in one run of cmd (its LIBTAG_STATS line)."""
    out = subprocess.run(cmd, env=dict(env, LIBTAG_STATS="1", LIBTAG_QUIET="1", LIBTAG_LOG="stderr"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    m = re.search(r"libtag: stats .*?\bfrees=(\d+)", out.stderr)
    if out.returncode != 0 or not m:
        sys.exit(f"bench: {' '.join(cmd)}: no LIBTAG_STATS line (exit {out.returncode})")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libtag.so to preload (default: the installed package's)")
    ap.add_argument("--builds", default="O2,fp,instr", help="comma-separated: O2, fp, instr")
    ap.add_argument("--iters", type=int, default=3_000_000, help="allocbench iterations per timed run")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each configuration")
    ap.add_argument("--callgrind-iters", type=int, default=200_000,
                    help="iterations under callgrind (0: skip instruction counts)")
    ap.add_argument("--program", help="a program of bench/run_real.py (lua, sqlite3, cmark, "
                    "brotli, python3: its O2 build only) on its workload, instead of allocbench")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = ap.parse_args()
    real = None
    if args.program:
        import run_real
        real = run_real.PROGRAMS.get(args.program)
        if real is None:
            ap.error(f"unknown program {args.program!r}: choose from {', '.join(run_real.PROGRAMS)}")
    builds = [b for b in args.builds.split(",") if b]
    if real and real.installed:
        builds = [b for b in builds if b == "O2"] or ap.error(f"{real.name} is installed, not built: --builds O2")
    bad = [b for b in builds if b not in BUILDS]
    if bad:
        ap.error(f"unknown build {bad[0]!r}: choose from {', '.join(BUILDS)}")
    lib = lib_path(args.lib)
    print_machine(machine())
    if real:
        print(f"libtag: {lib}; {real.name}, {args.reps} reps; callgrind: the same workload"
              + ("" if args.callgrind_iters else " (skipped)"))
    else:
        print(f"libtag: {lib}; allocbench, 1 thread, {args.iters} iterations per timed run, "
              f"{args.reps} reps; callgrind: {args.callgrind_iters} iterations")

    with tempfile.TemporaryDirectory(prefix="forensics-parts-") as tmp_s:
        tmp = Path(tmp_s)
        launcher = Launcher(tmp)
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("LIBTAG_")}
        base_env.update(real.env or {} if real else {})  # python3: PYTHONMALLOC=malloc
        lt_env = dict(base_env, LD_PRELOAD=str(lib), LIBTAG_LOG="off", LIBTAG_DIR=str(tmp / "snaps"))
        configs = [("base", base_env), ("libtag", lt_env)]
        configs += [(f"-{name}", dict(lt_env, **off)) for name, off in PARTS]
        configs.append(("core", dict(lt_env, **CORE)))
        configs.append(("header", dict(base_env, LD_PRELOAD=str(header_shim(tmp)))))
        for b in builds:
            if real:
                scratch = tmp / "scratch"
                scratch.mkdir(exist_ok=True)
                exe = run_real.built(real, b)
                # argv anew before every run: sqlite3's starts from an empty database
                cmd = cg_cmd = lambda: real.workload(exe, scratch)  # noqa: E731
                pairs = cg_pairs = frees_of(cmd(), lt_env)
                title = f"{real.name} {b} ({' '.join(run_real.MODES[b])}; {pairs} frees a run)"
            else:
                exe = build(BENCH / "allocbench.c", tmp / f"ab-{b}", [*BUILDS[b], "-g", "-pthread"])
                cmd = lambda: [str(exe), "1", str(args.iters)]  # noqa: E731
                cg_cmd = lambda: [str(exe), "1", str(args.callgrind_iters)]  # noqa: E731
                pairs, cg_pairs = args.iters, args.callgrind_iters
                title = f"allocbench {b} ({' '.join(BUILDS[b])})"
            secs: dict[str, list[float]] = {name: [] for name, _ in configs}
            for _ in range(args.reps):
                for name, env in configs:  # interleaved: drift hits every configuration alike
                    secs[name].append(launcher.timed(cmd(), env)[0])
            ns = {name: med(v) / pairs * 1e9 for name, v in secs.items()}
            ir: dict[str, float] = {}
            clock_ir = 0.0
            if args.callgrind_iters:
                for name, env in configs:
                    total, clock = callgrind(cg_cmd(), env, tmp / "cg.out")
                    ir[name] = total / cg_pairs
                    if name == "libtag":
                        clock_ir = clock / cg_pairs
            rows = []
            def row(what, n, i, sp="-"):
                rows.append([what, f"{n:+.0f}" if what != "base" else f"{n:.0f}", sp,
                             f"{i:+.0f}" if ir and what != "base" else (f"{i:.0f}" if ir else "-")])
            row("base", ns["base"], ir.get("base", 0), spread(secs["base"]))
            for name, _ in PARTS:
                row(name, ns["libtag"] - ns[f"-{name}"], ir.get("libtag", 0) - ir.get(f"-{name}", 0))
            row("header-only floor (not libtag: 40 B a block, checked)", ns["header"] - ns["base"],
                ir.get("header", 0) - ir.get("base", 0), spread(secs["header"]))
            row("core (tag, canary, checks, one-frame capture, clock)", ns["core"] - ns["base"],
                ir.get("core", 0) - ir.get("base", 0), spread(secs["core"]))
            if ir:
                rows.append(["  of which clock reads", "-", "-", f"{clock_ir:+.0f}"])
            row("libtag, all parts", ns["libtag"] - ns["base"], ir.get("libtag", 0) - ir.get("base", 0),
                spread(secs["libtag"]))
            for label, name in (("libtag", "libtag"), ("libtag without its quarantine", "-quarantine"),
                                ("header-only floor", "header")):
                rows.append([f"ratio {label} / base", f"{ns[name] / ns['base']:.2f}x", "-",
                             f"{ir[name] / ir['base']:.2f}x" if ir else "-"])
            table(f"{title}: cost per malloc+free pair",
                  ["part", "wall ns/op", "spread", "Ir/op"], rows, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
