"""Shared helpers of the bench/ runners: stdlib only, rich if it is there.

Finding libtag, building a C program, the floors CMake builds
(bench/CMakeLists.txt), statistics that admit the noise (median with
min-max spread), the machine description, and tables that print as
Markdown (to paste into docs/benchmarks.md) or through rich.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# what the runners fetch and build once: sdists, builds, Debian packages
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "forensics"
SDISTS = Path(os.environ.get("FORENSICS_SDIST_DIR") or CACHE / "sdists")


def fetch_sdist(package: str, version: str, sdist: str, who: str) -> Path:
    """The sdist file *sdist* of package==version in SDISTS, downloaded with
    pip the first time (only the package from source: its build
    requirements may be wheels); *who* names the runner in the error."""
    path = SDISTS / sdist
    if not path.is_file():
        SDISTS.mkdir(parents=True, exist_ok=True)
        print(f"fetching {package}=={version} into {SDISTS}", file=sys.stderr)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                               package, f"{package}=={version}", "-d", str(SDISTS)],
                              capture_output=True, text=True)
        if done.returncode != 0 or not path.is_file():
            sys.exit(f"{who}: cannot fetch {package}=={version}: "
                     f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return path


def lib_path(explicit: str | None = None) -> Path:
    """The libtag.so to preload: --lib, $FORENSICS_LIBTAG, else the installed one.

    Asked of a Python started outside the source tree, so the installed
    package answers, not the checkout (which has no built _lib/)."""
    if explicit:
        return Path(explicit).resolve()
    out = subprocess.run(
        [sys.executable, "-c", "from forensics.libpath import lib_path; print(lib_path())"],
        cwd="/", capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("bench: cannot find libtag.so (pip install the package or pass --lib):\n"
                 + out.stderr.strip().splitlines()[-1])
    return Path(out.stdout.strip())


def build(src: Path, out: Path, flags: list[str], libs: list[str] = ()) -> Path:
    cmd = ["gcc", *flags, "-o", str(out), str(src), *libs]
    subprocess.run(cmd, check=True)
    return out


def cmake_target(name: str, optional: bool = False) -> Path | None:
    """bench/'s CMake target name (a floor, name.so; bench/CMakeLists.txt)
    from the build in $FORENSICS_BENCH_BUILD (ctest's, already built), else
    built now in this checkout's build/bench (configured the first time,
    then incremental).  optional: None where CMake does not build it
    (contract_floor_mi without libmimalloc-dev)."""
    ready = os.environ.get("FORENSICS_BENCH_BUILD")
    out = Path(ready or ROOT / "build" / "bench")
    if not ready:
        if not (out / "CMakeCache.txt").is_file():
            run_quiet(["cmake", "-S", str(ROOT), "-B", str(out), "-DFORENSICS_BENCH=ON"])
        done = subprocess.run(["cmake", "--build", str(out), "--target", name],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 and not optional:
            sys.exit(f"bench: building {name} failed:\n{(done.stdout + done.stderr)[-2000:]}")
    path = out / "bench" / f"{name}.so"
    if path.is_file():
        return path
    if optional:
        return None
    sys.exit(f"bench: CMake built no {path}")


def run_quiet(cmd: list[str]) -> None:
    """cmd, its output shown only when it fails (then the benchmark exits)."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-2000:]}")


def header_shim() -> Path:
    """bench/header_shim.c, built by CMake: the floor under libtag's figures
    (a 16-byte header and 8-byte canary a block through glibc, nothing else)."""
    return cmake_target("header_shim")


def heap_shim() -> Path:
    """bench/heap_shim.c, built by CMake on libtag's heap (its seam, CMake's
    libtag_heap): the heap alone, with no tag, stack or quarantine - the
    backing allocator's column."""
    return cmake_target("heap_shim")


def callgrind(cmd: list[str], env: dict, out: Path) -> None:
    """Run cmd under callgrind (instructions only), its profile into out."""
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def callgrind_costs(out: Path, inclusive: bool = False) -> tuple[int, list[tuple[int, str]]]:
    """(the program's instructions, [(instructions, 'file:function [object]')],
    largest first) of a callgrind profile: every function, its own
    instructions or, inclusive, with those of what it calls.  Without the
    annotated source (whose lines would read as functions too)."""
    ann = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                          "--auto=no", "--threshold=100", str(out)],
                         capture_output=True, text=True, check=True).stdout
    total, funcs = 0, []
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(\S.*)$", line)
        if not m:
            continue
        n, what = int(m.group(1).replace(",", "")), m.group(2).strip()
        if what == "PROGRAM TOTALS":
            total = n
        elif total and ":" in what:
            funcs.append((n, what))
    return total, funcs


def function_name(fn: str) -> str:
    """'/path/file.c:func@@GLIBC_2.17 [/path/lib.so]' -> 'func'."""
    return re.sub(r"@.*$", "", re.sub(r" \[.*\]$", "", fn).rsplit(":", 1)[-1])


def libtag_stats(cmd: list[str], env: dict) -> dict[str, int]:
    """libtag's counters (its LIBTAG_STATS line: frees, captures, capture_frames,
    ...) of one run of cmd under env, which preloads libtag."""
    out = subprocess.run(cmd, env=dict(env, LIBTAG_STATS="1", LIBTAG_QUIET="1", LIBTAG_LOG="stderr"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    m = re.search(r"libtag: stats (.*)", out.stderr)
    if out.returncode != 0 or not m:
        sys.exit(f"bench: {' '.join(cmd)}: no LIBTAG_STATS line (exit {out.returncode})")
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


# Peak RSS must come from a process that a small process forked: a child of
# Python starts with Python's own resident set counted in ru_maxrss (it
# survives exec), which would hide a small program's few MiB.  So each timed
# run goes through this launcher, which also times the child without
# Python's start-up in the figure.
LAUNCHER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid = fork();
    if (pid == 0) { execvp(argv[2], argv + 2); _exit(127); }
    int st; struct rusage ru;
    if (wait4(pid, &st, 0, &ru) < 0) return 126;
    clock_gettime(CLOCK_MONOTONIC, &b);
    FILE *f = fopen(argv[1], "w");
    fprintf(f, "%.6f %ld\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9, ru.ru_maxrss);
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
"""


class Launcher:
    """Times commands through the C launcher above, built once into tmp."""

    def __init__(self, tmp: Path) -> None:
        (tmp / "launch.c").write_text(LAUNCHER)
        self.exe = build(tmp / "launch.c", tmp / "launch", ["-O2"])
        self.result = tmp / "launch.out"

    def timed(self, cmd: list[str], env: dict) -> tuple[float, int]:
        """Wall seconds and peak RSS (KiB) of cmd; exits the benchmark if cmd fails."""
        p = subprocess.run([str(self.exe), str(self.result), *cmd], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if p.returncode != 0:
            sys.exit(f"bench: {' '.join(cmd)} exited {p.returncode}: "
                     f"{p.stderr.decode(errors='replace').strip()[-500:]}")
        dt, rss = self.result.read_text().split()
        return float(dt), int(rss)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs) -> str:
    """min-max as a percentage of the median: how noisy the runs were."""
    if len(xs) < 2:
        return "-"
    m = med(xs)
    return f"±{(max(xs) - min(xs)) / 2 / m * 100:.0f}%" if m else "-"


def machine() -> dict:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "gcc": gcc[0] if gcc else "?",
        "mem_gib": round(mem_gib, 1),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def print_machine(m: dict) -> None:
    print(f"machine: {m['nproc']} CPUs, {m['cpu']}, {m['mem_gib']} GiB RAM, "
          f"Linux {m['kernel']}, {m['gcc']}, load {m['load']}")


def table(title: str, header: list[str], rows: list[list], markdown: bool = False) -> None:
    rows = [[str(c) for c in r] for r in rows]
    if not markdown:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            markdown = True
    if markdown:
        print(f"\n{title}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        print()
        return
    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    Console().print(t)


def which(name: str) -> str | None:
    return shutil.which(name)
