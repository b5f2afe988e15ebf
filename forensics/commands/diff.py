"""Show the growth between two snapshots, by allocation stack and by address.

    forensics diff OLD NEW [--json]
"""

from __future__ import annotations

import argparse

from forensics.errors import ForensicsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", metavar="OLD", help="the earlier core")
    parser.add_argument("new", metavar="NEW", help="the later core")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def main(args: argparse.Namespace) -> int:
    raise ForensicsError("diff is not implemented yet")
