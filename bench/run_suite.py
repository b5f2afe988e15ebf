#!/usr/bin/env python3
"""A real project's own test suite with and without libtag: the wall-clock
ratio and whether every test ends the same way.  Not part of CI (numpy's
whole suite takes minutes bare and several times that under libtag).

    python3 bench/run_suite.py numpy                                  # numpy's whole suite
    python3 bench/run_suite.py numpy --tests numpy._core.tests.test_umath
    python3 bench/run_suite.py numpy --reps 3 --env LIBTAG_STACK_NODES=16777216
    python3 bench/run_suite.py msgpack --reps 3 --env LIBTAG_GUARD_RATE=1   # hunting mode
    python3 bench/run_suite.py regex --stats-at 60                    # the counters at 60 s too
    python3 bench/run_suite.py uvloop --env LIBTAG_GUARD_RATE=1 --keep /tmp/uv  # its snapshots kept

The suites:

  numpy    the installed numpy's own tests (--pyargs), from the Python that
           runs this script (--python: another one with numpy, pytest and
           hypothesis installed)
  msgpack  msgpack 1.1.2's test/ with its C extension (msgpack._cmsgpack)
  pyyaml   PyYAML 6.0.3's tests/legacy_tests (pytest collects them through
           the sdist's conftest.py) with the libyaml extension (yaml._yaml,
           built against Debian's libyaml-dev; PYYAML_FORCE_LIBYAML=1 makes
           a build without it fail instead of falling back to pure Python)
  regex    regex 2025.11.3's regex/tests/test_regex.py with its C engine
  greenlet greenlet 3.5.6's tests (src/greenlet/tests in the sdist), C++
           that switches stacks by copying them to and from the heap.  They
           run as the installed package's greenlet.tests (--pyargs; --tests
           takes module names there): they import compiled helpers of their
           own (greenlet.tests._test_extension, _test_extension_cpp) that pip
           builds into the package and the sdist lacks.  objgraph 3.7.0 for
           their leak checks
  zstandard  python-zstandard 0.25.0's tests/ with its C backend
           (zstandard.backend_c; PYTHON_ZSTANDARD_IMPORT_POLICY=cext in every
           run, so a zstandard without it fails to import instead of falling
           back to cffi).  pytest's importlib import mode: tests/ is a
           package, and the default mode would put the sdist, with its
           uncompiled zstandard/, first on sys.path.  The hypothesis tests
           skip, as upstream's default (ZSTD_SLOW_TESTS unset)
  uvloop   uvloop 0.23.0's tests/ (its libuv is the sdist's vendored one,
           its C the sdist's Cython output) but four modules: test_dns
           resolves example.com (no network here but loopback),
           test_sourcecode runs flake8 and mypy over the sdist's sources
           (the tools are not installed, and it tests no compiled code),
           test_aiohttp skips every test without aiohttp, and test_process
           (82 tests, 21 s bare, each starting child processes) is left out
           for time: the 17 modules left take 112-132 s bare here (350
           tests; 2 CPUs).  pyOpenSSL 26.4.0 for test_tcp.  Its
           pyproject.toml's pytest options apply (--import-mode=importlib,
           --capture=no)

The suites but numpy come from their source packages on PyPI, fetched once
with pip into $XDG_CACHE_HOME/forensics/sdists (as bench/run_real.py's
programs), unpacked beside a virtual environment of their own under
$XDG_CACHE_HOME/forensics/suites/ (--system-site-packages: pytest comes from
the Python that runs this script) and built there from the sdist with pip,
after what only their tests import (from PyPI); nothing of theirs is
committed.  Their tests run from the unpacked sdist (greenlet's: from the
installed package) with the working directory elsewhere, so they import the
built package, never the sdist's sources (a check imports the compiled
module before any run, from the environment's own site-packages).

Every suite runs under PYTHONMALLOC=malloc so every Python object goes
through malloc and so through libtag.  Each repetition runs the suite bare,
then under libtag (LD_PRELOAD, LIBTAG_STATS=1 with LIBTAG_LOG=<a file a
process>, so no test sees libtag's lines), each with pytest's JUnit XML; the
two XML files are compared test by test.

Prints the median wall seconds of each, the ratio, the outcome counts
(passed, failed, skipped, xfailed, xpassed, errors), the tests whose outcome
differs, and libtag's counters summed over every process of the last run
(captures, frames a capture, stack nodes, stack_full; the guard pool's
blocks: the sample's, the stacks' first blocks', and the share, one
allocation in N).  --stats-at SECONDS (repeatable) also prints the pytest
process's guarded share after each of those points, from its counters then
(bench/suite_stats_at.py) and at its exit: LIBTAG_GUARD_RATE's promise holds
for the whole life of a process, not only its start.  Exit status 0 when
every test ended the same way with and without libtag, 1 otherwise, 2 when
a run's pytest wrote no results (then the end of its output, libtag's lines
and snapshots, and --keep keeps that run's files).

Then libtag's other lines of the last run, each after its process's pid: an
anomaly's (use-after-free, heap-overflow, ...: what, where, which block) and
its snapshot's (LIBTAG_ON_ANOMALY=snapshot by default), or a warning; and
the snapshots that run's processes wrote, by reason (a crash's writes no
line: greenlet's tests crash children of their own on purpose).  --keep DIR
keeps that run's files: libtag's log of each process, pytest's output and
JUnit XML, and the snapshots (snaps/), for forensics to read.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import CACHE, fetch_sdist, lib_path, machine, med, print_machine, spread  # noqa: E402

SUITES_DIR = CACHE / "suites"
BENCH = Path(__file__).resolve().parent


@dataclass
class Suite:
    tests: list[str]  # what pytest is given (an sdist's: paths inside it)
    check: str  # what the suite's Python must run first: the package, compiled
    package: str | None = None  # PyPI name: the suite is this sdist's
    version: str | None = None
    sdist: str | None = None  # the file name pip writes
    build_env: dict = field(default_factory=dict)
    # tests: modules of the installed package (pytest --pyargs), not paths
    pyargs: bool = False
    options: list[str] = field(default_factory=list)  # pytest options before the tests
    test_deps: list[str] = field(default_factory=list)  # what only the tests import (PyPI)
    run_env: dict = field(default_factory=dict)  # for the check and every run


SUITES = {
    # f2py's tests need their sources, which a wheel does not ship: their
    # collection errors (the same with and without libtag) must not stop the run
    "numpy": Suite(["--pyargs", "numpy", "--continue-on-collection-errors"],
                   "import numpy, hypothesis"),
    "msgpack": Suite(["test"], "import msgpack._cmsgpack",
                     "msgpack", "1.1.2", "msgpack-1.1.2.tar.gz"),
    "pyyaml": Suite(["tests/legacy_tests"], "import yaml._yaml",
                    "PyYAML", "6.0.3", "pyyaml-6.0.3.tar.gz", {"PYYAML_FORCE_LIBYAML": "1"}),
    "regex": Suite(["regex/tests/test_regex.py"], "import regex._regex",
                   "regex", "2025.11.3", "regex-2025.11.3.tar.gz"),
    # its tests import their own compiled helpers (greenlet.tests._test_extension,
    # _test_extension_cpp), built into the installed package and absent from
    # the sdist: the installed greenlet.tests is what runs
    "greenlet": Suite(["greenlet.tests"], "import greenlet._greenlet",
                      "greenlet", "3.5.6", "greenlet-3.5.6.tar.gz",
                      pyargs=True, test_deps=["objgraph==3.7.0"]),
    # tests/ is a package beside the sdist's zstandard/ (no backend_c in it):
    # pytest's default import mode would put the sdist first on sys.path
    "zstandard": Suite(["tests"], "import zstandard.backend_c",
                       "zstandard", "0.25.0", "zstandard-0.25.0.tar.gz",
                       options=["--import-mode=importlib"],
                       run_env={"PYTHON_ZSTANDARD_IMPORT_POLICY": "cext"}),
    # the modules of tests/ but test_dns (it resolves example.com),
    # test_sourcecode (flake8 and mypy over the sdist's sources, not the
    # extension), test_aiohttp (all skipped without aiohttp) and test_process
    # (21 s bare, for time): the rest take about 2 min bare
    "uvloop": Suite([f"tests/test_{m}.py" for m in (
                        "base", "context", "cython", "dealloc", "executors", "fs_event",
                        "libuv_api", "pipes", "process_spawning", "regr1", "runner", "signals",
                        "sockets", "tcp", "testbase", "udp", "unix")],
                    "import uvloop.loop", "uvloop", "0.23.0", "uvloop-0.23.0.tar.gz",
                    test_deps=["pyOpenSSL==26.4.0"]),
}
STAT = re.compile(r"^libtag: stats pid=(\d+) (.*)$", re.M)


def probe(python: str, s: Suite) -> str | None:
    """None when python runs the suite's check (and has pytest), else why not."""
    code = f"import pytest; {s.check}"
    if s.package:
        code += (f"\nimport importlib.metadata as m; v = m.version({s.package!r})"
                 f"\nassert v == {s.version!r}, f'{s.package} {{v}}, not {s.version}'")
        # the compiled module from the Python's own environment, not a wheel
        # in the system's site-packages the venv also sees
        mod = s.check.split()[1]
        code += (f"\nimport sys; assert {mod}.__file__.startswith(sys.prefix), "
                 f"f'{mod} from {{{mod}.__file__}}, outside {{sys.prefix}}'")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd="/",
                          env=dict(os.environ, **s.run_env))
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def prepared(name: str, s: Suite) -> tuple[str, Path]:
    """An sdist suite's Python (its virtual environment, built the first
    time) and the unpacked sdist its tests run from."""
    root = SUITES_DIR / f"src-{name}-{s.version}"
    if not root.is_dir():
        sdist = fetch_sdist(s.package, s.version, s.sdist, "run_suite")
        SUITES_DIR.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=SUITES_DIR))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        (tmp / sdist.name.removesuffix(".tar.gz")).rename(root)
        shutil.rmtree(tmp, ignore_errors=True)
    venv = SUITES_DIR / f"venv-{name}-{s.version}"
    python = str(venv / "bin" / "python")
    if not venv.is_dir():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    # the stamp: built here from the sdist (the system's site-packages, which
    # the venv sees for pytest, may hold a wheel of the same version), with
    # what only the tests import
    stamp = venv / "built-from-sdist"
    want = "".join(f"{line}\n" for line in (s.sdist, *s.test_deps))
    if not stamp.is_file() or stamp.read_text() != want:
        if s.test_deps:
            done = subprocess.run([python, "-m", "pip", "install", "-q", *s.test_deps],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"run_suite: installing {' '.join(s.test_deps)} failed:\n{done.stderr[-2000:]}")
        print(f"building {s.package} {s.version} into {venv}", file=sys.stderr)
        sdist = fetch_sdist(s.package, s.version, s.sdist, "run_suite")
        done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                               str(sdist)], env=dict(os.environ, **s.build_env),
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"run_suite: building {s.package} failed:\n{done.stderr[-2000:]}")
        stamp.write_text(want)
    return python, root


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed | failed | error | skipped | xfailed | xpassed."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        kids = {child.tag: child for child in case}
        if "failure" in kids:
            out[tid] = "xpassed" if "XPASS" in (kids["failure"].get("message") or "") else "failed"
        elif "error" in kids:
            out[tid] = "error"
        elif "skipped" in kids:
            out[tid] = "xfailed" if kids["skipped"].get("type") == "pytest.xfail" else "skipped"
        else:
            out[tid] = "passed"
    return out


def run_once(python: str, args: list[str], env: dict, junit: Path, log: Path) -> tuple[float, str]:
    """The run's wall seconds and how pytest ended ("" when it wrote its
    results)."""
    cmd = [python, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    start = time.monotonic()
    with open(log, "wb") as f:
        done = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=log.parent)
    took = time.monotonic() - start
    if junit.is_file():
        return took, ""
    rc = done.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
    return took, f"pytest wrote no results ({how} after {took:.0f} s: {' '.join(cmd)})"


def stat_lines(logs: list[Path]) -> dict[int, Counter]:
    """libtag's LIBTAG_STATS=1 counters of each process (pid -> counters)
    in the log files."""
    lines: dict[int, Counter] = {}
    text = "".join(f.read_text(errors="replace") for f in logs)
    for pid, line in STAT.findall(text):
        lines[int(pid)] = Counter({key: int(value) for key, value in
                                   (kv.split("=", 1) for kv in line.split()) if value.isdigit()})
    return lines


def other_lines(logs: list[Path]) -> list[str]:
    """libtag's lines but the counters (an anomaly, its snapshot, a warning),
    each after the pid of its file (LIBTAG_LOG's PATH.<pid>)."""
    out = []
    for f in logs:
        pid = f.suffix.lstrip(".")
        out += [f"[{pid}] {line}" for line in f.read_text(errors="replace").splitlines()
                if line and not STAT.match(line)]
    return out


def summed(lines: dict[int, Counter], skip: set[int]) -> Counter:
    """The counters summed over every process but skip ("processes": how
    many)."""
    total: Counter = Counter()
    for pid, c in lines.items():
        if pid not in skip:
            total["processes"] += 1
            total.update(c)
    return total


def one_in(allocs: int, guarded: int) -> str:
    return f"1 in {allocs / guarded:,.0f}" if guarded else "none"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--tests", nargs="+", metavar="MODULE",
                    help="numpy: run these test modules (pytest --pyargs names) instead of the whole "
                         "suite; an sdist's suite: these paths inside the sdist (greenlet's: modules of "
                         "the installed package)")
    ap.add_argument("--python", help="the Python to run the suite with (default: numpy's, the one "
                                     "running this script; an sdist's, its own environment)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--env", action="append", default=[], metavar="LIBTAG_X=V",
                    help="an extra setting for the libtag runs (repeatable)")
    ap.add_argument("--lib", help="libtag.so (default: the installed one)")
    ap.add_argument("--stats-at", action="append", type=float, default=[], metavar="SECONDS",
                    help="also take the pytest process's counters this long after its start "
                         "(repeatable; bench/suite_stats_at.py)")
    ap.add_argument("--keep", metavar="DIR",
                    help="keep the last libtag run's files in DIR (made 0700; it must not exist): "
                         "libtag's log of each process, pytest's output and libtag's snapshots "
                         "(an anomaly's), for forensics to read")
    args = ap.parse_args()
    keep = Path(args.keep).absolute() if args.keep else None
    if keep and (keep.exists() or keep.is_symlink()):
        sys.exit(f"run_suite: --keep {keep}: it exists")

    suite = SUITES[args.suite]
    targets, cwd_root = suite.tests, None
    if suite.package:
        python, cwd_root = prepared(args.suite, suite)
        python = args.python or python
        targets = (["--pyargs", *(args.tests or targets)] if suite.pyargs
                   else [str(cwd_root / t) for t in (args.tests or targets)])
    else:
        python = args.python or sys.executable
        if args.tests:
            targets = ["--pyargs", *args.tests]
    targets = [*suite.options, *targets]
    why = probe(python, suite)
    if why is not None:
        sys.exit(f"run_suite: {python} cannot run {suite.check!r} (and import pytest): {why}")
    lib = lib_path(args.lib)
    print_machine(machine())
    print(f"libtag: {lib}  suite: {args.suite} {' '.join(targets)}  python: {python}")
    if args.env:
        print(f"libtag settings: {' '.join(args.env)}")

    # a shell starts a background job (cmd &) with SIGINT ignored, and the
    # tests' processes would inherit that: uvloop's test_signals children
    # then never get their KeyboardInterrupt and each such test fails after
    # its child's 200 s sleep.  A handler here is reset to the default at exec
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = Path(tempfile.mkdtemp(prefix="fx-suite-"))
    os.chmod(tmp, 0o700)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "LIBTAG_"))}
    clean["PYTHONMALLOC"] = "malloc"
    clean.update(suite.run_env)
    if args.stats_at:
        clean["FX_STATS_AT"] = ",".join(f"{s:g}" for s in args.stats_at)
        clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), clean.get("PYTHONPATH")]))
        targets = ["-p", "suite_stats_at", *targets]
    tagged = dict(clean, LD_PRELOAD=str(lib), LIBTAG_STATS="1",
                  **dict(kv.split("=", 1) for kv in args.env))
    times: dict[str, list[float]] = {"base": [], "libtag": []}
    results: dict[str, dict[str, str]] = {}
    lines: dict[int, Counter] = {}
    said: list[str] = []
    snaps: list[str] = []
    marks: list[list[str]] = []
    try:
        for rep in range(args.reps):
            for name, env in (("base", clean), ("libtag", tagged)):
                run_dir = tmp / f"{name}-{rep}"
                run_dir.mkdir()
                junit, log = run_dir / "junit.xml", run_dir / "output.txt"
                env = dict(env, FX_STATS_AT_LOG=str(run_dir / "marks"))
                if name == "libtag":
                    # libtag's lines (the counters) to files of their own, one
                    # a process: on stderr they would be in the output of every
                    # subprocess a test reads (numpy's distutils exec_command
                    # test compares a child's stdout+stderr with "Hello")
                    env = dict(env, LIBTAG_LOG=str(run_dir / "libtag"),
                               LIBTAG_DIR=str(run_dir / "snaps"))
                took, broke = run_once(python, targets, env, junit, log)
                if broke:
                    # what pytest and libtag said before the end: the
                    # temporary directory goes with the rest
                    print(f"run_suite: {name} run: {broke}; the end of its output:", file=sys.stderr)
                    for line in log.read_text(errors="replace").splitlines()[-30:]:
                        print(f"  {line}", file=sys.stderr)
                    logs = sorted(run_dir.glob("libtag.*"))
                    for line in other_lines(logs)[:40]:
                        print(f"  {line}", file=sys.stderr)
                    if (run_dir / "snaps").is_dir():
                        print(f"  libtag's snapshots: {' '.join(sorted(d.name for d in (run_dir / 'snaps').iterdir()))}",
                              file=sys.stderr)
                    if keep:
                        keep.mkdir(mode=0o700, parents=True)
                        shutil.move(run_dir, keep / "run")
                        print(f"kept in {keep / 'run'}", file=sys.stderr)
                    return 2
                times[name].append(took)
                results[name] = outcomes(junit)
                if name == "libtag":
                    logs = sorted(run_dir.glob("libtag.*"))
                    lines, said = stat_lines(logs), other_lines(logs)
                    snaps = sorted(d.name for d in (run_dir / "snaps").iterdir()) \
                        if (run_dir / "snaps").is_dir() else []
                    marks = [m.split() for m in (run_dir / "marks").read_text().splitlines()] \
                        if (run_dir / "marks").is_file() else []
                print(f"  rep {rep + 1}/{args.reps} {name}: {times[name][-1]:.1f} s", file=sys.stderr)
        if keep:
            keep.mkdir(mode=0o700, parents=True)
            shutil.move(tmp / f"libtag-{args.reps - 1}", keep / "run")
            print(f"kept in {keep / 'run'}: libtag's logs, pytest's output, snaps/", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    base, tag = med(times["base"]), med(times["libtag"])
    print(f"\nwall seconds, median of {args.reps}: base {base:.1f} ({spread(times['base'])}), "
          f"libtag {tag:.1f} ({spread(times['libtag'])}): {tag / base:.2f}x")
    for name in ("base", "libtag"):
        count = Counter(results[name].values())
        print(f"{name:7s} " + ", ".join(f"{count[k]} {k}" for k in
                                        ("passed", "failed", "skipped", "xfailed", "xpassed", "error")))
    differ = sorted(t for t in results["base"].keys() | results["libtag"].keys()
                    if results["base"].get(t) != results["libtag"].get(t))
    print(f"tests whose outcome differs: {len(differ)}")
    for t in differ[:20]:
        print(f"  {t}: base {results['base'].get(t, 'absent')}, libtag {results['libtag'].get(t, 'absent')}")
    counters = summed(lines, {int(m[3]) for m in marks})
    if counters:
        caps = counters["captures"]
        print(f"libtag, summed over {counters['processes']} processes: "
              f"{caps} captures, {counters['capture_frames'] / caps if caps else 0:.1f} frames a "
              f"capture, {counters['stack_nodes']} stack nodes, stack_full {counters['stack_full']}, "
              f"anomalies {counters['anomalies']}")
        print(f"guarded: {counters['guard_allocs']} of {counters['allocs']} allocations "
              f"({one_in(counters['allocs'], counters['guard_allocs'])}): "
              f"{counters['guard_sampled']} sampled "
              f"({one_in(counters['allocs'], counters['guard_sampled'])}), "
              f"{counters['guard_site_firsts']} first of their stack; "
              f"{counters['guard_slots_used']} slots used, guard_faults {counters['guard_faults']}, "
              f"{counters['guard_no_slot']} found the pool full")
    # what else libtag said in the last run: an anomaly's line and its
    # snapshot's, a warning
    if said:
        print(f"libtag's other lines ({len(said)}):")
        for line in said[:40]:
            print(f"  {line}")
        if len(said) > 40:
            print(f"  ... {len(said) - 40} more")
    # its snapshots, by reason (LIBTAG_DIR's <program>-<pid>-<seq>-<reason>)
    if snaps:
        reasons = Counter(name.rsplit("-", 1)[-1] for name in snaps)
        print(f"libtag's snapshots ({len(snaps)}): "
              + ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
              + f": {' '.join(snaps[:10])}{' ...' if len(snaps) > 10 else ''}")
    # the pytest process's counters at each mark and at its exit: the share
    # guarded between them
    for mark, elapsed, parent, child in marks:
        then, end = lines.get(int(child)), lines.get(int(parent))
        if then is None or end is None:
            print(f"after {mark} s: no counters (pytest process {parent}, child {child})")
            continue
        allocs = end["allocs"] - then["allocs"]
        print(f"pytest process {parent}, after {elapsed} s (of {tag:.0f}): {allocs} allocations, "
              f"{end['guard_allocs'] - then['guard_allocs']} guarded "
              f"({one_in(allocs, end['guard_allocs'] - then['guard_allocs'])}), "
              f"{end['guard_sampled'] - then['guard_sampled']} sampled "
              f"({one_in(allocs, end['guard_sampled'] - then['guard_sampled'])}); "
              f"before: {then['allocs']} allocations, {then['guard_allocs']} guarded "
              f"({one_in(then['allocs'], then['guard_allocs'])}), {then['guard_sampled']} sampled "
              f"({one_in(then['allocs'], then['guard_sampled'])})")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())
