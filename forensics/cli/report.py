"""Write one self-contained HTML page: allocation tree, live heap over time, anomalies.

    forensics report CORE... -o FILE.html [--runtime] [--debug-dir DIR]... [--sysroot DIR]

Reads every CORE (taken under libtag) and writes one page that needs no
network: the live heap (bytes and blocks) of each snapshot as a curve over
time with each snapshot's reason marked; the live bytes of the newest
snapshot as a zoomable allocation hierarchy (click a frame to zoom in and see
its stack), where the C and C++ runtimes' own blocks (stdio buffers,
libstdc++'s emergency pool, the loader's TLS) are one node unless --runtime;
the anomaly or crash of every core that has one, with its stacks
(once, "seen in N cores", when later cores of the process still hold it);
the leak groups; and a table of the allocation stacks that sorts and filters,
each with where it allocated (its first frame outside the allocation
wrappers: malloc's family, strdup, operator new, the xmalloc family; add your
own with --wrapper) and, when libtag kept per-stack counters, its peak live
bytes and temporary allocations.  Cores of several processes are named on the
page with a warning, each with its own curve.  The heap is aggregated by stack
before anything is drawn, so a core with millions of blocks still gives a
small page that opens at once.  The file is written 0600 (it names the
program's functions and files) and replaced atomically.
Frames are named only from a file with the build-id the process had
(--debug-dir, --sysroot: where to find it; docs/guide.md).

Cores of a process that never ran libtag (the kernel's, gcore's; all of one
kind) give the same page from glibc's heap, without stacks: the curve of
the chunks in use, the chunks in use of the newest core by usable size in
place of the hierarchy and the table, the crash explained in malloc's terms
and each inconsistency found in glibc's structures, and the leaks by size.
"""

from __future__ import annotations

import argparse
import os
from contextlib import ExitStack

from forensics.cli import _args
from forensics.cli._open import open_dump
from forensics.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cores", metavar="CORE", nargs="*", help="cores taken under libtag, or cores of a glibc program without it")
    _args.coredump_flag(parser, many=True)
    parser.add_argument("-o", "--output", metavar="FILE.html", required=True,
                        help="the HTML file to write")
    parser.add_argument("--wrapper", metavar="PATTERN", action="append", default=[],
                        help="a function that allocates for its caller (e.g. 'my_alloc*'): "
                             "'allocated at' skips it; repeat for more")
    _args.runtime_flags(parser)
    _args.symbol_flags(parser)


def main(args: argparse.Namespace) -> int:
    from forensics.answers.report import ReportBuilder  # deferred, start-up time: numpy, via the answers
    from forensics.output import text  # deferred, start-up time: rich
    from forensics.output.html import render_page, write_page  # deferred, start-up time: rich

    out = os.path.abspath(args.output)
    if os.path.isdir(out):
        raise InputError(f"cannot write the report: {args.output} is a directory; give a file name")
    if not os.path.isdir(os.path.dirname(out)):
        raise InputError(f"cannot write the report: no such folder {os.path.dirname(out)}")
    builder = ReportBuilder(catalog_time=_catalog_time, wrappers=args.wrapper, runtime=args.runtime,
                            runtime_functions=args.runtime_functions)
    with ExitStack() as newest:  # keeps the newest core open until finish()
        for path in args.cores:
            with ExitStack() as this:
                dump = this.enter_context(open_dump(path, args, plain=True))
                if builder.add(dump):
                    newest.close()
                    newest.push(this.pop_all())
        doc = builder.finish()
    path = write_page(out, render_page(doc))
    if doc.tagged:
        what = f"{len(doc.stacks)} allocation stack(s), {len(doc.events)} anomaly/crash(es)"
    else:
        what = (f"{doc.distinct_sizes} chunk size(s), {len(doc.events)} crash/corruption(s); "
                f"without libtag: no stacks")
    text.out_console().print(f"wrote {path}: {len(doc.snapshots)} snapshot(s), {what}",
                             markup=False, highlight=False, soft_wrap=True)
    return 0


def _catalog_time(core: str) -> float | None:
    """The time the catalog has for a core: the report's fallback for a core
    whose control block has no start time.  An unreadable catalog only loses
    the fallback."""
    from forensics.snapshots.catalog import Catalog  # deferred, start-up time: psutil, pyelftools, sqlite3

    try:
        with Catalog() as cat:
            for e in cat.entries():
                if e.core == core and e.time:
                    return float(e.time)
    except Exception:  # noqa: BLE001 - any failure here only loses the fallback
        pass
    return None
