"""Ask a running libtag process for a snapshot and wait until its core is complete.

    forensics snapshot PID [--dir DIR] [--timeout S] [--json]

The process pauses for a few milliseconds (a fork) and runs on.  Exit 0, or 2
with the reason: no such process, libtag not loaded, no permission, timeout.
"""

from __future__ import annotations

import argparse

from forensics.commands import _args
from forensics.errors import ForensicsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", metavar="PID", type=_args.pid, help="the process to snapshot")
    parser.add_argument("--dir", metavar="DIR",
                        help="where the core goes (default: the process's LIBTAG_DIR)")
    parser.add_argument("--timeout", metavar="S", type=_args.seconds, default=30.0,
                        help="seconds to wait for the core (default: 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def main(args: argparse.Namespace) -> int:
    raise ForensicsError("snapshot is not implemented yet")
