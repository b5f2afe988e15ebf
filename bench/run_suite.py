#!/usr/bin/env python3
"""A real project's own test suite with and without libtag: the wall-clock
ratio and whether every test ends the same way.  Not part of CI (numpy's
whole suite takes minutes bare and several times that under libtag).

    python3 bench/run_suite.py numpy                                  # numpy's whole suite
    python3 bench/run_suite.py numpy --tests numpy._core.tests.test_umath
    python3 bench/run_suite.py numpy --reps 3 --env LIBTAG_STACK_NODES=16777216

numpy runs from the Python that runs this script (--python: another one with
numpy, pytest and hypothesis installed), under PYTHONMALLOC=malloc so every
Python object goes through malloc and so through libtag.  Each repetition
runs the suite bare, then under libtag (LD_PRELOAD, LIBTAG_STATS=1 with
LIBTAG_LOG=<a file a process>, so no test sees libtag's lines), each
with pytest's JUnit XML; the two XML files are compared test by test.

Prints the median wall seconds of each, the ratio, the outcome counts
(passed, failed, skipped, xfailed, xpassed, errors), the tests whose outcome
differs, and libtag's counters summed over every process of the run
(captures, frames a capture, stack nodes, stack_full).  Exit status 0 when
every test ended the same way with and without libtag, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import lib_path, machine, med, print_machine, spread  # noqa: E402

SUITES = {
    # name: (what pytest is given, what it must be able to import)
    # f2py's tests need their sources, which a wheel does not ship: their
    # collection errors (the same with and without libtag) must not stop the run
    "numpy": (["--pyargs", "numpy", "--continue-on-collection-errors"], "numpy"),
}
STAT = re.compile(r"^libtag: stats pid=\d+ (.*)$", re.M)


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


def run_once(python: str, args: list[str], env: dict, junit: Path, log: Path) -> float:
    cmd = [python, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    start = time.monotonic()
    with open(log, "wb") as f:
        subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=log.parent)
    took = time.monotonic() - start
    if not junit.is_file():
        sys.exit(f"run_suite: pytest wrote no results ({' '.join(cmd)}); its output: {log}")
    return took


def stats(logs: list[Path]) -> Counter:
    """libtag's LIBTAG_STATS=1 counters, summed over every process's line
    in the log files ("processes": how many lines there were)."""
    total: Counter = Counter()
    text = "".join(f.read_text(errors="replace") for f in logs)
    for line in STAT.findall(text):
        total["processes"] += 1
        for key, value in (kv.split("=", 1) for kv in line.split()):
            if value.isdigit():
                total[key] += int(value)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--tests", nargs="+", metavar="MODULE",
                    help="run these test modules (pytest --pyargs names) instead of the whole suite")
    ap.add_argument("--python", default=sys.executable, help="the Python to run the suite with")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--env", action="append", default=[], metavar="LIBTAG_X=V",
                    help="an extra setting for the libtag runs (repeatable)")
    ap.add_argument("--lib", help="libtag.so (default: the installed one)")
    args = ap.parse_args()

    targets, module = SUITES[args.suite]
    if args.tests:
        targets = ["--pyargs", *args.tests]
    probe = subprocess.run([args.python, "-c", f"import {module}, pytest, hypothesis"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"run_suite: {args.python} cannot import {module}, pytest and hypothesis: "
                 f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    lib = lib_path(args.lib)
    print_machine(machine())
    print(f"libtag: {lib}  suite: {args.suite} {' '.join(targets)}  python: {args.python}")

    tmp = Path(tempfile.mkdtemp(prefix="fx-suite-"))
    os.chmod(tmp, 0o700)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "LIBTAG_"))}
    clean["PYTHONMALLOC"] = "malloc"
    tagged = dict(clean, LD_PRELOAD=str(lib), LIBTAG_QUIET="1", LIBTAG_STATS="1",
                  LIBTAG_DIR=str(tmp / "snaps"),
                  **dict(kv.split("=", 1) for kv in args.env))
    times: dict[str, list[float]] = {"base": [], "libtag": []}
    results: dict[str, dict[str, str]] = {}
    counters: Counter = Counter()
    try:
        for rep in range(args.reps):
            for name, env in (("base", clean), ("libtag", tagged)):
                run_dir = tmp / f"{name}-{rep}"
                run_dir.mkdir()
                junit, log = run_dir / "junit.xml", run_dir / "output.txt"
                if name == "libtag":
                    # libtag's lines (the counters) to files of their own, one
                    # a process: on stderr they would be in the output of every
                    # subprocess a test reads (numpy's distutils exec_command
                    # test compares a child's stdout+stderr with "Hello")
                    env = dict(env, LIBTAG_LOG=str(run_dir / "libtag"))
                times[name].append(run_once(args.python, targets, env, junit, log))
                results[name] = outcomes(junit)
                if name == "libtag":
                    counters = stats(sorted(run_dir.glob("libtag.*")))
                print(f"  rep {rep + 1}/{args.reps} {name}: {times[name][-1]:.1f} s", file=sys.stderr)
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
    if counters:
        caps = counters["captures"]
        print(f"libtag, summed over {counters['processes']} processes: "
              f"{caps} captures, {counters['capture_frames'] / caps if caps else 0:.1f} frames a "
              f"capture, {counters['stack_nodes']} stack nodes, stack_full {counters['stack_full']}, "
              f"anomalies {counters['anomalies']}")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())
