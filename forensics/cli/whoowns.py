"""Say which block holds an address: state, threads, stacks and who points to it.

    forensics whoowns ADDR [--core CORE | --pid PID] [--json]

With --core, looks in that core; with --pid, takes a fresh snapshot of that
running libtag process and looks there; with neither, uses the newest snapshot
in the catalog (forensics list).  When no tagged block holds ADDR it says what
the address is: a thread's stack, a module's globals, another mapping, or
nothing mapped - and "N bytes past the end of block X" just after a block.
Exit 0 if ADDR is in a tagged block, 1 if not.
"""

from __future__ import annotations

import argparse

from forensics.cli import _args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", metavar="ADDR", type=_args.address,
                        help="the address, 0x... hex or decimal")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--core", metavar="CORE", help="a core taken under libtag")
    source.add_argument("--pid", metavar="PID", type=_args.pid,
                        help="snapshot this running libtag process and look there")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _core_path(args: argparse.Namespace) -> str:
    from forensics.errors import InputError

    if args.core:
        return args.core
    if args.pid is not None:
        # forensics.snapshots.snapdir has no take_snapshot: the snapshot verb's take()
        # signals the process, waits for a complete core and catalogs it.
        from forensics.cli.snapshot import take

        return take(args.pid, timeout=30.0)["core"]
    from forensics.snapshots import catalog

    newest = catalog.newest()
    if newest is None:
        raise InputError("no snapshot in the catalog: give --core CORE or --pid PID "
                         "(snapshots are taken by forensics run and forensics snapshot)")
    return str(newest.core)


def main(args: argparse.Namespace) -> int:
    from forensics.answers import owners
    from forensics.cli._open import open_dump
    from forensics.output import text

    with open_dump(_core_path(args)) as dump:
        answer = owners.whoowns(dump, args.address)
        doc = owners.to_json(dump, answer)
    if args.json:
        text.print_json(doc)
    else:
        text.show_whoowns(doc)
    return 0 if answer.in_block else 1
