"""Show the growth between two snapshots, by allocation stack and by address.

    forensics diff OLD NEW [--json] [--filter PATTERN] [--exclude PATTERN] [--min-bytes N] [--top N]
                   [--debug-dir DIR]... [--sysroot DIR]

Matches the live blocks of OLD and NEW by identity - address, allocation time,
thread and stack - so an address freed and handed out again counts as one gone
and one new block, never as a survivor.  For every allocation stack it reports
the growth in blocks and bytes, how many blocks survived from OLD, how many are
new and how many are gone, ranked by severity: bytes grown, then blocks grown,
then the share of the new blocks that have one size (a leak repeats itself).
--filter / --exclude PATTERN keep / drop stacks with a frame whose function or
module name matches (a glob with * ? [ ], else a substring); both repeat.
Frames are named only from a file with the build-id the process had
(--debug-dir, --sysroot: where to find it; docs/guide.md).

Two cores without libtag (glibc's heap, no stacks) are compared by chunk
size instead: the chunks in use of each usable size, and in one process
which were kept (same address, same size), new or gone.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from forensics.cli import _args
from forensics.cli._open import open_dump, warn_symbols


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", metavar="OLD", nargs="?", help="the earlier core")
    parser.add_argument("new", metavar="NEW", nargs="?", help="the later core")
    _args.coredump_flag(parser, many=True)
    _args.json_flag(parser)
    _args.symbol_flags(parser)
    parser.add_argument("--filter", metavar="PATTERN", action="append", default=[],
                        help="keep only stacks with a frame whose function or module matches")
    parser.add_argument("--exclude", metavar="PATTERN", action="append", default=[],
                        help="drop stacks with a frame whose function or module matches")
    parser.add_argument("--min-bytes", metavar="N", type=_args.non_negative_int, default=0,
                        help="keep stacks whose live bytes changed by at least N")
    parser.add_argument("--top", metavar="N", type=_args.positive_int, default=20,
                        help="stacks shown in the human output (default: 20; --json has all)")


def main(args: argparse.Namespace) -> int:
    # here, not at the top: the answers load numpy and rich, which --help never needs

    from forensics.answers.diff import diff_doc  # deferred, start-up time: numpy, via the answers
    from forensics.output import text  # deferred, start-up time: rich
    from forensics.output.jsonout import print_json  # deferred, start-up time: the documents

    with ExitStack() as stack:
        old = stack.enter_context(open_dump(args.old, args, plain=True))
        new = stack.enter_context(open_dump(args.new, args, plain=True))
        doc = diff_doc(old, new, filters=args.filter, excludes=args.exclude, min_bytes=args.min_bytes,
                       names=(args.old, args.new))
        warn_symbols([old, new])
    for w in doc.warnings:
        text.warn(w)
    if args.json:
        print_json(doc)
    else:
        text.show_diff(doc, top=args.top)
    return 0
