"""Opening a core for a verb: with a progress bar on stderr when indexing takes
a while, and the index cached beside the core."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from forensics.cli._args import symbol_options
from forensics.errors import InputError


@contextmanager
def open_dump(path: str, args=None, *, plain: bool = False):
    """The Dump of the core at path; args: the verb's arguments, for the
    symbol flags (_args.symbol_flags); plain: a core without libtag opens
    as a PlainDump (glibc's heap) instead of failing (the verbs that can
    answer from glibc's heap)."""
    from forensics.reader.dump import Dump  # deferred, start-up time: numpy, via the reader

    if not os.path.exists(path):
        raise InputError(f"no such core: {path}")
    if args is not None:
        for d in getattr(args, "debug_dirs", None) or ():
            if not os.path.isdir(d):
                raise InputError(f"--debug-dir {d}: no such directory")
        root = getattr(args, "sysroot", None)
        if root is not None and not os.path.isdir(root):
            raise InputError(f"--sysroot {root}: no such directory")
    def _note(msg: str) -> None:
        from forensics.output import text  # deferred, start-up time: rich

        text.err_console().print(f"forensics: note: {msg}", markup=False, highlight=False,
                                 soft_wrap=True)

    bar = None
    task = None
    if sys.stderr.isatty():
        from forensics.output import text  # deferred, start-up time: rich

        cm = text.progress("indexing the heap")
        bar, task = cm.__enter__()
    else:
        cm = None

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.update(task, total=total, completed=done)

    try:
        # complete: a kernel-written snapshot core gets every thread's
        # registers (for gdb), from the same parse of the core
        dump = Dump.open(path, progress=progress, plain=plain, complete=True, note=_note,
                         symbols=symbol_options(args) if args is not None else None)
    finally:
        if cm is not None:
            cm.__exit__(None, None, None)
    try:
        yield dump
    finally:
        dump.close()


def warn_symbols(dumps) -> None:
    """Say on stderr what the symbolisers of dumps could not trust (a verb
    whose document has no warnings field: diff, trend)."""
    for dump in dumps:
        sym = dump.__dict__.get("symbolizer")
        for w in sym.warnings if sym is not None else ():
            sys.stderr.write(f"forensics: warning: {dump.mem.name}: {w}\n")
