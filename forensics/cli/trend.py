"""Show live bytes and blocks per allocation stack across a series of snapshots.

    forensics trend CORE... [--json] [--growing] [--top N] [--debug-dir DIR]... [--sysroot DIR]

Snapshots of one process are put in the order they were taken; each
allocation stack gets its live blocks and bytes in every snapshot, and stacks
whose live bytes never fall and end higher than they started are flagged as
growing monotonically (listed first) - the shape of a leak.
Frames are named only from a file with the build-id the process had
(--debug-dir, --sysroot: where to find it; docs/guide.md).
A core without libtag is refused (it has no stacks): diff and report take
such cores.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from forensics.cli import _args
from forensics.cli._open import open_dump, warn_symbols
from forensics.errors import InputError, UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cores", metavar="CORE", nargs="*",
                        help="snapshots of one process (or of runs of one program)")
    _args.coredump_flag(parser, many=True)
    _args.json_flag(parser)
    _args.symbol_flags(parser)
    parser.add_argument("--growing", action="store_true",
                        help="only the stacks that grow monotonically")
    parser.add_argument("--top", metavar="N", type=_args.positive_int, default=None,
                        help="at most N stacks (default: all with --json, 20 otherwise)")


def main(args: argparse.Namespace) -> int:
    from forensics.answers.trend import trend, trend_doc  # deferred, start-up time: numpy, via the answers
    from forensics.output import text  # deferred, start-up time: rich
    from forensics.output.jsonout import print_json  # deferred, start-up time: the documents

    if len(args.cores) < 2:
        raise UsageError("trend needs at least two snapshots (CORE CORE ...)")
    top = args.top if args.top is not None else (None if args.json else 20)
    with ExitStack() as stack:
        dumps = [stack.enter_context(open_dump(p, args, plain=True)) for p in args.cores]
        for path, dump in zip(args.cores, dumps):
            if not dump.libtag:
                raise InputError(f"trend: {path} is a core without libtag: trend follows allocation "
                                 f"stacks, which only libtag records; diff (by chunk size) and "
                                 f"report take such cores")
        doc = trend_doc(trend(dumps), top=top, growing_only=args.growing)
        warn_symbols(dumps)
    if args.json:
        print_json(doc)
    else:
        text.show_trend(doc)
    return 0
