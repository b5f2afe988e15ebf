#!/usr/bin/env python3
"""Reading a big core: `forensics inspect` vs reading the core file once, and
`forensics whoowns` on the cached index.

The target (docs/benchmarks.md): inspect on a 1 GB core <= 3x the time to read the core file once
(page cache warm); whoowns on a cached index under 0.5 s including start-up.

bench/bigheap.c builds ~1 GiB of live heap in ~1M blocks under libtag and
snapshots itself (SIGUSR2, LIBTAG_DIR set here).  Then, in this one run,
with the core in the page cache:

  read once       read the whole core file with readinto() into one buffer
  inspect cold    `forensics inspect --json CORE` with no index cached
                  (the first inspect of a core: scan, index, symbolise)
  inspect warm    the same with the index cached beside the core
  whoowns first   `forensics whoowns ADDR --core CORE --json`: index cached,
                  the pointer edges (referrers) computed and cached
  whoowns cached  the same with both caches: the everyday question

Every figure is the wall time of the real command (a new Python process:
start-up included), the median of --reps runs; the ratios are what the targets
bound.  Nothing here is a test: it prints numbers.

    python3 bench/inspect_bench.py                    # 1024 MiB, 3 reps
    python3 bench/inspect_bench.py --mib 256 --reps 5 --markdown
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
from benchlib import BENCH, build, lib_path, machine, med, print_machine, spread, table  # noqa: E402


def forensics(*args: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "forensics", *args], env=env, cwd="/",
                          capture_output=True, text=True)
    return time.perf_counter() - t0, done


def read_once(path: Path) -> float:
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - t0


def take_core(exe: Path, lib: Path, mib: int, tmp: Path) -> tuple[Path, dict]:
    snaps = Path(tempfile.mkdtemp(prefix="bigheap-", dir=tmp))
    env = dict(os.environ, LD_PRELOAD=str(lib), LIBTAG_DIR=str(snaps), LIBTAG_QUIET="1",
               LIBTAG_CORE=os.environ.get("LIBTAG_CORE", "self"))
    t0 = time.perf_counter()
    done = subprocess.run([str(exe), str(mib)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bigheap failed ({done.returncode}): {done.stderr}")
    facts = {}
    for line in done.stdout.splitlines():
        key, *rest = line.split()
        facts[key] = rest
    from forensics.snapshots import snapdir

    dirs = [d for d in snaps.iterdir() if d.is_dir()]
    if len(dirs) != 1:
        sys.exit(f"expected one snapshot dir in {snaps}, got {dirs}")
    snap = snapdir.wait_complete(dirs[0], 600)
    core = snapdir.find_core(snap.path)
    print(f"bigheap: {facts['blocks'][0]} blocks, {int(facts['blocks'][2]) / 2**20:.0f} MiB live; "
          f"core {core.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")
    return core, facts


def drop_caches(core: Path) -> None:
    for suffix in (".fxidx", ".fxptr"):
        Path(f"{core}{suffix}").unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="live heap in MiB (default 1024)")
    ap.add_argument("--reps", type=int, default=3, help="runs of each command (default 3)")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the core goes")
    ap.add_argument("--lib", help="libtag.so (default: the installed one)")
    ap.add_argument("--keep", action="store_true", help="keep the core")
    ap.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    a = ap.parse_args()

    tmp = Path(a.tmp)
    if not tmp.is_dir():
        sys.exit(f"bench: --tmp {tmp} is not a directory")
    need = a.mib * 2**20 * 1.3
    if shutil.disk_usage(tmp).free < need:
        sys.exit(f"bench: {tmp} has less than {need / 2**30:.1f} GiB free for the core")
    lib = lib_path(a.lib)
    work = Path(tempfile.mkdtemp(prefix="inspect-bench-", dir=tmp))
    exe = build(BENCH / "bigheap.c", work / "bigheap",
                ["-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls"])
    m = machine()
    print_machine(m)
    core, facts = take_core(exe, lib, a.mib, work)
    probe = facts["probe"][0]
    state = work / "state"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    env["XDG_STATE_HOME"] = str(state)
    try:
        read_once(core)  # warm the page cache
        reads, cold, warm, who_first, who = [], [], [], [], []
        for _ in range(a.reps):
            reads.append(read_once(core))
            drop_caches(core)
            t, done = forensics("inspect", "--json", str(core), env=env)
            if done.returncode != 0:
                sys.exit(f"inspect failed: {done.stderr}")
            cold.append(t)
            doc = json.loads(done.stdout)
            t, done = forensics("inspect", "--json", str(core), env=env)
            warm.append(t)
            t, done = forensics("whoowns", probe, "--core", str(core), "--json", env=env)
            if done.returncode != 0:
                sys.exit(f"whoowns failed ({done.returncode}): {done.stderr}")
            who_first.append(t)
            for _ in range(3):
                t, done = forensics("whoowns", probe, "--core", str(core), "--json", env=env)
                who.append(t)
        answer = json.loads(done.stdout)
        t, start = forensics("lib-path", env=env)  # Python + forensics start-up alone
        heap = doc["heap"]
        print(f"inspect: {heap['live_blocks']} live blocks, {heap['live_bytes'] / 2**20:.0f} MiB; "
              f"whoowns {probe}: {answer['block']['size']} bytes, "
              f"{answer['referrer_count']} referrer(s)")
        r = med(reads)
        rows = [
            ["read the core once", f"{r:.3f}", spread(reads), "1.00x", ""],
            ["inspect, no index cached", f"{med(cold):.3f}", spread(cold),
             f"{med(cold) / r:.2f}x", "≤ 3x"],
            ["inspect, index cached", f"{med(warm):.3f}", spread(warm), f"{med(warm) / r:.2f}x", ""],
            ["whoowns, first (edges computed)", f"{med(who_first):.3f}", spread(who_first),
             f"{med(who_first) / r:.2f}x", ""],
            ["whoowns, index + edges cached", f"{med(who):.3f}", spread(who), "",
             "< 0.5 s"],
            ["start-up alone (forensics lib-path)", f"{t:.3f}", "-", "", ""],
        ]
        size = core.stat().st_size
        table(f"reading a {size / 2**30:.2f} GiB core ({a.reps} reps, median; read "
              f"{size / r / 2**30:.1f} GiB/s)", ["what", "seconds", "spread", "vs read", "target"],
              rows, markdown=a.markdown)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {core}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
