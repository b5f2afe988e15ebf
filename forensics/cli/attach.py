"""Load libtag into a running process: its new blocks get tags and stacks.

    forensics attach PID [--json]

One thread of the process, asleep in an idle wait (an event loop, a sleep,
an accept, a read of a pipe or socket), is stopped for a few milliseconds
and made to load libtag (dlopen) and rebind every module's calls to the
malloc family to it; the other threads run on.  From then on
each new block carries its tag, allocation and free stacks, and libtag
watches it as in a process started under libtag (double and invalid frees,
overflows, use after free, snapshots on anomalies); `forensics snapshot PID`
asks libtag for its snapshots.  The blocks allocated before stay glibc's:
freeing or reallocating one goes to glibc.  A core of the attached
process holds both kinds and every verb answers for both: a new block
with its tag and stacks, one from before as glibc's chunk (its state and
usable size; inspect adds glibc's map, leaks group such chunks by size).

What it cannot do: a static binary, a program under a seccomp filter, with
a C library other than glibc 2.34+, or with another allocator (jemalloc,
tcmalloc) is refused with one line; calls to __libc_malloc stay glibc's,
and a pointer to free that the program copied at run time before the
attach still leads to glibc's free (given a new block, glibc aborts);
C++ new/delete go through libstdc++'s operators (mismatches are not seen);
there is no detach.  Exit 0, or 2 with the reason.
"""

from __future__ import annotations

import argparse

from forensics.cli import _args
from forensics.libpath import lib_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", metavar="PID", type=_args.pid, help="the process to attach to")
    _args.json_flag(parser)


def main(args: argparse.Namespace) -> int:
    from forensics.output import text  # deferred, start-up time: rich
    from forensics.output.jsonout import print_json  # deferred, start-up time: the documents
    from forensics.snapshots.attach import attach  # deferred, start-up time: psutil, pyelftools, sqlite3
    from forensics.snapshots.take import open_process  # deferred, start-up time: psutil, pyelftools, sqlite3

    open_process(args.pid)
    err = text.err_console()
    doc = attach(args.pid, str(lib_path()), note=lambda msg: err.print(
        f"forensics: note: {msg}", markup=False, highlight=False, soft_wrap=True))
    if args.json:
        print_json(doc)
        return 0
    out = text.out_console()
    out.print(f"libtag attached to pid {doc.pid}: {doc.rebound} calls to the malloc "
              f"family rebound, thread {doc.tid} held {doc.held_ms:.1f} ms",
              markup=False, soft_wrap=True)
    out.print(f"  next: forensics snapshot {doc.pid}", markup=False, soft_wrap=True)
    return 0
