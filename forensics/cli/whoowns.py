"""Say which block holds an address: state, threads, stacks and who points to it.

    forensics whoowns ADDR [--core CORE | --pid PID] [--json] [--debug-dir DIR]... [--sysroot DIR]

With --core, looks in that core; with --pid, takes a fresh snapshot of that
running libtag process and looks there; with neither, uses the newest snapshot
in the catalog (forensics list).  Without --core, the first line names the core
used (the new snapshot's, or the catalog's with its pid and reason); --json
always names it as "core".  When no tagged block holds ADDR it says what
the address is: a thread's stack, a module's globals, another mapping, or
nothing mapped - and "N bytes past the end of block X" just after a block.
In a core of a process that never ran libtag it names glibc's chunk instead:
start, usable size, state (in use, in a tcache or bin, top, mmapped), its arena
and the threads using it.  Exit 0 if ADDR is in a tagged block (without libtag:
a chunk other than the top), 1 if not.
Frames are named only from a file with the build-id the process had
(--debug-dir, --sysroot: where to find it; docs/guide.md).
"""

from __future__ import annotations

import argparse

from forensics.cli import _args
from forensics.cli._open import open_dump
from forensics.errors import InputError


def add_arguments(parser: argparse.ArgumentParser, *, gdb: bool = False) -> None:
    """The verb's arguments; gdb: the ``tag whoowns`` form, where the address
    is a gdb expression (its words joined again) and the memory is gdb's."""
    if gdb:
        parser.add_argument("address", metavar="EXPR", nargs="*",
                            help="a gdb expression: 0x55d0c0a012a0, ptr, $rdi, s->name + 4")
    else:
        parser.add_argument("address", metavar="ADDR", type=_args.address,
                            help="the address, 0x... hex or decimal")
        source = parser.add_mutually_exclusive_group()
        source.add_argument("--core", metavar="CORE",
                            help="a core taken under libtag, or any core of a glibc program")
        source.add_argument("--pid", metavar="PID", type=_args.pid,
                            help="snapshot this running libtag process and look there")
        _args.coredump_flag(parser, group=source)
    _args.json_flag(parser)
    _args.symbol_flags(parser)


def _core_path(args: argparse.Namespace) -> tuple[str, str | None]:
    """(the core to look in, the line that says where it came from: None when
    the user named it)."""

    if args.core:
        return args.core, None
    if args.pid is not None:
        from forensics.snapshots.take import take  # deferred, start-up time: psutil, pyelftools, sqlite3

        core = take(args.pid, timeout=30.0).core
        return core, f"core {core} (a new snapshot of pid {args.pid})"
    from forensics.snapshots import catalog  # deferred, start-up time: psutil, pyelftools, sqlite3

    newest = catalog.newest()
    if newest is None:
        raise InputError("no snapshot in the catalog: give --core CORE or --pid PID "
                         "(snapshots are taken by forensics run and forensics snapshot)")
    exe = f" {newest.exe}" if newest.exe else ""
    return str(newest.core), (f"core {newest.core} (the newest in the catalog: pid "
                              f"{newest.pid}{exe}, {newest.reason})")


def main(args: argparse.Namespace) -> int:
    core, source = _core_path(args)
    with open_dump(core, args, plain=True) as dump:
        return answer(dump, args, source=source)


def answer(dump, args: argparse.Namespace, *, source: str | None = None) -> int:
    """Print who owns args.address in dump, as text or --json; the exit status.
    source: a first line saying which core this is, when the user did not
    name it."""
    from forensics.answers import owners  # deferred, start-up time: numpy, via the answers

    owner = owners.whoowns(dump, args.address)
    doc = owners.whoowns_doc(dump, owner)
    if args.json:
        from forensics.output.jsonout import print_json  # deferred, start-up time: the documents
        print_json(doc)
    else:
        from forensics.output import text  # deferred, start-up time: rich
        if source:
            text.say(source)
        text.show_whoowns(doc)
    return 0 if owner.in_block else 1
