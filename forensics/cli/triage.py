"""Group many cores by crash signature: one group per bug.

    forensics triage [CORE_OR_DIR...] [--coredump MATCH]... [--json] [--debug-dir DIR]... [--sysroot DIR]

Reads every core given, and every core in the directories given (files
that start as an ELF file or a zstd, lz4 or xz stream; symbolic links are
not followed; a file named twice is read once), and with --coredump MATCH
every core systemd-coredump holds of pid MATCH or of the program MATCH
(`forensics list` shows them; a crash whose core systemd no longer holds
is listed as skipped, with why), as inspect does, and groups them by
their crash signature: the anomaly or the crash, the first meaningful
frames of the stack that detected or took it (allocator, libtag and C
runtime frames folded), and for a heap anomaly the block's allocation site
(docs/json.md, "signature").
Each group says how many cores, the first and last time, the programs and
their pids, the hosts (where systemd-coredump recorded them), the newest
example core, and what that core says: the block with its allocation and
free stacks, or the crash's address and what holds it.

Cores without an anomaly or a crash (snapshots taken on demand) are
counted apart; a core that cannot be read is listed with its reason and
the others go on.  Exit 0, or 2 when no core could be read.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from forensics.cli import _args
from forensics.cli._open import open_dump
from forensics.errors import InputError

if TYPE_CHECKING:  # an annotation only: --help never loads the answers
    from forensics.answers.documents import InspectDoc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="CORE_OR_DIR", nargs="*",
                        help="cores, and directories searched for cores")
    _args.coredump_flag(parser, every=True)
    _args.json_flag(parser)
    _args.symbol_flags(parser)


def main(args: argparse.Namespace) -> int:
    from forensics.answers.inspect import inspect_doc  # deferred, start-up time: numpy, via the answers
    from forensics.answers.triage import triage  # deferred, start-up time: numpy, via the answers
    from forensics.output import text  # deferred, start-up time: rich
    from forensics.output.jsonout import print_json  # deferred, start-up time: the documents

    def inspect(path: str) -> InspectDoc:
        with open_dump(path, args, plain=True) as dump:
            return inspect_doc(dump, top=0)

    bar = cm = task = None
    if sys.stderr.isatty():
        cm = text.progress("reading cores")
        bar, task = cm.__enter__()

    def progress(done: int, total: int, path: str) -> None:
        if bar is not None:
            bar.update(task, total=total, completed=done)

    try:
        doc = triage(args.paths, inspect, progress,
                     skipped=[{"path": None, "error": e}
                              for e in getattr(args, "coredump_skipped", ())])
    finally:
        if cm is not None:
            cm.__exit__(None, None, None)
    if not (doc["groups"] or doc["unsigned"]):
        if doc["skipped"]:
            raise InputError(f"triage: no core could be read ({len(doc['skipped'])} skipped; the "
                             f"first: {doc['skipped'][0]['error']})")
        raise InputError("triage: no core found in " + ", ".join(args.paths))
    if args.json:
        print_json(doc)
    else:
        text.show_triage(doc)
    return 0
