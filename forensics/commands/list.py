"""List the snapshots in the catalog.

    forensics list [--json]
"""

from __future__ import annotations

import argparse

from forensics.errors import ForensicsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def main(args: argparse.Namespace) -> int:
    raise ForensicsError("list is not implemented yet")
