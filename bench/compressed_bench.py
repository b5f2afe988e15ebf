#!/usr/bin/env python3
"""Reading a compressed core: `forensics inspect` of core.zst, core.lz4 and
core.xz against the plain core - the same document, the time, and the peak
disk the private decompressed copy takes.

The target (docs/benchmarks.md): inspect of a compressed core takes at most
the decompression plus the plain core's inspect, gives the same --json (but
the path), and its decompressed copy takes less disk at its peak than the
core itself does.

bench/bigheap.c builds a heap under libtag - MIB MiB of ~1 KiB blocks, each
touched (non-zero), and ZERO MiB of 1 MiB buffers memset to zero (touched
pages of zeros: a program's zeroed pools and arrays, which a core holds as
data) - and snapshots itself.  Then, with the core in the page cache, per
format:

  compress      the real tool (zstd, lz4, xz -T1) on the core, once
  decompress    the tool decompressing it to a (sparse) file: the floor -
                what `zstd -d` and then inspect of the plain core costs
  inspect plain `forensics inspect --json CORE`, no index cached
  inspect packed `forensics inspect --json CORE.EXT`, no index cached
  peak copy     the most disk the copy took while it ran: the allocated
                blocks of the nameless file forensics holds, polled every
                20 ms through /proc/PID/fd

Every time is the wall time of the real command (a new Python process:
start-up included), the median of --reps runs.  Nothing here is a test: it
prints numbers.

    python3 bench/compressed_bench.py                        # 512 + 512 MiB
    python3 bench/compressed_bench.py --mib 128 --zero 128 --reps 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import BENCH, build, lib_path, machine, med, print_machine, table  # noqa: E402

# (compress to stdout, decompress IN to the file OUT: sparse, each tool's
# default for a file) - xz at -1: the compression is not what is measured
TOOLS = {
    "zstd": (["zstd", "-q", "-c"], lambda i, o: ["zstd", "-q", "-f", "-d", i, "-o", o]),
    "lz4": (["lz4", "-q", "-c"], lambda i, o: ["lz4", "-q", "-f", "-d", i, o]),
    "xz": (["xz", "-1", "-c", "-T1"], lambda i, o: ["sh", "-c", f"xz -d -c -T1 '{i}' | "
                                                   f"dd of='{o}' conv=sparse bs=1M status=none"]),
}


def take_core(exe: Path, lib: Path, mib: int, zero: int, tmp: Path) -> Path:
    snaps = Path(tempfile.mkdtemp(prefix="bigheap-", dir=tmp))
    env = dict(os.environ, LD_PRELOAD=str(lib), LIBTAG_DIR=str(snaps), LIBTAG_QUIET="1",
               LIBTAG_CORE="self")
    done = subprocess.run([str(exe), str(mib), "1024", str(zero)], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"bigheap failed ({done.returncode}): {done.stderr}")
    from forensics.snapshots import snapdir

    dirs = [d for d in snaps.iterdir() if d.is_dir()]
    snap = snapdir.wait_complete(dirs[0], 600)
    return snapdir.find_core(snap.path)


def drop_caches(core: Path) -> None:
    for suffix in (".fxidx", ".fxptr"):
        Path(f"{core}{suffix}").unlink(missing_ok=True)


def timed(cmd: list[str], stdout=subprocess.DEVNULL) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=stdout, check=True)
    return time.perf_counter() - t0


def inspect(core: Path, env: dict, copies: Path) -> tuple[float, dict, int]:
    """(seconds, the --json document, the peak bytes of disk of the
    decompressed copy) of one cold inspect of core."""
    drop_caches(core)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "forensics", "inspect", "--json", str(core)],
                            env=env, cwd="/", stdout=subprocess.PIPE, text=True)
    peak = [0]
    stop = threading.Event()

    def poll() -> None:
        fds = Path(f"/proc/{proc.pid}/fd")
        while not stop.is_set():
            try:
                for fd in fds.iterdir():
                    try:
                        if os.readlink(fd).startswith(str(copies)):
                            peak[0] = max(peak[0], os.stat(fd).st_blocks * 512)
                    except OSError:
                        continue
                # a mapping outlives its descriptor: the copy is mapped, fd closed
                for line in Path(f"/proc/{proc.pid}/maps").read_text().splitlines():
                    if str(copies) in line:
                        parts = line.split()
                        path = f"/proc/{proc.pid}/map_files/{parts[0]}"
                        try:
                            peak[0] = max(peak[0], os.stat(path).st_blocks * 512)
                        except OSError:
                            pass
                        break
            except OSError:
                pass
            stop.wait(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    out, _ = proc.communicate()
    seconds = time.perf_counter() - t0
    stop.set()
    poller.join()
    if proc.returncode != 0:
        sys.exit(f"inspect {core} failed ({proc.returncode})")
    doc = json.loads(out)
    doc["core"] = "CORE"
    return seconds, doc, peak[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="MiB of touched ~1 KiB blocks")
    ap.add_argument("--zero", type=int, default=512, help="MiB of 1 MiB buffers memset to zero")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()

    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        sys.exit(f"missing tools: {missing} (apt-get install zstd lz4 xz-utils)")
    tmp = Path(tempfile.mkdtemp(prefix="compressed-bench-"))
    try:
        exe = build(BENCH / "bigheap.c", tmp / "bigheap", ["-O1", "-g", "-fno-omit-frame-pointer"])
        core = take_core(exe, lib_path(), args.mib, args.zero, tmp)
        cache = tmp / "cache"
        copies = cache / "forensics" / "decompressed"
        env = dict(os.environ, XDG_CACHE_HOME=str(cache), XDG_STATE_HOME=str(tmp / "state"))
        st = core.stat()
        print_machine(machine())
        print(f"core: {st.st_size / 2**20:.0f} MiB apparent, {st.st_blocks * 512 / 2**20:.0f} MiB "
              f"on disk (du), {args.mib} MiB of blocks + {args.zero} MiB of zeroed buffers")
        plain_times, plain_doc = [], None
        for _ in range(args.reps):
            s, plain_doc, _ = inspect(core, env, copies)
            plain_times.append(s)
        rows = [["plain", f"{st.st_blocks * 512 / 2**20:.0f}", "-", "-",
                 f"{med(plain_times):.2f}", "-", "-", "-"]]
        for kind, (pack, unpack) in TOOLS.items():
            packed = Path(f"{core}.{kind}")
            with open(packed, "wb") as f:
                t_pack = timed([*pack, str(core)], stdout=f)
            out = tmp / "decompressed"
            t_unpack = med([timed(unpack(str(packed), str(out))) for _ in range(args.reps)])
            out.unlink()
            times, peaks = [], []
            for _ in range(args.reps):
                s, doc, peak = inspect(packed, env, copies)
                if doc != plain_doc:
                    sys.exit(f"inspect --json of {packed} differs from the plain core's")
                times.append(s)
                peaks.append(peak)
            rows.append([kind, f"{packed.stat().st_size / 2**20:.1f}", f"{t_pack:.1f}",
                         f"{t_unpack:.2f}", f"{med(times):.2f}",
                         f"{t_unpack + med(plain_times):.2f}", f"{max(peaks) / 2**20:.0f}",
                         "same"])
            packed.unlink()
        table("inspect of a compressed core (seconds; MiB)",
              ["format", "file MiB", "compress s", "decompress s (tool)", "inspect s",
               "decompress + plain inspect s", "peak copy MiB", "--json"], rows, args.markdown)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
