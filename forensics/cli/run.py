"""Run a command with libtag preloaded, snapshots going to a private directory.

    forensics run [--dir DIR] [--on-anomaly snapshot|abort|ignore] -- CMD [ARGS]

CMD runs with LD_PRELOAD=<libtag.so> (before any LD_PRELOAD already set),
LIBTAG_DIR=DIR and LIBTAG_ON_ANOMALY.  DIR defaults to
$XDG_STATE_HOME/forensics/snapshots and is created 0700.  The exit status is
CMD's; a CMD killed by a signal gives 128+signal, as a shell does.

When CMD has exited, the snapshots it left in DIR (on demand, on an anomaly,
on a crash) are waited for, recorded in the catalog (forensics list) and
named on stderr with the command to look at them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess

from forensics.errors import ForensicsError, UsageError

ON_ANOMALY = ("snapshot", "abort", "ignore")

# Signals a terminal or a supervisor sends to stop "the program": passed on to
# CMD, so that forensics run behaves like the command it wraps.
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Sent by the terminal to the whole foreground group, CMD included: ignored
# here while CMD runs (as system(3) does), so only CMD decides what they do.
_IGNORED = (signal.SIGINT, signal.SIGQUIT)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", metavar="DIR",
        help="where snapshots (cores) go; created 0700 "
             "(default: $XDG_STATE_HOME/forensics/snapshots)",
    )
    parser.add_argument(
        "--on-anomaly", choices=ON_ANOMALY, default="snapshot",
        help="on a double free, invalid free, overflow or write after free: "
             "snapshot and run on (default), abort, or ignore",
    )
    parser.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS]",
        help="the command to run",
    )


def build_env(lib: str, snap_dir: str, on_anomaly: str, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    existing = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != lib]
    env["LD_PRELOAD"] = " ".join([lib, *existing])
    env["LIBTAG_DIR"] = snap_dir
    env["LIBTAG_ON_ANOMALY"] = on_anomaly
    return env


def main(args: argparse.Namespace) -> int:
    from forensics.files import default_snapshot_dir, ensure_private_dir
    from forensics.libpath import lib_path

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError(
            "run: no command given; usage: forensics run [--dir DIR] "
            "[--on-anomaly snapshot|abort|ignore] -- CMD [ARGS]"
        )

    lib = lib_path()
    snap_dir = ensure_private_dir(args.dir if args.dir else default_snapshot_dir())
    env = build_env(str(lib), str(snap_dir), args.on_anomaly, dict(os.environ))
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

    _report_snapshots(snap_dir, before)
    return 128 - status if status < 0 else status


# How long to wait, after CMD exited, for a core still being written by a
# snapshot child it left behind.
SNAPSHOT_WAIT_S = 120.0


def _snapshot_names(snap_dir) -> set[str]:
    from forensics.snapshots import snapdir

    try:
        return {d.name for d in snapdir.list_dirs(snap_dir)}
    except ForensicsError:
        return set()


def _report_snapshots(snap_dir, before: set[str]) -> None:
    """Catalog the snapshots CMD made and say where they are (stderr)."""
    import sys

    from forensics.snapshots import snapdir

    try:
        new = _snapshot_names(snap_dir) - before
        if not new:
            return
        results = snapdir.scan_and_record(snap_dir, wait=SNAPSHOT_WAIT_S, only=new)
    except ForensicsError as e:
        sys.stderr.write(f"forensics: warning: could not catalog the snapshots in "
                         f"{snap_dir}: {e.message}\n")
        return
    cores = []
    for snap, row, error in results:
        if row is None:
            sys.stderr.write(f"forensics: warning: {error}\n" if error else
                             f"forensics: warning: snapshot {snap.path} of pid {snap.pid} "
                             f"is not complete\n")
            continue
        cores.append(row["core"])
        pause = f", paused {row['pause_ms']:.2f} ms" if row["pause_ms"] is not None else ""
        sys.stderr.write(f"forensics: snapshot ({snap.reason}) of pid {snap.pid}{pause}: "
                         f"{row['core']}\n")
    if cores:
        sys.stderr.write(f"forensics: next: forensics inspect {cores[-1]}\n")


def _forward(child: subprocess.Popen, signum: int) -> None:
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass
