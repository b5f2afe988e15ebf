#!/usr/bin/env python3
"""Does libtag's cost grow with the threads that allocate?  allocbench (and,
with --db-bench, RocksDB's db_bench fillrandom,readrandom) at 1, 2, ... N
threads (N: this machine's CPUs, or --threads), bare, under libtag and under
heaptrack, interleaved rep by rep; the ratio to bare at each thread count.
A flat row of ratios is the goal (docs/design.md, "Per-stack counters: a
shard a thread"); run it unchanged on a machine with many CPUs.

    python3 bench/run_threads.py                       # 1..nproc threads, 3 reps
    python3 bench/run_threads.py --threads 1,2 --iters 10000000 --reps 3 --markdown
    python3 bench/run_threads.py --db-bench --threads 1,2 --reps 3 --markdown

db_bench is Debian's (rocksdb-tools): the one on PATH, else the packages
fetched once with apt-get download into $XDG_CACHE_HOME/forensics/rocksdb
and unpacked there (nothing installed).  Each run writes a fresh database of
--db-num keys a thread in a scratch directory, then reads as many.

--env KEY=VALUE (repeatable) sets a libtag variable for the libtag runs
(e.g. LIBTAG_QUARANTINE_FILL=256 to see the fill's share).
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
from benchlib import BENCH, CACHE, build, lib_path, machine, med, print_machine, spread, table  # noqa: E402


# db_bench and the libraries Debian 12's librocksdb7.8 needs beyond a base system
ROCKSDB_DEBS = ["rocksdb-tools", "librocksdb7.8", "libgflags2.2", "libsnappy1v5"]


def timed(cmd: list[str], env: dict, before=None) -> float:
    if before is not None:
        before()
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def db_bench() -> tuple[str, dict]:
    """(db_bench's path, the environment it needs): the one on PATH, else
    Debian's packages unpacked in the cache (fetched the first time)."""
    found = shutil.which("db_bench")
    if found:
        return found, {}
    root = CACHE / "rocksdb"
    exe = root / "usr" / "bin" / "db_bench"
    if not exe.is_file():
        debs = root / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        print(f"fetching {' '.join(ROCKSDB_DEBS)} into {debs}", file=sys.stderr)
        got = subprocess.run(["apt-get", "download", *ROCKSDB_DEBS], cwd=debs,
                             capture_output=True, text=True)
        if got.returncode != 0:
            sys.exit(f"run_threads: cannot fetch db_bench: "
                     f"{(got.stderr.strip().splitlines() or ['?'])[-1]}")
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return str(exe), {"LD_LIBRARY_PATH": str(root / "usr" / "lib" / "x86_64-linux-gnu")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", help="thread counts, comma separated (default 1..nproc)")
    ap.add_argument("--iters", type=int, default=2_000_000, help="iterations a thread")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lib", help="libtag.so (default: the installed one)")
    ap.add_argument("--no-heaptrack", action="store_true")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--db-bench", action="store_true",
                    help="time db_bench fillrandom,readrandom instead of allocbench")
    ap.add_argument("--db-num", type=int, default=300_000, help="db_bench keys a thread")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    counts = ([int(t) for t in args.threads.split(",")] if args.threads
              else list(range(1, (os.cpu_count() or 1) + 1)))
    lib = lib_path(args.lib)
    tmp = Path(tempfile.mkdtemp(prefix="threads-"))
    try:
        base_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        if args.db_bench:
            exe, need = db_bench()
            base_env.update(need)
            db = tmp / "db"

            def command(n: int) -> list[str]:
                return [exe, "--benchmarks=fillrandom,readrandom", f"--threads={n}",
                        f"--num={args.db_num}", f"--db={db}"]

            def fresh() -> None:
                shutil.rmtree(db, ignore_errors=True)
            what = f"db_bench fillrandom,readrandom --num={args.db_num}"
        else:
            exe = build(BENCH / "allocbench.c", tmp / "allocbench", ["-O2", "-g", "-pthread"])

            def command(n: int) -> list[str]:
                return [str(exe), str(n), str(args.iters)]
            fresh = None
            what = f"allocbench THREADS {args.iters}"
        lt_env = dict(base_env, LD_PRELOAD=str(lib), LIBTAG_QUIET="1", LIBTAG_DIR=str(tmp))
        lt_env.update(kv.split("=", 1) for kv in args.env)
        heaptrack = None if args.no_heaptrack else shutil.which("heaptrack")
        m = machine()
        print_machine(m)
        times: dict[tuple[int, str], list[float]] = {}
        for _ in range(args.reps):
            for n in counts:
                cmd = command(n)
                times.setdefault((n, "bare"), []).append(timed(cmd, base_env, fresh))
                times.setdefault((n, "libtag"), []).append(timed(cmd, lt_env, fresh))
                if heaptrack:
                    out = tmp / "ht"
                    times.setdefault((n, "heaptrack"), []).append(
                        timed([heaptrack, "-o", str(out), *cmd], base_env, fresh))
                    for f in tmp.glob("ht*"):
                        f.unlink()
        rows = []
        for n in counts:
            bare = med(times[(n, "bare")])
            row = [n, f"{bare:.2f} {spread(times[(n, 'bare')])}"]
            for mode in ("libtag", "heaptrack"):
                if (n, mode) in times:
                    t = med(times[(n, mode)])
                    row += [f"{t:.2f} {spread(times[(n, mode)])}", f"{t / bare:.2f}x"]
                else:
                    row += ["-", "-"]
            rows.append(row)
        extra = f" ({' '.join(args.env)})" if args.env else ""
        table(f"{what}: wall s and ratio to bare{extra}",
              ["threads", "bare s", "libtag s", "libtag", "heaptrack s", "heaptrack"], rows,
              markdown=args.markdown)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
