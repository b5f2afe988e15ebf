"""Show a core's heap, the anomaly or crash that caused it, and the top stacks.

    forensics inspect CORE [--json] [--leaks] [--top N] [--runtime] [--debug-dir DIR]... [--sysroot DIR]

Reads a core taken under libtag (a snapshot, an anomaly core or a crash core):
the process, why the core was taken, the anomaly (kind, address, the block
with its allocation and free stacks, the detecting stack) or the crash (signal,
fault address and what it points into, the faulting thread's stack), the heap
totals, the allocation stacks holding the most live bytes, and every thread's
logical stack.  A core of a process that never ran libtag (the kernel's, gcore's)
is read from glibc's own heap instead: its arenas, every chunk's size and state,
the corruption found, the most common chunk sizes, and a crash inside malloc or
free explained - without stacks, times or threads (docs/guide.md, "Cores
without libtag").  The first run indexes the heap (a progress bar for big cores)
and caches the index beside the core; later runs start at once.
Frames are named only from a file with the build-id the process had
(--debug-dir, --sysroot: where to find it; docs/guide.md).
Every document carries the crash signature (docs/json.md, "signature"), the
key by which `forensics triage` groups cores; --sentry prints the core as
one Sentry event instead (docs/json.md, "Sentry event").
"""

from __future__ import annotations

import argparse

from forensics.cli import _args
from forensics.cli._open import open_dump


def add_arguments(parser: argparse.ArgumentParser, *, gdb: bool = False) -> None:
    """The verb's arguments; gdb: the ``tag inspect`` form, which reads the
    core or process gdb has open instead of a CORE argument."""
    if not gdb:
        parser.add_argument("core", metavar="CORE", nargs="?",
                            help="a core taken under libtag, or any core of a glibc program "
                                 "(plain, or compressed: zstd, lz4, xz)")
        _args.coredump_flag(parser)
    _args.json_flag(parser)
    _args.symbol_flags(parser)
    parser.add_argument("--leaks", action="store_true",
                        help="also find leaked blocks (reachability scan from the roots)")
    parser.add_argument("--top", metavar="N", type=_args.positive_int, default=10,
                        help="how many allocation stacks to show (default: 10)")
    parser.add_argument("--blocks", metavar="N", type=_args.positive_int,
                        help="also list the live blocks of allocation stack #N (as numbered "
                             "in the top stacks): address, size, thread, age; for whoowns")
    _args.runtime_flags(parser)
    if not gdb:
        parser.add_argument("--sentry", action="store_true",
                            help="print the core as one Sentry event (JSON, platform native: the "
                                 "exception and its stack, every thread, the modules with their "
                                 "build-ids, the signature as fingerprint) for a crash pipeline")


def main(args: argparse.Namespace) -> int:
    with open_dump(args.core, args, plain=True) as dump:
        return answer(dump, args)


def answer(dump, args: argparse.Namespace) -> int:
    """Print the inspect document of dump (with its leaks if asked), as text or --json."""
    # here, not at the top: the answers load numpy and rich, which --help never needs
    from forensics.answers.inspect import inspect_answer  # deferred, start-up time: numpy, via the answers
    from forensics.output import text  # deferred, start-up time: rich
    from forensics.output.jsonout import print_json  # deferred, start-up time: the documents

    doc = inspect_answer(dump, top=args.top, runtime=args.runtime, runtime_functions=args.runtime_functions,
                         leaks=args.leaks, blocks=getattr(args, "blocks", None))
    if getattr(args, "sentry", False):
        from forensics.answers.sentry import sentry_event  # deferred: only --sentry needs it

        print_json(sentry_event(dump, doc))
    elif args.json:
        print_json(doc)
    else:
        text.show_inspect(doc)
        if doc.leaks is not None:
            text.show_leaks(doc.leaks)
        if doc.stack_blocks is not None:
            text.show_stack_blocks(doc.stack_blocks)
    return 0
