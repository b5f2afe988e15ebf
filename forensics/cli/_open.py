"""Opening a core for a verb: with a progress bar on stderr when indexing takes
a while, and the index cached beside the core."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager


@contextmanager
def open_dump(path: str):
    from forensics.errors import InputError
    from forensics.reader.dump import Dump

    if not os.path.exists(path):
        raise InputError(f"no such core: {path}")
    from forensics.snapshots.complete import complete_core

    complete_core(path)  # a kernel-written snapshot core gets every thread's registers
    bar = None
    task = None
    if sys.stderr.isatty():
        from forensics.output import text

        cm = text.progress("indexing the heap")
        bar, task = cm.__enter__()
    else:
        cm = None

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.update(task, total=total, completed=done)

    try:
        dump = Dump.open(path, progress=progress)
    finally:
        if cm is not None:
            cm.__exit__(None, None, None)
    try:
        yield dump
    finally:
        dump.close()
