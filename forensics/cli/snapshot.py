"""Ask a running libtag process for a snapshot and wait until its core is complete.

    forensics snapshot PID [--dir DIR] [--timeout S] [--json]

The process pauses for a few milliseconds (a fork) and runs on.  Exit 0, or 2
with the reason: no such process, libtag not loaded, no permission, timeout.

The process itself decides where its core goes: its LIBTAG_DIR (as read from
/proc/PID/environ), else $XDG_STATE_HOME/forensics/snapshots of its own
environment.  --dir says where to look when that environment cannot be read;
when it can, a --dir that differs is ignored with a note.  The signal sent is
the process's LIBTAG_SIGNAL (default SIGUSR2).  The snapshot is recorded in
the catalog (forensics list).
"""

from __future__ import annotations

import argparse

from forensics.cli import _args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", metavar="PID", type=_args.pid, help="the process to snapshot")
    parser.add_argument("--dir", metavar="DIR",
                        help="where to look for the snapshot when the process's "
                             "environment (its LIBTAG_DIR) cannot be read")
    parser.add_argument("--timeout", metavar="S", type=_args.seconds, default=30.0,
                        help="seconds to wait for the core (default: 30)")
    _args.json_flag(parser)


def main(args: argparse.Namespace) -> int:
    from forensics.output import text
    from forensics.snapshots.take import take

    err = text.err_console()

    def note(msg: str) -> None:
        err.print(f"forensics: note: {msg}", markup=False, highlight=False, soft_wrap=True)

    if err.is_terminal:
        with err.status(f"snapshot of pid {args.pid}...") as status:
            doc = take(args.pid, timeout=args.timeout, fallback_dir=args.dir,
                       note=note, status=status)
    else:
        doc = take(args.pid, timeout=args.timeout, fallback_dir=args.dir, note=note)

    if args.json:
        text.print_json(doc)
        return 0
    out = text.out_console()
    out.print(doc["core"], markup=False, soft_wrap=True)
    out.print(f"  pid {doc['pid']} ({doc['exe'] or 'unknown executable'}), "
              f"reason {doc['reason']}, paused {doc['pause_ms']:.2f} ms, "
              f"core {text.core_size_text(doc['core_bytes'], doc['disk_bytes'])}",
              markup=False, soft_wrap=True)
    out.print(f"  next: forensics inspect {doc['core']}", markup=False, soft_wrap=True)
    return 0

