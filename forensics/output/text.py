"""Human output: the only module that imports rich.

Commands build their answers as typed documents, then hand them here.  Human
output goes to stdout through a rich Console; diagnostics go to stderr.
``--json`` output is forensics.output.jsonout's.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from forensics.answers.documents import (AddressOwnerDoc, AnomalyDoc, BlockDoc, ChunkDoc, CrashDoc, DiffDoc,
                                         FrameDoc, GlibcMap, HeapTotals, InspectDoc, LeakCheckDoc, LeakGroupDoc,
                                         ReferrerDoc, RetainerDoc, RootDoc, SizeDiffDoc, StackBlocksDoc, TrendDoc,
                                         WhoownsDoc)
from forensics.answers.shapes import frame_label

__all__ = [
    "Table",
    "err_console",
    "hex_addr",
    "out_console",
    "progress",
    "table",
]

_out: Console | None = None
_err: Console | None = None


def out_console() -> Console:
    """The Console for human output on stdout (plain text when not a terminal)."""
    global _out
    if _out is None:
        # soft_wrap: a line is never broken or cut at the terminal's width
        # (the terminal may fold it on screen; a path stays one line of text)
        _out = Console(highlight=False, soft_wrap=True)
    return _out


def err_console() -> Console:
    """The Console for progress and notes on stderr."""
    global _err
    if _err is None:
        _err = Console(stderr=True, highlight=False, soft_wrap=True)
    return _err


def hex_addr(value: int) -> str:
    """An address as the JSON and the tables print it: "0x7f..."."""
    return f"0x{value:x}"


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

    # deferred, start-up time: rich.progress, only the progress bars need it
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


def plural(n: int, word: str, words: str | None = None) -> str:
    """"1 block", "2 blocks"."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def size_text(n: int) -> str:
    """Bytes for a person: "812 bytes", "432 kB", "59.3 MB", "1.20 GB"."""
    if n < 1000:
        return plural(n, "byte")
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v >= 100 else f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"
    return plural(n, "byte")


def core_size_text(apparent: int, disk: int | None) -> str:
    """A core's size: what it takes on disk, and its apparent size when the
    holes of a sparse core make that much larger."""
    if disk is None:
        return f"{size_text(apparent)} (apparent)"
    if disk * 2 < apparent:
        return f"{size_text(disk)} on disk ({size_text(apparent)} apparent)"
    return f"{size_text(disk)} on disk"


def signed(n: int, word: str) -> str:
    """"+1 block", "-3 blocks"."""
    return f"{n:+d} {word if abs(n) == 1 else word + 's'}"


def _e(value) -> str:
    """Text from a core (paths, function names, notes) made safe for rich
    markup: a path like "a[/b]" must print as itself, not as a markup tag."""
    return escape(str(value))


# Referrer rows a whoowns answer prints (--json has up to 200: docs/json.md).
SHOWN = 50


def _print_cut(con, doc: WhoownsDoc, listed: int) -> None:
    """What a referrer table left out: rows past SHOWN, and the block's own
    words that point into it."""
    total = doc.referrer_count
    if total > min(listed, SHOWN):
        con.print(f"  ... and {total - min(listed, SHOWN)} more referrers "
                  f"(roots first; --json lists {min(listed, 200)})")
    if doc.self_referrers:
        con.print(f"  left out: {doc.self_referrers} words inside the block itself that "
                  f"point into it")


# Retention paths a whoowns answer prints (--json has up to 10), and the
# links of one path printed before the middle of a long one is left out.
SHOWN_RETAINERS = 3
SHOWN_LINKS = 8


def _root_text(root: RootDoc) -> str:
    """A retention path's root: "global registry (.bss of victim)",
    "stack of thread 42 in hold_on_stack", "register rbx of thread 42"."""
    kind = root.kind
    if kind == "global":
        if not root.module and root.symbol:  # shared memory and the like
            return f"global word {root.address} ({root.symbol})"
        module = os.path.basename(root.module or "") or "anonymous"
        where = f"{root.section} of {module}" if root.section else module
        name = root.symbol or root.address
        return f"global {name} ({where})"
    if kind == "stack":
        func = f" in {root.function}" if root.function else ""
        return f"stack of thread {root.thread}{func} (word {root.address})"
    if kind == "tls":
        return f"TLS of thread {root.thread} (word {root.address})"
    if kind == "register":
        return f"register {root.register} of thread {root.thread}"
    return f"{kind} word {root.address}"


def _path_text(ret: RetainerDoc) -> str:
    """One retention path on one line: root -> each block (the word in it
    that points on, its offset and size) -> this block."""
    links = [f"{p.address} [+{p.offset} of {p.size}-byte block {p.block_start}]" for p in ret.path]
    if len(links) > SHOWN_LINKS:
        cut = len(links) - SHOWN_LINKS + 1
        links = links[:SHOWN_LINKS // 2] + [f"... {cut} more blocks ..."] + links[-(SHOWN_LINKS // 2 - 1):]
    return " -> ".join([_root_text(ret.root), *links, "this block"])


def _print_retainers(con, doc: WhoownsDoc) -> None:
    """whoowns' "kept alive by": the shortest chains from a root, and how
    many roots were left out."""
    rets = doc.retainers
    if rets is None:
        return
    count = doc.retainer_count or 0
    if not rets:
        if doc.retainers_depth_limited:
            con.print("  kept alive by: no root within the search's depth limit "
                      "(retainers_depth_limited); longer chains were not followed")
        else:
            con.print("  kept alive by nothing: no global, live stack frame, TLS or register reaches it"
                      " - a leak")
        return
    con.print(f"[bold]kept alive by[/bold] ({count} root{'s' if count != 1 else ''}, shortest chains first)")
    for ret in rets[:SHOWN_RETAINERS]:
        con.print(f"  {_e(_path_text(ret))}")
    shown = min(len(rets), SHOWN_RETAINERS)
    if count > shown:
        con.print(f"  ... and {count - shown} more roots (--json lists {len(rets)})")
    if doc.retainers_depth_limited:
        con.print("  (chains longer than the links searched were not followed: there may be more roots)")


def _print_owner(con, owner: AddressOwnerDoc | None) -> None:
    """The line that says what a crash's address is, if anything is known."""
    if owner is not None:
        con.print(f"  the address is {owner.owner}"
                  + (f" ({_e(owner.region)})" if owner.region else "")
                  + (f": {_e(owner.note)}" if owner.note else ""))


def _frame_text(f: FrameDoc) -> str:
    where = ""
    if f.file:
        where = f" at {f.file}:{f.line}" if f.line else f" at {f.file}"
    elif f.module:
        where = f" in {f.module}"
    text = _e(f"{f.address}  {frame_label(f)}{where}")
    return f"{text} [dim](inlined)[/dim]" if f.inlined else text


def _shown(frames: Sequence[FrameDoc]) -> list[FrameDoc | int]:
    """The frames a person reads: libtag's own frames (its entry points, its
    handlers, its snapshot code) are left out, and so are the C library
    frames inside the innermost of them (a system call libtag made).  A run
    left out between shown frames becomes its length (an int), so the gap
    is visible.  --json keeps every frame."""
    first = next((i for i, f in enumerate(frames) if f.libtag), None)
    lead = 0
    if first is not None and all(_is_system_library(f.module) for f in frames[:first]):
        lead = first
    out: list[FrameDoc | int] = []
    hidden = 0
    for i, f in enumerate(frames):
        if i < lead or f.libtag:
            hidden += 1
            continue
        if hidden and out:
            out.append(hidden)
        hidden = 0
        out.append(f)
    return out


def _is_system_library(module: str | None) -> bool:
    base = (module or "").rsplit("/", 1)[-1]
    return base.startswith(("libc.so", "libc-", "libpthread", "ld-linux", "libstdc++", "libgcc_s"))


def stack_tree(title: str, frames: Sequence[FrameDoc], *, limit: int = 24) -> str:
    """A stack as a tree of lines (title, then one frame per line), as one
    string: printed whole, no frame is ever broken across lines.  libtag's
    own frames are left out (see _shown); --json keeps every frame."""
    shown = _shown(frames)
    if not frames:
        items = ["[dim](no stack recorded)[/dim]"]
    elif not any(isinstance(f, FrameDoc) for f in shown):
        items = [f"[dim](only libtag's own frames: {len(frames)}; --json has them)[/dim]"]
    else:
        items = [f"[dim]({f} frame{'s' if f > 1 else ''} of libtag)[/dim]" if isinstance(f, int)
                 else _frame_text(f) for f in shown[:limit]]
        if len(shown) > limit:
            items.append(f"[dim]... {len(shown) - limit} more frames (--json has them all)[/dim]")
    lines = [title]
    for i, item in enumerate(items):
        lines.append(("└── " if i == len(items) - 1 else "├── ") + item)
    return "\n".join(lines)


def _block_lines(block: BlockDoc, *, label: str = "block") -> list:
    out = [f"[bold]{label}[/bold] {block.start}  {block.size} bytes  "
           f"[bold]{block.state}[/bold]  offset {block.offset}"
           + ("  guarded" if block.guarded else "")]
    when = f" at {block.alloc_time}" if block.alloc_time else ""
    if block.age_s is not None:
        when += f" ({block.age_s:g} s before the core)"
    out.append(stack_tree(f"allocated by thread {block.thread}{when}", block.alloc_stack))
    if block.state == "freed":
        when = f" at {block.free_time}" if block.free_time else ""
        out.append(stack_tree(f"freed by thread {block.free_thread}{when}", block.free_stack or []))
    return out


def warn(line: str) -> None:
    """``forensics: warning: ...`` on stderr."""
    err_console().print(f"forensics: warning: {line}", markup=False, highlight=False)


def say(line: str) -> None:
    """One plain line on stdout, never wrapped (it may hold a long path)."""
    out_console().print(line, markup=False, highlight=False, soft_wrap=True)


def show_block(block: BlockDoc) -> None:
    """A block document (docs/json.md, "block"): its line and its stacks."""
    con = out_console()
    for item in _block_lines(block):
        con.print(item)


def _referrer_whose(r: ReferrerDoc) -> str:
    if r.in_ == "heap":
        return f"block {r.block_start}"
    if r.in_ == "stack" and r.thread is not None:
        return f"thread {r.thread}"
    name = os.path.basename(r.module or "")
    # a word in shared memory: no module, the mapping's name
    return f"{r.symbol} in {name}" if r.symbol and name else r.symbol or name


def _chunk_referrer_whose(r: ReferrerDoc) -> str:
    return (f"block {r.block_start}" if r.in_ == "heap" else f"thread {r.thread}" if r.in_ == "stack"
            else f"{r.symbol or ''} in {os.path.basename(r.module or '')}" if r.module else r.symbol or "")


def show_whoowns(doc: WhoownsDoc) -> None:
    con = out_console()
    region = doc.region
    head = f"[bold]{doc.address}[/bold]: {doc.owner}"
    if region is not None and region.name:
        head += f" - {_e(region.name)}"
        if region.start:
            head += f" [{region.start}-{region.end})"
    con.print(head)
    if doc.note:
        con.print(f"  {_e(doc.note)}")
    if doc.type:
        con.print(f"  holds a {_e(doc.type)} (by its vtable)")
    refs = doc.referrers
    if doc.block is not None:
        for item in _block_lines(doc.block):
            con.print(item)
        if refs:
            t = table(f"referrers ({doc.referrer_count})", ["address", "in", "whose", "points"],
                      [(r.address, r.in_, _referrer_whose(r), "inside" if r.interior else "at start")
                       for r in refs[:SHOWN]])
            con.print(t)
            _print_cut(con, doc, len(refs))
        else:
            con.print("  no referrers: nothing in live blocks, stacks or globals points into it")
            _print_cut(con, doc, 0)
        _print_retainers(con, doc)
    elif doc.chunk is not None:
        for line in _chunk_lines(doc.chunk):
            con.print(line)
        if refs:
            t = table(f"referrers ({doc.referrer_count})", ["address", "in", "whose"],
                      [(r.address, r.in_, _chunk_referrer_whose(r)) for r in refs[:SHOWN]])
            con.print(t)
            _print_cut(con, doc, len(refs))
        _print_retainers(con, doc)
    elif doc.near is not None:
        for item in _block_lines(doc.near.block, label="nearest block"):
            con.print(item)
    if doc.without_libtag is not None:
        con.print(f"[dim]{_e(doc.without_libtag.summary)}[/dim]")
    for w in doc.warnings:
        err_console().print(f"[yellow]warning:[/yellow] {_e(w)}")


def _chunk_lines(c: ChunkDoc) -> list[str]:
    """A glibc chunk (docs/json.md, "chunk"), as whoowns and inspect print it."""
    where = f"  {c.bin}" if c.bin else ""
    if c.tcache_thread:
        where += f" of thread {c.tcache_thread}"
    out = [f"[bold]chunk[/bold] {c.start} (block {c.user})  {c.size} bytes, "
           f"{c.usable} usable  [bold]{c.state}[/bold]{_e(where)}  offset {c.offset}"]
    if c.size_field:
        out.append(f"  its size field holds {c.size_field}: the extent shown runs to the next "
                   f"sane chunk header")
    if c.arena:
        users = (", used by thread" + ("s " if len(c.arena_threads) > 1 else " ")
                 + ", ".join(map(str, c.arena_threads))) if c.arena_threads else ""
        out.append(f"  {c.arena_kind} arena {c.arena}{users}")
    return out


def _heap_line(h: HeapTotals, tagged: bool, glibc: GlibcMap | None = None) -> str:
    """inspect's heap totals: libtag's live and quarantined blocks (with
    glibc's in use from before an attach among the live ones), or glibc's
    blocks in use and free in its tcaches and bins (usable sizes)."""
    if tagged:
        old = sum(glibc.chunks[k].chunks for k in ("inuse", "mmapped") if k in glibc.chunks) if glibc else 0
        before = f" ({old} of them glibc's, from before libtag was attached)" if old else ""
        return (f"{plural(h.live_blocks, 'live block')}, {plural(h.live_bytes, 'byte')}{before}; "
                f"{plural(h.freed_blocks, 'freed block')} in quarantine, {plural(h.freed_bytes, 'byte')}")
    return (f"{plural(h.live_blocks, 'block')} in use, {plural(h.live_bytes, 'usable byte')}; "
            f"{plural(h.freed_blocks, 'free block')} in tcaches and bins, "
            f"{plural(h.freed_bytes, 'usable byte')}")


def show_inspect(doc: InspectDoc) -> None:
    """inspect's document: the core, the anomaly or crash, the heap (with
    glibc's map when it has one: docs/json.md, "Without libtag"), the top
    stacks and every thread's stack."""
    con = out_console()
    proc = doc.process
    g = doc.glibc
    con.print(f"[bold]core[/bold] {_e(doc.core)}")
    con.print(f"[bold]process[/bold] {proc.pid} {_e(proc.exe or '')}")
    con.print(f"[bold]reason[/bold] {doc.reason}")
    if doc.signature is not None:
        con.print(f"[bold]signature[/bold] {_e(doc.signature.text)} [dim]({doc.signature.id})[/dim]")
    if doc.without_libtag is not None:
        con.print(f"[yellow]{_e(doc.without_libtag.summary)}[/yellow]")
    if g is not None:
        con.print(f"[bold]glibc[/bold] {_e(g.version or '?')} {_e(g.libc)} "
                  f"(layout from {_e(g.layout_from)})")
    if doc.payload == "omitted":
        con.print("[dim]block contents were left out of this core (LIBTAG_PAYLOAD=omit)[/dim]")
    for a in doc.anomalies:
        _print_anomaly(con, a)
    if doc.crash is not None:
        _print_crash(con, doc.crash)
    bad = g.corruption if g is not None else []
    if bad:
        con.print(f"\n[bold red]heap corruption[/bold red] ({plural(len(bad), 'finding')})")
        for f in bad:
            con.print(f"  {_e(f.message)}")
    con.print(f"\n[bold]heap[/bold] {_heap_line(doc.heap, doc.libtag, g)}")
    if g is not None:
        _print_glibc_map(con, g)
    if doc.types:
        con.print(table("live blocks by C++ class (by vtable)", ["class", "blocks", "bytes"],
                        [[_e(t.type), str(t.blocks), str(t.bytes)] for t in doc.types]))
    tops = doc.top_stacks
    rt = doc.runtime
    if tops or (rt is not None and rt.stacks):
        con.print("\n[bold]top allocation stacks by live bytes[/bold]")
    if rt is not None and rt.stacks and not rt.shown:
        con.print(f"runtime: {plural(rt.blocks, 'block')}, {plural(rt.bytes, 'byte')} in "
                  f"{plural(rt.stacks, 'stack')} of the C and C++ runtimes (stdio buffers, "
                  f"libstdc++'s emergency pool, the loader's TLS) [dim](--runtime lists them)[/dim]")
    for i, s in enumerate(tops, 1):
        mark = " (runtime)" if s.runtime else ""
        con.print(stack_tree(f"#{i}: {plural(s.bytes, 'byte')} in {plural(s.blocks, 'block')}{mark}",
                             s.stack, limit=8))
    for t in doc.threads:
        con.print(stack_tree(f"thread {t.tid} (sp {t.sp})", t.stack, limit=12))
    for w in doc.warnings:
        err_console().print(f"[yellow]warning:[/yellow] {_e(w)}")


def _print_anomaly(con, a: AnomalyDoc) -> None:
    where = (f"in thread {a.thread}" if a.detected_by != "reader"
             else "found in the core (libtag had not checked the block yet)")
    con.print(f"\n[bold red]{a.kind}[/bold red] of {a.address} {where}")
    facts = [f"at {a.time}"] if a.time else []
    if a.offset is not None:
        facts.append(f"offset {a.offset} in the block")
    if a.written:
        facts.append(f"bytes written {a.written}")
    if a.access:
        facts.append(f"a {a.access} by the instruction at {a.pc} (a guarded block)")
    if a.dealloc:
        facts.append(f"allocated as {a.block.alloc_kind if a.block is not None else '?'}, "
                     f"released with {a.dealloc}")
    if facts:
        con.print("  " + "; ".join(facts))
    if a.detected_by != "reader":
        con.print(stack_tree("released at" if a.dealloc else
                             "faulting instruction" if a.access else "detected at", a.stack))
    if a.block is not None:
        for item in _block_lines(a.block):
            con.print(item)


def _print_crash(con, c: CrashDoc) -> None:
    con.print(f"\n[bold red]{c.signal}[/bold red] in thread {c.thread}: {_e(c.summary)}")
    m = c.malloc
    if m is not None:
        con.print(f"  [bold]{_e(m.summary)}[/bold]")
        if m.chunk is not None:
            for line in _chunk_lines(m.chunk):
                con.print("  " + line)
    owner = c.address_owner
    _print_owner(con, owner)
    con.print(stack_tree("faulting thread", c.stack))
    if owner is not None and owner.block is not None:
        for item in _block_lines(owner.block):
            con.print(item)
    cause = c.cause
    if cause is not None and cause.loaded_from:
        where = " in the caller" if cause.load_in == "caller" else ""
        con.print(f"  the pointer was loaded from {cause.loaded_from} by {_e(cause.load)}{where}")
    if cause is not None and cause.block is not None:
        b = cause.block
        for item in _block_lines(b, label=f"{'freed' if b.state == 'freed' else b.state} block"):
            con.print(item)


def _print_glibc_map(con, g: GlibcMap) -> None:
    """glibc's arenas and the most common chunk sizes in use."""
    for a in g.arenas:
        users = f", threads {', '.join(map(str, a.threads))}" if a.threads else ""
        counts = ", ".join(f"{v.chunks} {k}" for k, v in a.chunks.items())
        con.print(f"  {a.kind} arena {a.address}{users}: {counts}; top {a.top} "
                  f"({plural(a.top_size, 'byte')})")
    tops = g.top_sizes
    if tops.by_bytes:
        con.print(table("chunk sizes in use, by bytes", ["chunk size", "usable", "chunks", "bytes"],
                        [(r.size, r.usable, r.chunks, r.bytes) for r in tops.by_bytes]))
        con.print(table("chunk sizes in use, by count", ["chunk size", "usable", "chunks", "bytes"],
                        [(r.size, r.usable, r.chunks, r.bytes) for r in tops.by_count]))


def show_stack_blocks(sb: StackBlocksDoc) -> None:
    """inspect --blocks N: the live blocks of top stack #N."""
    con = out_console()
    shown = sb.blocks
    title = (f"blocks of stack #{sb.rank}: {plural(sb.count, 'block')}, "
             f"{plural(sb.bytes, 'byte')}")
    con.print()
    con.print(table(title, ["address", "size", "thread", "age"],
                    [(b.start, b.size, b.thread, f"{b.age_ms / 1000:.3f} s" if b.age_ms is not None else "?")
                     for b in shown]))
    if sb.count > len(shown):
        con.print(f"  ... and {sb.count - len(shown)} more (the first {len(shown)} by address)")
    if shown:
        con.print(f"  next: forensics whoowns {shown[0].start} --core CORE")


# ------------------------------------------------------- leaks, diff, trend --


def show_leaks(leaks: Sequence[LeakGroupDoc], *, limit: int = 20) -> None:
    """inspect --leaks: the lost blocks by kind and allocation stack."""
    con = out_console()
    if not leaks:
        con.print("\n[bold]leaks[/bold] none: every live block is reachable from a root")
        return
    totals: dict[str, list[int]] = {}
    for g in leaks:
        t = totals.setdefault(g.kind, [0, 0])
        t[0] += g.blocks
        t[1] += g.bytes
    con.print("\n[bold]leaks[/bold] " + "; ".join(
        f"{k}: {plural(b, 'byte')} in {plural(n, 'block')}" for k, (n, b) in totals.items()))
    for i, g in enumerate(leaks[:limit], 1):
        extra = ""
        if g.indirect_bytes:
            extra = (f" (+{plural(g.indirect_bytes, 'byte')} in {plural(g.indirect_blocks, 'block')}"
                     f" lost through {'it' if g.blocks == 1 else 'them'})")
        age = g.age_ms
        when = f", allocated {age.oldest}-{age.newest} ms before the snapshot" if age else ""
        color = {"definite": "red", "indirect": "yellow"}.get(g.kind, "magenta")
        title = (f"#{i} [bold {color}]{g.kind}[/bold {color}]: {plural(g.bytes, 'byte')} in "
                 f"{plural(g.blocks, 'block')}{extra}{when}")
        if g.usable_size is not None:  # no libtag: no stack, the blocks' size instead
            examples = ", ".join(g.examples[:4])
            con.print(f"{title} of {g.usable_size} usable bytes: {examples}")
            continue
        con.print(stack_tree(title, g.stack, limit=8))
    if len(leaks) > limit:
        con.print(f"[dim]... {len(leaks) - limit} more groups (--json has them all)[/dim]")


def show_leak_check(doc: LeakCheckDoc, *, top: int = 10) -> None:
    """forensics run --leaks: one process's report, on stderr (stdout is
    CMD's).  Lines are never wrapped: a path stays on one line."""
    con = err_console()

    def say(line: str = "") -> None:
        con.print(line, soft_wrap=True, highlight=False)

    def amount(blocks: int, nbytes: int) -> str:
        return f"{plural(nbytes, 'byte')} in {plural(blocks, 'block')}"

    tot = doc.totals
    say(f"\n[bold]forensics: leak check of pid {doc.pid}[/bold] "
        f"({_e(doc.exe or '?')}) at exit")
    shown = [g for g in doc.leaks if g.kind != "possible"]
    for g in shown[:top]:
        color = "red" if g.kind == "definite" else "yellow"
        extra = ""
        if g.indirect_blocks:
            extra = (f" (+{amount(g.indirect_blocks, g.indirect_bytes)}"
                     f" lost through {'it' if g.blocks == 1 else 'them'})")
        say(f"\n[bold {color}]{g.kind} leak[/bold {color}] of {amount(g.blocks, g.bytes)}{extra}, "
            f"allocated at:")
        for i, f in enumerate(g.stack[:24]):
            say(f"    #{i} {_frame_text(f)}")
        if len(g.stack) > 24:
            say(f"    [dim]... {len(g.stack) - 24} more frames[/dim]")
    if len(shown) > top:
        rest = shown[top:]
        say(f"\n[dim]... {plural(len(rest), 'more group')}: "
            f"{amount(sum(g.blocks for g in rest), sum(g.bytes for g in rest))}"
            f" (--top N shows more, --json FILE has them all)[/dim]")
    sup = doc.suppressed
    if sup.blocks:
        say(f"\nsuppressed: {amount(sup.blocks, sup.bytes)} ("
            + ", ".join(f"{_e(p.pattern)}: {plural(p.blocks, 'block')}" for p in sup.patterns)
            + ")")
    lost = [f"{amount(t.blocks, t.bytes)} {how} lost" for t, how in
            ((tot.definite, "definitely"), (tot.indirect, "indirectly"), (tot.possible, "possibly"))
            if t.blocks]
    say(f"\n[bold]SUMMARY[/bold]: pid {doc.pid}: " + (", ".join(lost) if lost else "no leaks"))
    say(f"core: {_e(doc.core)}")
    for w in doc.warnings:
        say(f"[yellow]warning:[/yellow] {_e(w)}")


def show_diff(doc: DiffDoc | SizeDiffDoc, *, top: int = 20) -> None:
    """diff's document: growth by allocation stack, or - for heaps without
    stacks - by size class (docs/json.md, "diff")."""
    if isinstance(doc, SizeDiffDoc):
        _show_size_diff(doc, top=top)
        return
    con = out_console()
    o, n = doc.old, doc.new
    con.print(f"[bold]old[/bold] {_e(o.core)}: {plural(o.live_blocks, 'live block')}, "
              f"{plural(o.live_bytes, 'byte')}")
    con.print(f"[bold]new[/bold] {_e(n.core)}: {plural(n.live_blocks, 'live block')}, "
              f"{plural(n.live_bytes, 'byte')}")
    if not doc.same_process:
        con.print("[dim]different processes: stacks matched by their frames, no block survives[/dim]")
    con.print(f"{plural(doc.new_blocks, 'new block')} ({plural(doc.new_bytes, 'byte')}), "
              f"{doc.gone_blocks} gone ({plural(doc.gone_bytes, 'byte')}), "
              f"{doc.survived_blocks} survived")
    growth = doc.growth
    if not growth:
        con.print("\n[bold]growth[/bold] none")
    for i, g in enumerate(growth[:top], 1):
        con.print(stack_tree(
            f"#{i}: [bold]{signed(g.bytes, 'byte')}, {signed(g.blocks, 'block')}[/bold] "
            f"({g.old.blocks} -> {plural(g.new.blocks, 'block')}; {g.survived} survived, "
            f"{g.added} new, {g.gone} gone; {round(100 * g.same_size_share)}% of the new "
            f"are {plural(g.common_size or 0, 'byte')})", g.stack, limit=8))
    if len(growth) > top:
        con.print(f"[dim]... {len(growth) - top} more stacks (--json has them all)[/dim]")


def _show_size_diff(doc: SizeDiffDoc, *, top: int) -> None:
    """Growth by size class: the blocks in use of each usable size."""
    con = out_console()
    for key, d in (("old", doc.old), ("new", doc.new)):
        con.print(f"[bold]{key}[/bold] {_e(d.core)}: {plural(d.chunks, 'chunk')} in use, "
                  f"{plural(d.bytes, 'byte')}")
    if doc.same_process:
        con.print(f"{plural(doc.new_chunks, 'new chunk')}, {doc.gone_chunks} gone, "
                  f"{doc.kept_chunks} kept (same address, same size)")
    else:
        con.print("[dim]different processes: chunks compared by size only[/dim]")
    rows = doc.size_classes
    if not rows:
        con.print("\n[bold]growth[/bold] none")
    else:
        con.print(table("growth by chunk size (usable bytes)",
                        ["usable size", "chunks", "bytes", "old -> new chunks", "kept", "new", "gone"],
                        [(r.usable_size, f"{r.chunks:+d}", f"{r.bytes:+d}",
                          f"{r.old_chunks} -> {r.new_chunks}", r.kept, r.added, r.gone)
                         for r in rows[:top]]))
    if len(rows) > top:
        con.print(f"[dim]... {len(rows) - top} more sizes (--json has them all)[/dim]")
    con.print(f"[dim]without libtag: {_e(doc.without_libtag.summary)}[/dim]")


def show_trend(doc: TrendDoc) -> None:
    con = out_console()
    con.print("[bold]snapshots[/bold]")
    for i, snap in enumerate(doc.snapshots, 1):
        con.print(f"#{i} at {snap.time_ms} ms: {plural(snap.live_blocks, 'live block')}, "
                  f"{plural(snap.live_bytes, 'byte')}: {_e(snap.core)}")
    con.print(f"\n[bold]{doc.monotonic_stacks}[/bold] "
              f"{'stack grows' if doc.monotonic_stacks == 1 else 'stacks grow'} monotonically")
    for s in doc.stacks:
        flag = "[bold red]grows[/bold red] " if s.monotonic else ""
        series = " -> ".join(str(b) for b in s.bytes)
        con.print(stack_tree(f"{flag}bytes {series} (blocks {' -> '.join(map(str, s.blocks))})",
                             s.stack, limit=6))
    hidden = doc.stacks_total - len(doc.stacks)
    if hidden > 0:
        con.print(f"[dim]... {plural(hidden, 'more stack')} not shown (--top N shows more; "
                  f"--json has them all)[/dim]")


def show_triage(doc: dict) -> None:
    """triage's groups, most cores first: the signature, the count and
    times, the programs, the example core and what it says (its
    signature, block and address_owner typed, as in inspect's document)."""
    con = out_console()
    groups = doc["groups"]
    con.print(f"[bold]{plural(doc['cores'], 'core')}[/bold], {plural(len(groups), 'group')}"
              + (f", {len(doc['unsigned'])} without an anomaly or a crash" if doc["unsigned"] else ""))
    for i, g in enumerate(groups, 1):
        sig = g["signature"]
        con.print(f"\n[bold]#{i}: {plural(g['count'], 'core')}[/bold]  {_e(sig.text)}  "
                  f"[dim]({sig.id})[/dim]")
        con.print(f"  first {g['first_time']}, last {g['last_time']}")
        for p in g["processes"]:
            pids = ", ".join(map(str, p["pids"][:8])) + (" ..." if len(p["pids"]) > 8 else "")
            con.print(f"  {_e(p['exe'] or '?')} (pid {pids})")
        if g["hosts"]:
            con.print(f"  hosts: {_e(', '.join(g['hosts']))}")
        con.print(f"  newest: {_e(g['example'])}")
        a = g["answer"]
        if a["summary"]:
            con.print(f"  {_e(a['summary'])}")
        else:
            con.print(f"  {a['kind']} at {a['address']}")
        owner = a["address_owner"]
        if owner is not None and a["block"] is None and owner.note:
            con.print(f"  the address: {_e(owner.region or owner.owner)}, {_e(owner.note)}")
        b = a["block"]
        if b is not None:
            for line in _block_lines(b):
                con.print(line)
    for s in doc["skipped"]:
        err_console().print(f"[yellow]skipped:[/yellow] {_e(s['error'])}")
