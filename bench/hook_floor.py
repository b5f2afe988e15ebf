#!/usr/bin/env python3
"""The floor of the -finstrument-functions hooks: what lua's instrumented
build would cost if libtag's enter and exit hooks did no more than record
(fn, site, stack pointer) and count the depth - the least a shadow stack
can keep - instead of finding each entry's CFA and checking the entries
against it (what keeps the shadow stack exact under longjmp, exceptions and
signals: docs/design.md, "Exact shadow stacks").

Not a product build: it copies this checkout (`git archive HEAD`) into a
temporary directory, replaces the two hooks in libtag/src/hooks.c with the
minimal ones, builds that libtag, and times lua's instrumented build
(bench/run_real.py's, built into its cache the first time) interleaved:

  base      lua without libtag
  libtag    libtag as it is
  exact/fp  libtag with LIBTAG_UNWIND=fp: captures walk the frames, so the
            hooks' shadow stack serves no capture and only the hooks differ
  least/fp  the minimal hooks, LIBTAG_UNWIND=fp

"least/fp - exact/fp" is what the exact hooks cost beyond the least ones;
"libtag" minus that is the estimate of libtag with hooks that cheap (its
captures would then have to find the CFA of the entries pushed since the
last capture themselves: ~2.75 a capture on lua, not measured here).

    python3 bench/hook_floor.py                   # binary_trees.lua 14, 5 reps
    python3 bench/hook_floor.py --reps 7 --callgrind
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_real  # noqa: E402
from benchlib import (BENCH, Launcher, callgrind, callgrind_costs, lib_path, machine, med,  # noqa: E402
                      print_machine, spread)

ROOT = BENCH.parent
LEAST_HOOKS = '''TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_enter(void *this_fn, void *call_site)
{
    struct tag_thread_state *t = _tag_tls.t;
    uint64_t d = t->shadow.depth;
    if (TAG_LIKELY(d < TAG_SHADOW_MAX)) {
        t->shadow.fn[d] = (uint64_t)(uintptr_t)this_fn;
        t->shadow.site[d] = (uint64_t)(uintptr_t)call_site;
        t->shadow.sp[d] = (uint64_t)(uintptr_t)__builtin_dwarf_cfa();
    }
    t->shadow.depth = (uint32_t)d + 1;
}

TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_exit(void *this_fn, void *call_site)
{
    (void)this_fn;
    (void)call_site;
    struct tag_thread_state *t = _tag_tls.t;
    if (t->shadow.depth)
        t->shadow.depth--;
}
'''


def build_least(tmp: Path) -> Path:
    """libtag with the least hooks, built from this checkout's HEAD in tmp."""
    src = tmp / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    hooks = src / "libtag" / "src" / "hooks.c"
    text = hooks.read_text()
    start = text.index("TAG_EXPORT TAG_NOINSTR void __cyg_profile_func_enter")
    hooks.write_text(text[:start] + LEAST_HOOKS)
    build = tmp / "build"
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j2", "--target", "libtag_shared"],
                   check=True, capture_output=True)
    return build / "libtag" / "libtag.so"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--lib", help="libtag.so as it is (default: the installed one)")
    ap.add_argument("--n", default="14", help="binary_trees.lua's depth (default 14)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--callgrind", action="store_true",
                    help="also count instructions (binary_trees.lua 11) under callgrind")
    args = ap.parse_args()
    lib = lib_path(args.lib)
    lua = run_real.PROGRAMS["lua"]
    exe = run_real.built(lua, "instr")
    print_machine(machine())
    with tempfile.TemporaryDirectory(prefix="hook-floor-") as d:
        tmp = Path(d)
        least = build_least(tmp)
        launcher = Launcher(tmp)
        cmd = lua.workload(exe, tmp, args.n)
        variants = {
            "base": {},
            "libtag": {"LD_PRELOAD": str(lib)},
            "exact/fp": {"LD_PRELOAD": str(lib), "LIBTAG_UNWIND": "fp"},
            "least/fp": {"LD_PRELOAD": str(least), "LIBTAG_UNWIND": "fp"},
        }
        env0 = dict(os.environ, LIBTAG_DIR=str(tmp / "snapshots"))
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.reps):
            for name, extra in variants.items():  # interleaved: drift hits every variant alike
                times[name].append(launcher.timed(cmd, dict(env0, **extra))[0])
        base = med(times["base"])
        print(f"lua -finstrument-functions binary_trees.lua {args.n}, {args.reps} interleaved runs")
        for name, ts in times.items():
            print(f"  {name:9} {med(ts):7.3f} s  {spread(ts):>5}  {med(ts) / base:5.2f}x")
        hooks = med(times["exact/fp"]) - med(times["least/fp"])
        est = med(times["libtag"]) - hooks
        print(f"  the exact hooks beyond the least: {hooks:.3f} s; libtag with the least hooks, "
              f"estimated: {est:.3f} s = {est / base:.2f}x")
        if args.callgrind:
            for name in ("exact/fp", "least/fp"):
                out = tmp / f"cg-{name.replace('/', '-')}.out"
                callgrind(lua.workload(exe, tmp, lua.small), dict(env0, **variants[name]), out)
                print(f"  callgrind binary_trees.lua {lua.small}, {name}: {callgrind_costs(out)[0]:,} instructions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
