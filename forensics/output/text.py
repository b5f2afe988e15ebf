"""Human and JSON output: the only module that imports rich.

Commands build their answers as plain data, then hand them here.  Human output
goes to stdout through a rich Console; ``--json`` output is one JSON document
on stdout and nothing else there; diagnostics go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.markup import escape
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
        t.add_row(*(escape(str(cell)) for cell in row))
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


# ------------------------------------------------------------------ answers --
# The human forms of the verbs' JSON documents: each takes the document the
# verb would print with --json, so both outputs always say the same thing.


def _e(value) -> str:
    """Text from a core (paths, function names, notes) made safe for rich
    markup: a path like "a[/b]" must print as itself, not as a markup tag."""
    return escape(str(value))


def _frame_text(f: dict) -> str:
    func = f.get("function") or "??"
    where = ""
    if f.get("file"):
        where = f" at {f['file']}:{f['line']}" if f.get("line") else f" at {f['file']}"
    elif f.get("module"):
        where = f" in {f['module']}"
    return _e(f"{f['address']}  {func}{where}")


def stack_tree(title: str, frames: Sequence[dict], *, limit: int = 24) -> Tree:
    tree = Tree(title)
    if not frames:
        tree.add("[dim](no stack recorded)[/dim]")
    for f in frames[:limit]:
        tree.add(_frame_text(f))
    if len(frames) > limit:
        tree.add(f"[dim]... {len(frames) - limit} more frames (--json has them all)[/dim]")
    return tree


def _block_lines(block: dict, *, label: str = "block") -> list:
    out = [f"[bold]{label}[/bold] {block['start']}  {block['size']} bytes  "
           f"[bold]{block['state']}[/bold]  offset {block['offset']}"
           + ("  guarded" if block.get("guarded") else "")]
    out.append(stack_tree(f"allocated by thread {block['thread']}", block["alloc_stack"]))
    if block["state"] == "freed":
        out.append(stack_tree(f"freed by thread {block['free_thread']}", block["free_stack"] or []))
    return out


def show_block(block: dict) -> None:
    """A block document (docs/json.md, "block"): its line and its stacks."""
    con = out_console()
    for item in _block_lines(block):
        con.print(item)


def show_whoowns(doc: dict) -> None:
    con = out_console()
    region = doc.get("region") or {}
    head = f"[bold]{doc['address']}[/bold]: {doc['owner']}"
    if region.get("name"):
        head += f" - {_e(region['name'])}"
        if region.get("start"):
            head += f" [{region['start']}-{region['end']})"
    con.print(head)
    if doc.get("note"):
        con.print(f"  {_e(doc['note'])}")
    if doc.get("block"):
        for item in _block_lines(doc["block"]):
            con.print(item)
        refs = doc.get("referrers") or []
        if refs:
            def where(r: dict) -> str:
                if r["in"] == "heap":
                    return f"block {r['block_start']}"
                if r["in"] == "stack" and r.get("thread") is not None:
                    return f"thread {r['thread']}"
                return os.path.basename(r.get("module") or "")

            t = table(f"referrers ({doc.get('referrer_count', len(refs))})",
                      ["address", "in", "whose", "points"],
                      [(r["address"], r["in"], where(r),
                        "inside" if r.get("interior") else "at start") for r in refs[:50]])
            con.print(t)
        else:
            con.print("  no referrers: nothing in live blocks, stacks or globals points into it")
    elif doc.get("near"):
        for item in _block_lines(doc["near"]["block"], label="nearest block"):
            con.print(item)
    for w in doc.get("warnings", []):
        err_console().print(f"[yellow]warning:[/yellow] {_e(w)}")


def show_inspect(doc: dict) -> None:
    con = out_console()
    proc = doc["process"]
    con.print(f"[bold]core[/bold] {_e(doc['core'])}")
    con.print(f"[bold]process[/bold] {proc['pid']} {_e(proc['exe'] or '')}")
    con.print(f"[bold]reason[/bold] {doc['reason']}")
    if doc.get("payload") == "omitted":
        con.print("[dim]block contents were left out of this core (LIBTAG_PAYLOAD=omit)[/dim]")
    for a in doc.get("anomalies", []):
        con.print(f"\n[bold red]{a['kind']}[/bold red] of {a['address']} in thread {a.get('thread')}")
        facts = [f"at {a['time']}"] if a.get("time") else []
        if a.get("offset") is not None:
            facts.append(f"offset {a['offset']} in the block")
        if a.get("written"):
            facts.append(f"bytes written {a['written']}")
        if a.get("access"):
            facts.append(f"a {a['access']} by the instruction at {a['pc']} (a guarded block)")
        if a.get("dealloc"):
            facts.append(f"allocated as {a['block']['alloc_kind'] if a.get('block') else '?'}, "
                         f"released with {a['dealloc']}")
        if facts:
            con.print("  " + "; ".join(facts))
        con.print(stack_tree("released at" if a.get("dealloc") else
                             "faulting instruction" if a.get("access") else "detected at", a["stack"]))
        if a.get("block"):
            for item in _block_lines(a["block"]):
                con.print(item)
    c = doc.get("crash")
    if c:
        con.print(f"\n[bold red]{c['signal']}[/bold red] at {c['address']} in thread {c['thread']}")
        owner = c.get("address_owner") or {}
        if owner:
            con.print(f"  the address is {owner['owner']}"
                      + (f" ({_e(owner['region'])})" if owner.get("region") else "")
                      + (f": {_e(owner['note'])}" if owner.get("note") else ""))
        con.print(stack_tree("faulting thread", c["stack"]))
        if owner.get("block"):
            for item in _block_lines(owner["block"]):
                con.print(item)
    h = doc["heap"]
    con.print(f"\n[bold]heap[/bold] {h['live_blocks']} live blocks, {h['live_bytes']} bytes; "
              f"{h['freed_blocks']} freed blocks in quarantine, {h['freed_bytes']} bytes")
    tops = doc.get("top_stacks", [])
    if tops:
        con.print("\n[bold]top allocation stacks by live bytes[/bold]")
        for i, s in enumerate(tops, 1):
            con.print(stack_tree(f"#{i}: {s['bytes']} bytes in {s['blocks']} blocks", s["stack"], limit=8))
    for t in doc.get("threads", []):
        con.print(stack_tree(f"thread {t['tid']} (sp {t['sp']})", t["stack"], limit=12))
    for w in doc.get("warnings", []):
        err_console().print(f"[yellow]warning:[/yellow] {_e(w)}")


# ------------------------------------------------------- leaks, diff, trend --


def show_leaks(leaks: Sequence[dict], *, limit: int = 20) -> None:
    """inspect --leaks: the lost blocks by kind and allocation stack."""
    con = out_console()
    if not leaks:
        con.print("\n[bold]leaks[/bold] none: every live block is reachable from a root")
        return
    totals: dict[str, list[int]] = {}
    for g in leaks:
        t = totals.setdefault(g["kind"], [0, 0])
        t[0] += g["blocks"]
        t[1] += g["bytes"]
    con.print("\n[bold]leaks[/bold] " + "; ".join(
        f"{k}: {b} bytes in {n} blocks" for k, (n, b) in totals.items()))
    for i, g in enumerate(leaks[:limit], 1):
        extra = ""
        if g.get("indirect_bytes"):
            extra = f" (+{g['indirect_bytes']} bytes in {g['indirect_blocks']} blocks lost through them)"
        age = g.get("age_ms") or {}
        when = f", allocated {age['oldest']}-{age['newest']} ms before the snapshot" if age else ""
        color = {"definite": "red", "indirect": "yellow"}.get(g["kind"], "magenta")
        con.print(stack_tree(f"#{i} [bold {color}]{g['kind']}[/bold {color}]: {g['bytes']} bytes in "
                             f"{g['blocks']} blocks{extra}{when}", g["stack"], limit=8))
    if len(leaks) > limit:
        con.print(f"[dim]... {len(leaks) - limit} more groups (--json has them all)[/dim]")


def show_diff(doc: dict, *, top: int = 20) -> None:
    con = out_console()
    o, n = doc["old"], doc["new"]
    con.print(f"[bold]old[/bold] {_e(o['core'])}: {o['live_blocks']} live blocks, {o['live_bytes']} bytes")
    con.print(f"[bold]new[/bold] {_e(n['core'])}: {n['live_blocks']} live blocks, {n['live_bytes']} bytes")
    if not doc.get("same_process"):
        con.print("[dim]different processes: stacks matched by their frames, no block survives[/dim]")
    con.print(f"{doc['new_blocks']} new blocks ({doc.get('new_bytes', 0)} bytes), "
              f"{doc['gone_blocks']} gone ({doc.get('gone_bytes', 0)} bytes), "
              f"{doc.get('survived_blocks', 0)} survived")
    growth = doc["growth"]
    if not growth:
        con.print("\n[bold]growth[/bold] none")
    for i, g in enumerate(growth[:top], 1):
        con.print(stack_tree(
            f"#{i}: [bold]{g['bytes']:+d} bytes, {g['blocks']:+d} blocks[/bold] "
            f"({g['old']['blocks']} -> {g['new']['blocks']} blocks; {g['survived']} survived, "
            f"{g['added']} new, {g['gone']} gone; {round(100 * g['same_size_share'])}% of the new "
            f"are {g['common_size']} bytes)", g["stack"], limit=8))
    if len(growth) > top:
        con.print(f"[dim]... {len(growth) - top} more stacks (--json has them all)[/dim]")


def show_trend(doc: dict) -> None:
    con = out_console()
    snaps = doc["snapshots"]
    con.print(table("snapshots", ["#", "core", "time ms", "live blocks", "live bytes"],
                    [(i, s["core"], s["time_ms"], s["live_blocks"], s["live_bytes"])
                     for i, s in enumerate(snaps, 1)]))
    con.print(f"\n[bold]{doc['monotonic_stacks']}[/bold] stacks grow monotonically")
    for s in doc["stacks"]:
        flag = "[bold red]grows[/bold red] " if s["monotonic"] else ""
        series = " -> ".join(str(b) for b in s["bytes"])
        con.print(stack_tree(f"{flag}bytes {series} (blocks {' -> '.join(map(str, s['blocks']))})",
                             s["stack"], limit=6))
