#!/usr/bin/env python3
"""Reading a compressed core: `forensics inspect` of core.zst, core.lz4 and
core.xz against the plain core - the same document, the CPU and wall time,
and the peak disk the private decompressed copy takes.

The target (docs/benchmarks.md): inspect of a compressed core takes at most
the decompression plus the plain core's inspect, gives the same --json (but
the path), and its decompressed copy takes less disk at its peak than the
core itself does.

bench/bigheap.c builds a heap under libtag - MIB MiB of ~1 KiB blocks, each
touched (non-zero), and ZERO MiB of 1 MiB buffers memset to zero (touched
pages of zeros: a program's zeroed pools and arrays, which a core holds as
data) - and snapshots itself.  Each format's file is made once by the real
tool (zstd, lz4, xz -1 -T1; and lz4 as systemd-coredump writes it: 256 KiB
linked blocks, no content checksum).  Then, with the files in the page
cache, --reps rounds, each running in turn:

  inspect plain `forensics inspect --json CORE`, no index cached
  and per format:
  decompress    the tool decompressing the file to a file, sparse (each
                tool's default; xz through `dd conv=sparse`)
  inspect out   `forensics inspect --json` of that file: the floor is
                decompress + inspect out - what `zstd -d` and then inspect
                of the plain core costs; decompress + inspect plain is
                beside it (the tool's file is sparse, the core was not: its
                holes are pages the kernel makes when they are read)
  inspect packed `forensics inspect --json CORE.EXT`, no index cached
  peak copy     the most disk the copy took while it ran: the allocated
                blocks of the nameless file forensics holds, polled every
                20 ms through /proc/PID/fd

Each command is a new process (start-up included), measured by its CPU
time (user + system, its children's included) and its wall time; the
figures are medians over the rounds, the floor the median of each round's
sum.  On a machine shared with other work, the CPU time is the figure to
compare: the wall time also holds the waits for a CPU.  Nothing here is a
test: it prints numbers.

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

def _lz4_d(i: str, o: str) -> list[str]:
    return ["lz4", "-q", "-f", "-d", i, o]


# name: (its file's suffix, compress IN to stdout, decompress IN to the file
# OUT: sparse, each tool's default for a file) - xz at -1: the compression is
# not what is measured
TOOLS = {
    "zstd": ("zst", ["zstd", "-q", "-c"], lambda i, o: ["zstd", "-q", "-f", "-d", i, "-o", o]),
    "lz4": ("lz4", ["lz4", "-q", "-c"], _lz4_d),
    # systemd-coredump's compress_stream_lz4: LZ4F, 256 KiB linked blocks, no content checksum
    "lz4 (systemd)": ("sd.lz4", ["lz4", "-q", "-c", "-BD", "-B5", "--no-frame-crc"], _lz4_d),
    "xz": ("xz", ["xz", "-1", "-c", "-T1"], lambda i, o: ["sh", "-c", f"xz -d -c -T1 '{i}' | "
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


def timed(cmd: list[str], stdout=subprocess.DEVNULL) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of it and its children) of cmd."""
    before = os.times()
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=stdout, check=True)
    wall = time.perf_counter() - t0
    after = os.times()
    return wall, (after.children_user - before.children_user
                  + after.children_system - before.children_system)


def inspect(core: Path, env: dict, copies: Path) -> tuple[tuple[float, float], dict, int]:
    """((wall seconds, CPU seconds), the --json document, the peak bytes of
    disk of the decompressed copy) of one cold inspect of core."""
    drop_caches(core)
    before = os.times()
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
    after = os.times()
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    stop.set()
    poller.join()
    if proc.returncode != 0:
        sys.exit(f"inspect {core} failed ({proc.returncode})")
    doc = json.loads(out)
    doc["core"] = "CORE"
    return (seconds, cpu), doc, peak[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="MiB of touched ~1 KiB blocks")
    ap.add_argument("--zero", type=int, default=512, help="MiB of 1 MiB buffers memset to zero")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()

    missing = [t for t in ("zstd", "lz4", "xz", "dd") if shutil.which(t) is None]
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
        packed = {}
        for kind, (suffix, pack, _) in TOOLS.items():
            packed[kind] = Path(f"{core}.{suffix}")
            with open(packed[kind], "wb") as f:
                timed([*pack, str(core)], stdout=f)
        inspect(core, env, copies)  # a first run, not counted: the files forensics reads, cached
        plain, plain_doc = [], None
        tool = {kind: [] for kind in TOOLS}
        runs = {kind: [] for kind in TOOLS}
        unpacked = {kind: [] for kind in TOOLS}
        peaks = {kind: [] for kind in TOOLS}
        out = tmp / "decompressed"
        for _ in range(args.reps):  # rounds: each command in turn, so that load hits all alike
            t, doc, _ = inspect(core, env, copies)
            plain.append(t)
            plain_doc = plain_doc or doc
            if doc != plain_doc:
                sys.exit("inspect --json of the plain core differs between runs")
            for kind, (_, _, unpack) in TOOLS.items():
                tool[kind].append(timed(unpack(str(packed[kind]), str(out))))
                t, doc, _ = inspect(out, env, copies)
                if doc != plain_doc:
                    sys.exit(f"inspect --json of {kind}'s decompressed file differs from the core's")
                unpacked[kind].append(t)
                out.unlink()
                t, doc, peak = inspect(packed[kind], env, copies)
                if doc != plain_doc:
                    sys.exit(f"inspect --json of {packed[kind]} differs from the plain core's")
                runs[kind].append(t)
                peaks[kind].append(peak)

        def cpu_wall(ts) -> list[str]:
            return [f"{med([c for _, c in ts]):.2f}", f"{med([w for w, _ in ts]):.2f}"]

        rows = [["plain", f"{st.st_blocks * 512 / 2**20:.0f} (du)", "-", *cpu_wall(plain),
                 "-", "-", "-", "-", "-", "-"]]
        for kind in TOOLS:
            floor = [(w + uw, c + uc) for (w, c), (uw, uc) in zip(tool[kind], unpacked[kind])]
            beside = [(w + pw, c + pc) for (w, c), (pw, pc) in zip(tool[kind], plain)]
            rows.append([kind, f"{packed[kind].stat().st_size / 2**20:.1f}",
                         f"{med([c for _, c in tool[kind]]):.2f}", *cpu_wall(runs[kind]),
                         *cpu_wall(floor), *cpu_wall(beside), f"{max(peaks[kind]) / 2**20:.0f}",
                         "same as plain"])
        table(f"inspect of a compressed core (CPU = user + system seconds, wall seconds; medians "
              f"of {args.reps} rounds; MiB)",
              ["format", "file MiB", "decompress CPU s (tool)", "inspect CPU s", "wall s",
               "decompress + inspect of its file CPU s", "wall s",
               "decompress + plain inspect CPU s", "wall s", "peak copy MiB", "`--json`"],
              rows, args.markdown)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
