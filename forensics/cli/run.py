"""Run a command with libtag preloaded, snapshots going to a private directory.

    forensics run [--dir DIR] [--on-anomaly snapshot|abort|ignore] -- CMD [ARGS]
    forensics run --leaks [--suppress FILE] [--json FILE] [--top N] -- CMD [ARGS]
    forensics run --fail-on anomaly,leak -- CMD [ARGS]

CMD runs with LD_PRELOAD=<libtag.so> (before any LD_PRELOAD already set),
LIBTAG_DIR=DIR and LIBTAG_ON_ANOMALY.  DIR defaults to
$XDG_STATE_HOME/forensics/snapshots and is created 0700.  The exit status is
CMD's; a CMD killed by a signal gives 128+signal, as a shell does.

When CMD has exited, the snapshots it left in DIR (on demand, on an anomaly,
on a crash) are waited for, recorded in the catalog (forensics list) and
named on stderr with the command to look at them.

--leaks: a leak check at exit, as LeakSanitizer does it.  libtag takes an
exit snapshot (LIBTAG_AT_EXIT=snapshot) when CMD calls exit() or returns
from main, after its atexit handlers and static destructors; every process
CMD starts under libtag (a forked child that calls exit(), a program it runs)
gets its own.  For each, the definite and indirect leaks are printed on
stderr, grouped by allocation stack with blocks and bytes, the top N groups
and the totals.  The exit status is 23 when any definite or indirect leak is
left after the suppressions, otherwise CMD's.  A process that ends with
_exit() or is killed by a signal takes no exit snapshot and is not checked
(said on stderr).  --suppress FILE: one pattern per line, leak:PATTERN or
PATTERN, matched against every frame's function, source file and module
("*" any characters, "^"/"$" anchors); a group with a matching frame is left
out.

--fail-on anomaly,leak: a status a CI job can fail on, as ASan's and LSan's.
anomaly: exit 1 when libtag found an anomaly in CMD or a process it started
(a double or invalid free, an overflow, a write after free, a mismatched
release: each takes a snapshot, which is how forensics knows); leak: the
leak check of --leaks, exit 23 when leaks are left.  An anomaly's 1 comes
before a leak's 23; with neither found the status is CMD's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

from forensics.cli._open import open_dump
from forensics.errors import ForensicsError, InputError, UsageError
from forensics.files import default_snapshot_dir, ensure_private_dir, write_private
from forensics.libpath import lib_path

ON_ANOMALY = ("snapshot", "abort", "ignore")

# forensics run --leaks's status when leaks are found: LeakSanitizer's.
LEAK_EXIT_STATUS = 23
# forensics run --fail-on anomaly's status when libtag found an anomaly:
# AddressSanitizer's default exitcode.
ANOMALY_EXIT_STATUS = 1
FAIL_ON = ("anomaly", "leak")

# Signals a terminal or a supervisor sends to stop "the program": passed on to
# CMD, so that forensics run behaves like the command it wraps.
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Sent by the terminal to the whole foreground group, CMD included: ignored
# here while CMD runs (as system(3) does), so only CMD decides what they do.
_IGNORED = (signal.SIGINT, signal.SIGQUIT)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", metavar="DIR",
        help=f"where snapshots (cores) go; created 0700 (default: {default_snapshot_dir()})",
    )
    parser.add_argument(
        "--on-anomaly", choices=ON_ANOMALY, default="snapshot",
        help="on a double free, invalid free, overflow or write after free: "
             "snapshot and run on (default), abort, or ignore",
    )
    parser.add_argument(
        "--leaks", action="store_true",
        help="check for leaks when CMD exits; exit 23 when definite or indirect leaks are found",
    )
    parser.add_argument(
        "--suppress", metavar="FILE",
        help="with --leaks: leave out leaks whose allocation stack matches a pattern of FILE "
             "(leak:PATTERN lines)",
    )
    parser.add_argument(
        "--json", metavar="FILE", dest="json_file",
        help="with --leaks: also write the leak report as one JSON document to FILE (0600)",
    )
    parser.add_argument(
        "--top", type=int, default=10, metavar="N",
        help="with --leaks: print the N largest leak groups of each process (default 10)",
    )
    parser.add_argument(
        "--fail-on", metavar="WHAT", type=_fail_on, default=(),
        help="anomaly: exit 1 when libtag found an anomaly; leak: check for leaks at exit "
             "and exit 23 when any are left (as --leaks); both: anomaly,leak",
    )
    parser.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS]",
        help="the command to run",
    )


def _fail_on(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in FAIL_ON]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give anomaly, leak or anomaly,leak")
    return kinds


def build_env(lib: str, snap_dir: str, on_anomaly: str, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    existing = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != lib]
    env["LD_PRELOAD"] = " ".join([lib, *existing])
    env["LIBTAG_DIR"] = snap_dir
    env["LIBTAG_ON_ANOMALY"] = on_anomaly
    return env


def main(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError(
            "run: no command given; usage: forensics run [--dir DIR] "
            "[--on-anomaly snapshot|abort|ignore] -- CMD [ARGS]"
        )

    if "leak" in args.fail_on:
        args.leaks = True
    if "anomaly" in args.fail_on and args.on_anomaly == "ignore":
        raise UsageError("run: --fail-on anomaly needs --on-anomaly snapshot or abort: "
                         "with ignore, an anomaly leaves no trace for forensics to see")
    if not args.leaks and (args.suppress or args.json_file):
        raise UsageError(f"run: {'--suppress' if args.suppress else '--json'} goes with --leaks")
    if args.top < 1:
        raise UsageError(f"run: --top must be at least 1, not {args.top}")
    suppressions = _load_suppressions(args.suppress) if args.suppress else None
    if args.json_file:
        _check_output(args.json_file)

    lib = lib_path()
    snap_dir = ensure_private_dir(args.dir if args.dir else default_snapshot_dir())
    env = build_env(str(lib), str(snap_dir), args.on_anomaly, dict(os.environ))
    if args.leaks:
        env["LIBTAG_AT_EXIT"] = "snapshot"
    before = _snapshot_names(snap_dir)

    try:
        child = subprocess.Popen(cmd, env=env)
    except FileNotFoundError:
        if os.sep in cmd[0] and os.path.exists(cmd[0]):
            raise ForensicsError(
                f"run: cannot execute {cmd[0]}: its interpreter or loader was not found",
                exit_code=127) from None
        raise ForensicsError(f"run: command not found: {cmd[0]}", exit_code=127) from None
    except PermissionError:
        raise ForensicsError(f"run: permission denied: {cmd[0]}", exit_code=126) from None
    except OSError as e:
        raise ForensicsError(f"run: cannot execute {cmd[0]}: {e.strerror}", exit_code=126) from None

    saved = {}
    try:
        for sig in _IGNORED:
            saved[sig] = signal.signal(sig, signal.SIG_IGN)
        for sig in _FORWARDED:
            saved[sig] = signal.signal(sig, lambda signum, _frame: _forward(child, signum))
        status = child.wait()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    results = _report_snapshots(snap_dir, before, skip_reasons=("exit",) if args.leaks else ())
    code = 128 - status if status < 0 else status
    if args.leaks:
        code = _leak_check(results, child.pid, code, cmd, suppressions, args)
    if "anomaly" in args.fail_on:
        from forensics.reader.abi import ANOMALY_NAMES  # deferred, start-up time: numpy, via the reader

        kinds = set(ANOMALY_NAMES.values())  # an anomaly snapshot is named for its kind
        found = sorted({snap.pid for snap, _, _ in results if snap.reason in kinds})
        if found:
            sys.stderr.write(f"forensics: libtag found an anomaly in pid "
                             f"{', '.join(map(str, found))}: exit {ANOMALY_EXIT_STATUS} "
                             f"(--fail-on anomaly)\n")
            return ANOMALY_EXIT_STATUS
    return code


# How long to wait, after CMD exited, for a core still being written by a
# snapshot child it left behind.
SNAPSHOT_WAIT_S = 120.0


def _snapshot_names(snap_dir) -> set[str]:
    from forensics.snapshots import snapdir  # deferred, start-up time: psutil, pyelftools, sqlite3

    try:
        return {d.name for d in snapdir.list_dirs(snap_dir)}
    except ForensicsError:
        return set()


def _report_snapshots(snap_dir, before: set[str], skip_reasons: tuple[str, ...] = ()) -> list:
    """Catalog the snapshots CMD made and say where they are (stderr), except
    those of skip_reasons (the leak report names those).  Returns
    snapdir.scan_and_record's (dir, row, error) list."""

    from forensics.snapshots import snapdir  # deferred, start-up time: psutil, pyelftools, sqlite3

    try:
        new = _snapshot_names(snap_dir) - before
        if not new:
            return []
        results = snapdir.scan_and_record(snap_dir, wait=SNAPSHOT_WAIT_S, only=new)
    except ForensicsError as e:
        sys.stderr.write(f"forensics: warning: could not catalog the snapshots in "
                         f"{snap_dir}: {e.message}\n")
        return []
    cores = []
    for snap, row, error in results:
        if row is None:
            sys.stderr.write(f"forensics: warning: {error}\n" if error else
                             f"forensics: warning: snapshot {snap.path} of pid {snap.pid} "
                             f"is not complete\n")
            continue
        if snap.reason in skip_reasons:
            continue
        cores.append(row.core)
        pause = f", paused {row.pause_ms:.2f} ms" if row.pause_ms is not None else ""
        sys.stderr.write(f"forensics: snapshot ({snap.reason}) of pid {snap.pid}{pause}: "
                         f"{row.core}\n")
    if cores:
        sys.stderr.write(f"forensics: next: forensics inspect {cores[-1]}\n")
    return results


def _load_suppressions(path: str):
    from forensics.answers.leakcheck import Suppressions  # deferred, start-up time: numpy, via the answers

    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except IsADirectoryError:
        raise InputError(f"run: cannot read the suppressions {path}: it is a directory") from None
    except OSError as e:
        raise InputError(f"run: cannot read the suppressions {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"run: the suppressions {path} are not text (byte {e.start} is not UTF-8)") from None
    return Suppressions.parse(text, path)


def _check_output(path: str) -> None:
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise InputError(f"run: cannot write the leak report: {path} is a directory")
    if not os.path.isdir(os.path.dirname(full)):
        raise InputError(f"run: cannot write the leak report: no such folder {os.path.dirname(full)}")


def _leak_check(results: list, pid: int, code: int, cmd: list[str], suppressions, args) -> int:
    """Check every exit snapshot CMD's processes left; print, write --json,
    and return the exit status."""

    from forensics.answers.documents import LeakRunDoc, to_json  # deferred, start-up time: numpy, via the answers
    from forensics.answers.leakcheck import leak_check_doc  # deferred, start-up time: numpy, via the answers
    from forensics.output import text  # deferred, start-up time: rich

    exits = [(snap, row) for snap, row, _ in results if row is not None and snap.reason == "exit"]
    # CMD first, then its descendants as they exited
    exits.sort(key=lambda sr: (sr[0].pid != pid, sr[0].time or 0, sr[0].pid))
    processes = []
    for snap, row in exits:
        try:
            with open_dump(row.core) as dump:
                processes.append(leak_check_doc(dump, suppressions))
        except ForensicsError as e:
            sys.stderr.write(f"forensics: warning: cannot check the exit snapshot of pid "
                             f"{snap.pid} ({row.core}): {e.message}\n")
    checked = {p.pid for p in processes}
    unchecked = [] if pid in checked else [pid]
    for doc in processes:
        text.show_leak_check(doc, top=args.top)
    for p in unchecked:
        sys.stderr.write(f"forensics: warning: pid {p} took no exit snapshot, so it was not "
                         f"checked for leaks: it ended without exit() (_exit(), a signal, or "
                         f"libtag was not loaded)\n")
    leaked = any(p.leaked for p in processes)
    status = LEAK_EXIT_STATUS if leaked else code
    if args.json_file:
        doc = LeakRunDoc(command=cmd, exit_status=code, status=status, leaked=leaked,
                         processes=processes, unchecked=unchecked)
        data = (json.dumps(to_json(doc), indent=2) + "\n").encode()
        try:
            write_private(os.path.abspath(args.json_file), lambda f: f.write(data))
        except OSError as e:
            sys.stderr.write(f"forensics: warning: cannot write {args.json_file}: {e.strerror}\n")
    return status


def _forward(child: subprocess.Popen, signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass
