"""Show a core's heap, the anomaly or crash that caused it, and the top stacks.

    forensics inspect CORE [--json] [--leaks] [--top N]
"""

from __future__ import annotations

import argparse

from forensics.commands import _args
from forensics.errors import ForensicsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("core", metavar="CORE", help="a core taken under libtag")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--leaks", action="store_true",
                        help="also find leaked blocks (reachability scan from the roots)")
    parser.add_argument("--top", metavar="N", type=_args.positive_int, default=10,
                        help="how many allocation stacks to show (default: 10)")


def main(args: argparse.Namespace) -> int:
    raise ForensicsError("inspect is not implemented yet")
