"""Human and JSON output: the only module that imports rich.

Commands build their answers as plain data, then hand them here.  Human output
goes to stdout through a rich Console; ``--json`` output is one JSON document
on stdout and nothing else there; diagnostics go to stderr.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

__all__ = [
    "Table",
    "Tree",
    "err_console",
    "hex_addr",
    "out_console",
    "print_json",
    "progress",
    "table",
]

_out: Console | None = None
_err: Console | None = None


def out_console() -> Console:
    """The Console for human output on stdout (plain text when not a terminal)."""
    global _out
    if _out is None:
        _out = Console(highlight=False, soft_wrap=False)
    return _out


def err_console() -> Console:
    """The Console for progress and notes on stderr."""
    global _err
    if _err is None:
        _err = Console(stderr=True, highlight=False)
    return _err


def hex_addr(value: int) -> str:
    """An address as the JSON and the tables print it: "0x7f..."."""
    return f"0x{value:x}"


def print_json(document: Any) -> None:
    """Print one JSON document on stdout; nothing else may go to stdout then."""
    json.dump(document, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    sys.stdout.flush()


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich Table with the house style; print it with out_console().print()."""
    t = Table(title=title, show_edge=False, header_style="bold")
    for name in columns:
        t.add_column(name)
    for row in rows:
        t.add_row(*(str(cell) for cell in row))
    return t


def progress(description: str):
    """A transient progress display on stderr, for work that may take over a second.

    Usage::

        with progress("scanning core") as (bar, task):
            bar.update(task, total=n); ...; bar.advance(task, k)
    """
    from contextlib import contextmanager

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    @contextmanager
    def _cm():
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=err_console(),
            transient=True,
        )
        with bar:
            task = bar.add_task(description, total=None)
            yield bar, task

    return _cm()
