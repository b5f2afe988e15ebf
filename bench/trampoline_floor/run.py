#!/usr/bin/env python3
"""The trampoline prototype's floor (tramp.c) against a full frame-pointer walk.

    python3 bench/trampoline_floor/run.py                 # everything
    python3 bench/trampoline_floor/run.py --reps 3 --skip-callgrind

Builds tramp.so (gcc -O2 -fPIC -shared -fno-omit-frame-pointer), deepstack and
firebench into --out (default: a temporary directory), then
  1. wall: lua's frame-pointer build on binary_trees.lua N (14) bare and under
     every configuration, interleaved, --reps repetitions; median seconds and
     the ratio to bare; every run's stdout must equal the bare run's;
  2. verify: marker mode with a full walk at every capture, each placement, on
     lua and deepstack; mismatching ids must be 0;
  3. callgrind: total Ir of lua binary_trees.lua 11 and of deepstack at depths
     10, 40, 160 per configuration; Ir per capture = (Ir - Ir of `none`) /
     captures;
  4. firebench: the cost of one trampoline fire.
Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LUA = Path.home() / ".cache/forensics/real/lua-2.8-fp/lua"
BT = REPO / "bench/workloads/binary_trees.lua"

# name -> extra environment
CONFIGS = {
    "none": {"TRAMP_MODE": "none"},
    "walk": {"TRAMP_MODE": "walk"},
    "marker inner": {"TRAMP_MODE": "marker", "TRAMP_PLACE": "inner"},
    "marker junction": {"TRAMP_MODE": "marker", "TRAMP_PLACE": "junction"},
}
LINE = re.compile(
    r"tramp: mode=(\S+) place=(\S+) jdepth=(\d+) captures=(\d+) frames=(\d+) \S+ "
    r"fires=(\d+) \S+ mismatches=(\d+) short=(\d+)"
)


def build(out: Path) -> dict[str, Path]:
    so, deep, fire = out / "tramp.so", out / "deepstack", out / "firebench"
    cmds = [
        ["gcc", "-O2", "-fPIC", "-shared", "-fno-omit-frame-pointer", "-o", str(so), str(HERE / "tramp.c")],
        ["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(deep), str(HERE / "deepstack.c")],
        ["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(fire), str(HERE / "firebench.c")],
    ]
    for c in cmds:
        print("$", " ".join(c), file=sys.stderr)
        subprocess.run(c, check=True)
    return {"so": so, "deep": deep, "fire": fire}


def tramp_line(stderr: str) -> dict[str, int]:
    m = None
    for m in LINE.finditer(stderr):
        pass
    if m is None:
        raise SystemExit(f"no tramp line in:\n{stderr[-2000:]}")
    keys = ("captures", "frames", "fires", "mismatches", "short")
    return {k: int(m.group(i)) for k, i in zip(keys, (4, 5, 6, 7, 8))}


def env_for(so: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["LD_PRELOAD"] = str(so)
    return env


def wall(so: Path, n: int, reps: int) -> None:
    cmd = [str(LUA), str(BT), str(n)]
    print(f"\n### Wall: `{' '.join(cmd)}`, {reps} reps interleaved\n")
    bare_out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    times: dict[str, list[float]] = {"bare": []}
    for c in CONFIGS:
        times[c] = []
    for _ in range(reps):
        for name in times:
            env = dict(os.environ) if name == "bare" else env_for(so, CONFIGS[name])
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            times[name].append(time.perf_counter() - t0)
            if r.returncode != 0 or r.stdout != bare_out:
                raise SystemExit(f"{name}: exit {r.returncode} or different output\n{r.stderr[-2000:]}")
    base = statistics.median(times["bare"])
    print("| configuration | median s | min-max s | ratio to bare |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.3f} | {min(ts):.3f}-{max(ts):.3f} | {med / base:.2f}x |")


def verify(so: Path, cmd: list[str], label: str) -> None:
    print(f"\n### Verify: `{label}`\n")
    print("| placement | captures | frames/capture | fires/capture | mismatches | short walks |")
    print("|---|---|---|---|---|---|")
    for place in ("inner", "junction"):
        r = subprocess.run(cmd, env=env_for(so, {"TRAMP_MODE": "verify", "TRAMP_PLACE": place}),
                           capture_output=True, text=True, check=True)
        t = tramp_line(r.stderr)
        c = t["captures"]
        print(f"| {place} | {c} | {t['frames'] / c:.2f} | {t['fires'] / c:.3f} | {t['mismatches']} | {t['short']} |")


def callgrind(so: Path, cmd: list[str], out: Path, tag: str) -> dict[str, tuple[int, dict[str, int]]]:
    res = {}
    for name, extra in CONFIGS.items():
        cg = out / f"cg.{tag}.{name.replace(' ', '_')}"
        envs = [f"{k}={v}" for k, v in extra.items()]
        full = ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={cg}",
                "env", f"LD_PRELOAD={so}", *envs, *cmd]
        print("$", " ".join(full), file=sys.stderr)
        r = subprocess.run(full, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}")
        ir = None
        for line in cg.read_text().splitlines():
            if line.startswith("totals:") or line.startswith("summary:"):
                ir = int(line.split()[1])
        assert ir is not None
        res[name] = (ir, tramp_line(r.stderr))
    return res


def cg_table(res: dict[str, tuple[int, dict[str, int]]]) -> None:
    none_ir = res["none"][0]
    print("| configuration | Ir (M) | captures | frames/capture | fires/capture | Ir/capture over `none` |")
    print("|---|---|---|---|---|---|")
    for name, (ir, t) in res.items():
        c = t["captures"]
        per = f"{(ir - none_ir) / c:.1f}" if c else "-"
        fpc = f"{t['frames'] / c:.2f}" if c else "-"
        fic = f"{t['fires'] / c:.3f}" if c else "-"
        print(f"| {name} | {ir / 1e6:.1f} | {c} | {fpc} | {fic} | {per} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="build and callgrind output directory")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=14, help="binary_trees size for the wall runs")
    ap.add_argument("--cg-n", type=int, default=11, help="binary_trees size under callgrind")
    ap.add_argument("--depths", default="10,40,160")
    ap.add_argument("--deep-iters", type=int, default=10000)
    ap.add_argument("--junction-j", default="",
                    help="extra junction configurations with these TRAMP_JDEPTH values, e.g. 2,8")
    ap.add_argument("--only-lua", action="store_true", help="skip deepstack and firebench")
    ap.add_argument("--skip-wall", action="store_true")
    ap.add_argument("--skip-callgrind", action="store_true")
    a = ap.parse_args()
    if not LUA.exists():
        raise SystemExit(f"{LUA} is missing: `python3 bench/run_real.py --help` says how it is built")
    for j in filter(None, a.junction_j.split(",")):
        CONFIGS[f"marker junction J={j}"] = {"TRAMP_MODE": "marker", "TRAMP_PLACE": "junction", "TRAMP_JDEPTH": j}
    out = a.out or Path(tempfile.mkdtemp(prefix="tramp_floor."))
    out.mkdir(parents=True, exist_ok=True)
    b = build(out)
    if not a.skip_wall:
        wall(b["so"], a.n, a.reps)
    verify(b["so"], [str(LUA), str(BT), str(a.n)], f"lua binary_trees.lua {a.n}")
    depths = [] if a.only_lua else [int(d) for d in a.depths.split(",")]
    for d in depths:
        verify(b["so"], [str(b["deep"]), str(d), str(a.deep_iters)], f"deepstack {d} {a.deep_iters}")
    if not a.skip_callgrind:
        print(f"\n### Callgrind: lua binary_trees.lua {a.cg_n}\n")
        cg_table(callgrind(b["so"], [str(LUA), str(BT), str(a.cg_n)], out, "lua"))
        rows = []
        if not depths:
            return
        for d in depths:
            res = callgrind(b["so"], [str(b["deep"]), str(d), str(a.deep_iters)], out, f"deep{d}")
            print(f"\n### Callgrind: deepstack {d} {a.deep_iters}\n")
            cg_table(res)
            rows.append((d, res))
        print("\n### Ir per capture over `none` by depth\n")
        print("| depth | frames/capture (walk) | walk | marker inner | marker junction |")
        print("|---|---|---|---|---|")
        for d, res in rows:
            none_ir = res["none"][0]
            w = res["walk"][1]
            cells = [f"{(res[k][0] - none_ir) / res[k][1]['captures']:.1f}"
                     for k in ("walk", "marker inner", "marker junction")]
            print(f"| {d} | {w['frames'] / w['captures']:.1f} | " + " | ".join(cells) + " |")
    if a.only_lua:
        return
    print("\n### firebench\n")
    r = subprocess.run([str(b["fire"])], capture_output=True, text=True, check=True)
    print("```\n" + r.stdout + "```")


if __name__ == "__main__":
    main()
