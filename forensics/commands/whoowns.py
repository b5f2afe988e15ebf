"""Say which block holds an address: state, threads, stacks and who points to it.

    forensics whoowns ADDR [--core CORE | --pid PID] [--json]

With --pid, takes a fresh snapshot of that process; with neither, reads the
newest snapshot in the catalog.  Exit 0 if ADDR is in a tagged block, 1 if not
(still saying what the address is).
"""

from __future__ import annotations

import argparse

from forensics.commands import _args
from forensics.errors import ForensicsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", metavar="ADDR", type=_args.address,
                        help="the address, 0x... hex or decimal")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--core", metavar="CORE", help="a core taken under libtag")
    source.add_argument("--pid", metavar="PID", type=_args.pid,
                        help="snapshot this running libtag process and look there")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def main(args: argparse.Namespace) -> int:
    raise ForensicsError("whoowns is not implemented yet")
