#!/usr/bin/env python3
"""What each part of libtag costs per malloc+free pair: instructions
(callgrind: deterministic) and wall nanoseconds (medians of interleaved runs:
noisy on a shared machine), by turning one part off at a time and measuring
what goes away.  On bench/allocbench.c by default, or on a real program.

    python3 bench/parts.py                        # 3 builds, 5 reps
    python3 bench/parts.py --builds O2 --reps 7 --markdown
    python3 bench/parts.py --program lua --builds O2,fp,instr   # a real program
    python3 bench/parts.py --program python3      # Debian's, installed: O2 only

--program runs one of bench/run_real.py's programs (built the same way, from
the same cache) on its workload instead of allocbench; its pairs are the
frees libtag counts in one untimed run (LIBTAG_STATS=1).  Under callgrind it
runs a smaller workload where run_real.py names one (lua: binary_trees.lua
11; python3: py_objects.py 2), whose frees are counted the same way.

Each build (O2: -O2; fp: -O2 -fno-omit-frame-pointer; instr: -O2
-finstrument-functions; allocbench runs one thread) runs these
configurations, interleaved:

  base            the binary on glibc's malloc, without libtag
  heap            bench/heap_shim.c: libtag's heap alone, nothing around it
  libtag          libtag with its defaults (full stacks at every malloc and free)
  -quarantine     LIBTAG_QUARANTINE=0: no quarantine ring, fill or check
  -full stacks    O2, fp: LIBTAG_FP_DEPTH=1, one-frame stacks (the walk
                  stops at malloc's caller; the walk cache is still probed).
                  instr: LIBTAG_UNWIND=shadow, the shadow stack alone (no
                  CFI walk from the allocation to the innermost instrumented
                  frame); the shadow stack's hooks and memo stay in core
  -stack stats    LIBTAG_STACK_STATS=0
  -guard          LIBTAG_GUARD_RATE=0 (the default samples 1 in 5000)
  -sweep          LIBTAG_SWEEP=0 (instrumented builds only sweep)
  core            all of the above off: the tag, the canary, the checks at
                  free, the clock reads, a one-frame (instr: shadow) capture
  header          not libtag: bench/header_shim.c, a 16-byte header and
                  8-byte canary a block through glibc, written and checked, nothing
                  else - the floor any tagging interposer pays

The list: base; heap (heap minus base: negative where libtag's heap is
cheaper than glibc's); each part (libtag minus libtag without it); core
over the heap (core minus heap) and, from callgrind's profile of the core
run, what of it is the clock reads (functions named clock_gettime /
__vdso_*), the one-frame capture (_tag_capture with what it calls), in the
instrumented build the trace hooks (__cyg_profile_func_*, less glibc's
empty ones in base) and the tag (the rest: header, canary, checks, the
interposer); then libtag's total over base.  Parts turned off one at a
time need not add up to the total exactly: they share work.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (BENCH, Launcher, build, callgrind, callgrind_costs, function_name,  # noqa: E402
                      header_shim, heap_shim, lib_path, libtag_stats, machine, med, print_machine, spread,
                      table)

BUILDS = {"O2": ["-O2"], "fp": ["-O2", "-fno-omit-frame-pointer"],
          "instr": ["-O2", "-finstrument-functions"]}


def stacks_off(build_name: str) -> dict:
    """What turns full stacks off: one-frame walks where nothing is
    instrumented (LIBTAG_UNWIND=shadow would miss the walk cache at every
    capture there), the shadow stack alone where everything is."""
    return {"LIBTAG_UNWIND": "shadow"} if build_name == "instr" else {"LIBTAG_FP_DEPTH": "1"}


def parts(build_name: str) -> list[tuple[str, dict]]:
    """(name, what turns it off) of each part, in the list's order."""
    return [("quarantine", {"LIBTAG_QUARANTINE": "0"}),
            ("full stacks", stacks_off(build_name)),
            ("stack stats", {"LIBTAG_STACK_STATS": "0"}),
            ("guard sampling", {"LIBTAG_GUARD_RATE": "0"}),
            ("sweep", {"LIBTAG_SWEEP": "0"})]


def profile(cmd: list[str], env: dict, out: Path) -> dict:
    """cmd's instructions under callgrind: its total, the clock reads' own,
    _tag_capture's inclusive and the trace hooks' inclusive."""
    callgrind(cmd, env, out)
    total, own = callgrind_costs(out)
    _, incl = callgrind_costs(out, inclusive=True)
    by_name: dict[str, int] = {}
    for n, fn in incl:  # a function may be listed twice (with and without its object)
        name = function_name(fn)
        by_name[name] = max(n, by_name.get(name, 0))
    return {"total": total,
            "clock": sum(n for n, fn in own if re.match(r"clock_gettime|__vdso_", function_name(fn))),
            "capture": by_name.get("_tag_capture", 0),
            "hooks": sum(n for name, n in by_name.items() if name.startswith("__cyg_profile_func_"))}


def signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libtag.so to preload (default: the installed package's)")
    ap.add_argument("--builds", default="O2,fp,instr", help="comma-separated: O2, fp, instr")
    ap.add_argument("--iters", type=int, default=3_000_000, help="allocbench iterations per timed run")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each configuration")
    ap.add_argument("--callgrind-iters", type=int, default=200_000,
                    help="allocbench iterations under callgrind (0: skip instruction counts, "
                         "with --program too)")
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
        small = f"size {real.small}" if real.small else "the same workload"
        print(f"libtag: {lib}; {real.name}, {args.reps} reps; callgrind: "
              + (small if args.callgrind_iters else "skipped"))
    else:
        print(f"libtag: {lib}; allocbench, 1 thread, {args.iters} iterations per timed run, "
              f"{args.reps} reps; callgrind: {args.callgrind_iters} iterations")

    summary: dict[str, dict[str, tuple[float | None, float | None]]] = {}
    with tempfile.TemporaryDirectory(prefix="forensics-parts-") as tmp_s:
        tmp = Path(tmp_s)
        launcher = Launcher(tmp)
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("LIBTAG_")}
        base_env.update(real.env or {} if real else {})  # python3: PYTHONMALLOC=malloc
        lt_env = dict(base_env, LD_PRELOAD=str(lib), LIBTAG_LOG="off", LIBTAG_DIR=str(tmp / "snaps"))
        heap_env = dict(base_env, LD_PRELOAD=str(heap_shim()))
        header_env = dict(base_env, LD_PRELOAD=str(header_shim()))
        for b in builds:
            off = parts(b)
            core_env = dict(lt_env, **{k: v for _, o in off for k, v in o.items()})
            configs = [("base", base_env), ("heap", heap_env), ("libtag", lt_env),
                       *((f"-{name}", dict(lt_env, **o)) for name, o in off),
                       ("core", core_env), ("header", header_env)]
            if real:
                scratch = tmp / "scratch"
                scratch.mkdir(exist_ok=True)
                exe = run_real.built(real, b)
                # argv anew before every run: sqlite3's starts from an empty database
                cmd = lambda: real.workload(exe, scratch)  # noqa: E731
                cg_cmd = lambda: real.workload(exe, scratch, *([real.small] if real.small else []))  # noqa: E731
                pairs = libtag_stats(cmd(), lt_env)["frees"]
                cg_pairs = libtag_stats(cg_cmd(), lt_env)["frees"] if real.small else pairs
                title = f"{real.name} {b} ({' '.join(run_real.MODES[b])}; {pairs} frees a timed run"
                title += f", {cg_pairs} under callgrind)" if real.small else ")"
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
            prof = {name: profile(cg_cmd(), env, tmp / "cg.out") for name, env in configs} \
                if args.callgrind_iters else {}
            ir = {name: pr["total"] / cg_pairs for name, pr in prof.items()}

            def diff(d: dict, a: str, z: str) -> float | None:
                return d[a] - d[z] if d else None
            capture = "capture left in core (one frame" + ("; instr: the shadow stack's)" if b == "instr" else ")")
            rows: list[tuple[str, float | None, float | None, str]] = [
                ("base (glibc)", ns["base"], ir.get("base"), spread(secs["base"])),
                ("heap (libtag's minus glibc's)", diff(ns, "heap", "base"), diff(ir, "heap", "base"),
                 spread(secs["heap"])),
                *((name, diff(ns, "libtag", f"-{name}"), diff(ir, "libtag", f"-{name}"), "-")
                  for name, _ in off),
                ("core over the heap", diff(ns, "core", "heap"), diff(ir, "core", "heap"), spread(secs["core"]))]
            if prof:
                core = {k: v / cg_pairs for k, v in prof["core"].items()}
                hooks = core["hooks"] - prof["base"]["hooks"] / cg_pairs
                tag = ir["core"] - ir["heap"] - core["clock"] - core["capture"] - hooks
                rows += [("- of which clock reads", None, core["clock"], "-"),
                         (f"- of which {capture}", None, core["capture"], "-"),
                         ("- of which the trace hooks (instr)", None, hooks if b == "instr" else None, "-"),
                         ("- of which the tag (the rest)", None, tag, "-")]
            rows += [("libtag, all parts", diff(ns, "libtag", "base"), diff(ir, "libtag", "base"),
                      spread(secs["libtag"])),
                     ("header-only floor (not libtag: 24 B a block, checked)", diff(ns, "header", "base"),
                      diff(ir, "header", "base"), spread(secs["header"]))]
            cells = [[what, f"{n:.0f}" if what.startswith("base") else signed(n), sp,
                      "-" if i is None else f"{i:.0f}" if what.startswith("base") else signed(i)]
                     for what, n, i, sp in rows]
            for label, name in (("libtag", "libtag"), ("libtag's heap alone", "heap"),
                                ("libtag without its quarantine", "-quarantine"), ("header-only floor", "header")):
                cells.append([f"ratio {label} / base", f"{ns[name] / ns['base']:.2f}x", "-",
                              f"{ir[name] / ir['base']:.2f}x" if ir else "-"])
            table(f"{title}: cost per malloc+free pair",
                  ["part", "wall ns/op", "spread", "Ir/op"], cells, args.markdown)
            if prof:
                captures = libtag_stats(cg_cmd(), core_env)["captures"]
                print(f"{b}: the capture left in core: {prof['core']['capture'] / max(captures, 1):.0f} Ir "
                      f"a capture ({captures} captures, {captures / cg_pairs:.2f} a pair)")
            for what, n, i, _ in rows:
                summary.setdefault(what.replace(capture, "capture left in core"), {})[b] = (i, n)
            summary.setdefault("ratio libtag / base", {})[b] = (
                ir["libtag"] / ir["base"] if ir else None, ns["libtag"] / ns["base"])
    if len(builds) > 1:
        def cell(what: str, i: float | None, n: float | None) -> str:
            if what.startswith("ratio"):
                return f"{i:.2f}x / {n:.2f}x" if i is not None else f"- / {n:.2f}x"
            fmt = (lambda x: "-" if x is None else f"{x:.0f}") if what.startswith("base") else signed
            return f"{fmt(i)} / {fmt(n)}"
        table(f"{real.name if real else 'allocbench'}: Ir / wall ns a malloc+free pair, by build",
              ["part", *builds],
              [[what, *(cell(what, *by[b]) if b in by else "-" for b in builds)] for what, by in summary.items()],
              args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
