"""What an address is: the heap block that holds it (a tagged block, or a
glibc chunk: forensics.heaps), or else whose stack, which module's globals,
which mapping - and who points at the block.

The answer is plain data (``Owner``); ``whoowns_doc`` gives the whoowns
document (docs/json.md, "whoowns"), which forensics.output.text draws and
``documents.to_json`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forensics._np import np

from forensics.answers.leaks import ROOT_MAPPINGS, Retention, Root, retention_scan
from forensics.answers.documents import (DataSymbolDoc, NearDoc, PathLink, ReferrerDoc, RegionDoc, RetainerDoc,
                                         RootDoc, UseAfterFreeDoc, WhoownsDoc, WithoutLibtag)
from forensics.answers.shapes import block_doc, chunk_doc, hexaddr
from forensics.errors import NotFoundError
from forensics.heaps import BothSource, heap_of
from forensics.reader.dump import Dump
from forensics.reader.glibc_walk import Chunk
from forensics.reader.memory import Region, module_of_data, name_mapping
from forensics.reader.model import Block
from forensics.reader.symbols import DataSymbol

# Referrers listed at most (the total is always given).
MAX_REFERRERS = 200
# Retention paths listed at most (the number of roots is always given), and
# the longest chain of blocks searched back from the block.
MAX_RETAINERS = 10
MAX_RETAIN_DEPTH = 256


@dataclass
class Referrer:
    address: int   # the word that holds the pointer
    where: str     # "heap" | "stack" | "global"
    block_start: int | None
    interior: bool  # points inside the block, not at its start
    thread: int | None = None  # for "stack": whose
    module: str | None = None  # for "global": whose data or bss
    symbol: str | None = None  # for "global": "kv_inst+8", or ".bss+0x40" without a symbol


@dataclass
class Owner:
    address: int
    owner: str  # "heap" | "stack" | "global" | "mapping" | "unmapped"
    block: Any = None  # the heap's block holding it: a tagged Block, or a glibc Chunk
    region_name: str | None = None
    region: Region | None = None
    thread: int | None = None  # for "stack"
    near: tuple[Block, int] | None = None  # (block, bytes past its end)
    referrers: list[Referrer] = field(default_factory=list)
    referrer_count: int = 0
    self_referrers: int = 0  # words inside the block that point into it: left out
    note: str = ""
    symbol: DataSymbol | None = None  # for "global": the object (or section) holding it
    damage: tuple[int, bytes | None] | None = None  # a freed block written after free: offset, bytes
    retention: Retention | None = None  # who keeps the live block (chunk in use) alive
    in_block: bool = False  # in a block the program had (not glibc's top chunk)


def classify(dump: Dump, addr: int) -> Owner:
    """The block or region holding addr, without referrers."""
    heap = heap_of(dump)
    regions = dump.mem.regions()
    region = next((r for r in regions if addr in r), None)
    block = heap.block_at(addr)
    if block is not None:
        place = heap.place(block, addr)
        return Owner(addr, "heap", block=block, region=region, region_name=place.region_name,
                     note=place.note, damage=place.damage, in_block=heap.is_block(block))
    return _place(dump, addr, region, regions, heap.near(addr))


def _place(dump: Dump, addr: int, region: Region | None, regions: list[Region],
           near: tuple[Block, int] | None) -> Owner:
    """What holds an address no block holds: a thread's stack, libtag's
    guard pool, nothing, a module's globals, another mapping."""
    t = dump.thread_of_stack(addr)
    if t is not None:
        live = t.sp is None or addr >= t.sp
        return Owner(addr, "stack", region=t.stack_region, thread=t.tid, near=near,
                     region_name=f"stack of thread {t.tid}",
                     note="" if live else f"below the stack pointer {t.sp:#x} (dead frame)")
    c = dump.control.fields if dump.control is not None else None
    if c is not None and int(c.guard_pool) <= addr < int(c.guard_pool) + int(c.guard_pool_bytes):
        return Owner(addr, "mapping", region=region, near=near, region_name="libtag's guard pool",
                     note=near_note(near) if near else "a guard page, or the slack of a guarded block")
    if region is None:
        return Owner(addr, "unmapped", near=near,
                     note="NULL page" if addr < 4096 else "in no mapping of the process")
    what = name_mapping(regions, region, holds_blocks=_holds_blocks(dump, region))
    if what.kind == "module":
        module = what.module
        sym = dump.symbolizer.data_symbol(module, addr)
        note = f"{sym.label}" + (f" ({sym.section})" if sym.name and sym.section else "") \
            + f" in {module}" if sym is not None else module
        return Owner(addr, "global", region=region, near=near, symbol=sym,
                     region_name=what.name, note=note)
    return Owner(addr, "mapping", region=region, near=near, region_name=what.name,
                 note=near_note(near) if near else "")


def _holds_blocks(dump: Dump, region: Region) -> bool:
    """Whether the heap reader found tagged blocks in region: libtag's heap
    (glibc's is named by its own mappings: [heap], an arena's)."""
    if not dump.libtag:
        return False
    starts = dump.heap.index["start"]
    i = int(np.searchsorted(starts, np.uint64(region.start)))
    return i < len(starts) and int(starts[i]) < region.end


def block_of(dump: Dump, addr: int) -> Block:
    """The tagged block holding addr; NotFoundError saying what addr is instead."""
    where = classify(dump, addr)
    if not isinstance(where.block, Block):  # none, or glibc's chunk
        what = where.region_name or where.owner
        note = where.note or (near_note(where.near) if where.near else "")
        raise NotFoundError(f"{addr:#x} is in no tagged block: {what}" + (f", {note}" if note else ""))
    return where.block


def near_note(near: tuple[Block, int]) -> str:
    b, past = near
    where = "just past the end" if past == 0 else f"{past} bytes past the end"
    return f"{where} of the {b.state} block at {b.start:#x} ({b.size} bytes)"



# Roots first: a global or a stack frame says who keeps a block alive; the
# words of other blocks come after them, so a cut list still shows the owner.
_ROOT_ORDER = {"global": 0, "stack": 1, "heap": 2}


def _cut(out: list[Referrer], self_refs: int) -> tuple[list[Referrer], int, int]:
    """The referrers to show (roots first, at most MAX_REFERRERS), how many
    there are, and how many words of the block itself were left out."""
    out.sort(key=lambda r: (_ROOT_ORDER[r.where], r.address))
    return out[:MAX_REFERRERS], len(out), self_refs


def referrers(dump: Dump, block) -> tuple[list[Referrer], int, int]:
    """Who points into block: words in blocks the program holds, in live
    stack frames (at or above the thread's stack pointer) and in modules'
    globals.  Words in free heap memory are not references and are left out,
    and so are the allocator's own (libtag's tables, glibc's arenas); so are
    the block's own words (a list's links inside a slab, a struct pointing
    at its own member): they are counted, not listed."""
    heap = heap_of(dump)
    target = heap.start_of(block)
    starts = heap.blocks()[0]
    i = int(np.searchsorted(starts, np.uint64(target)))
    if i >= len(starts) or int(starts[i]) != target:
        return [], 0, 0
    edges = dump.edges
    sl = edges.into(i)
    out: list[Referrer] = []
    regions = dump.mem.regions()
    self_refs = 0
    for src, interior in zip(edges.source[sl].tolist(), edges.interior[sl].tolist()):
        holder = heap.block_at(src)
        if heap.is_block(holder):
            start = heap.start_of(holder)
            if start == target:
                self_refs += 1
            elif heap.holds(holder) and src >= start:
                out.append(Referrer(src, "heap", start, bool(interior)))
            continue
        t = dump.thread_of_stack(src)
        if t is not None:
            if t.sp is None or src >= t.sp:
                out.append(Referrer(src, "stack", None, bool(interior), t.tid))
            continue
        region = next((r for r in regions if src in r), None)
        ref = _global_referrer(dump, regions, region, src, bool(interior))
        if ref is not None and not heap.allocator_module(ref.module):
            out.append(ref)
    return _cut(out, self_refs)


def _global_referrer(dump: Dump, regions: list[Region], region: Region | None, src: int,
                     interior: bool) -> Referrer | None:
    """A word outside blocks and stacks that is a root: in a module's globals
    (its symbol), or in shared memory or a file mapped for writing (the
    mapping's name as its symbol); None for any other word."""
    if region is None:
        return None
    module = module_of_data(regions, region)
    if module is not None:
        sym = dump.symbolizer.data_symbol(module, src)
        return Referrer(src, "global", None, interior, module=module,
                        symbol=sym.label if sym is not None else None)
    if region.path and region.writable:
        what = name_mapping(regions, region)
        if what.kind in ROOT_MAPPINGS:
            return Referrer(src, "global", None, interior, module=None, symbol=what.name)
    return None


def whoowns(dump: Dump, addr: int) -> Owner:
    owner = classify(dump, addr)
    heap = heap_of(dump)
    b = owner.block
    if b is not None and (heap.holds(b) or heap.freed_referrers):
        owner.referrers, owner.referrer_count, owner.self_referrers = referrers(dump, b)
        if heap.holds(b):
            owner.retention = retention(dump, heap.start_of(b))
    return owner


def retention(dump: Dump, start: int) -> Retention | None:
    """Who keeps the live block (or chunk in use) at start alive: the
    shortest chains from the leak scan's roots (forensics.answers.leaks:
    globals, live stack frames, static TLS, registers) through live blocks."""
    heap = heap_of(dump)
    return retention_scan(dump).retainers(start, limit=MAX_RETAINERS, max_depth=MAX_RETAIN_DEPTH,
                                          skip_module=heap.skip_root_module)


def frame_function(dump: Dump, tid: int | None, addr: int) -> str | None:
    """The function whose stack frame holds the word at addr in thread tid's
    stack (unwound from its registers with CFI); None when no unwound frame
    holds it (the walk stopped short, or no registers)."""
    t = dump.thread(tid) if tid is not None else None
    if t is None or not t.regs or not t.regs.get(dump.arch.pc):
        return None
    try:
        steps = dump.thread_steps(t)
    except Exception:  # noqa: BLE001 - an unwind that fails names no frame
        return None
    for s in steps:
        if s.sp is not None and s.cfa is not None and s.sp <= addr < s.cfa:
            frames = [f for f in dump.symbolize([(s.pc, s.kind)]) if not f.inlined]
            return frames[-1].function if frames else None
    return None


def root_doc(dump: Dump, root: Root) -> RootDoc:
    """A retention path's root (docs/json.md, "whoowns"): the word (or
    register) that holds the first pointer, named by symbol or frame."""
    module, symbol, section, function = root.module, None, None, None
    if root.kind == "global" and root.address is not None:
        # named as a referrer there is: a module's global by symbol, shared
        # memory (and the like) by the mapping's name
        regions = dump.mem.regions()
        region = next((r for r in regions if root.address in r), None)
        ref = _global_referrer(dump, regions, region, root.address, root.interior)
        module, symbol = (ref.module, ref.symbol) if ref is not None else (None, None)
        if ref is not None and ref.module is not None and ref.symbol is not None:
            section = dump.symbolizer.data_symbol(ref.module, root.address).section
    elif root.kind == "stack" and root.address is not None:
        function = frame_function(dump, root.thread, root.address)
    return RootDoc(kind=root.kind, address=hexaddr(root.address), thread=root.thread,
                   register=root.register.split(":")[-1] if root.register else None,
                   module=module, symbol=symbol, section=section, function=function,
                   interior=root.interior)


def retainer_docs(dump: Dump, r: Retention) -> list[RetainerDoc]:
    return [RetainerDoc(root=root_doc(dump, root),
                        path=[PathLink(address=hexaddr(link.via), block_start=hexaddr(link.block_start),
                                       size=link.size, offset=link.via - link.block_start,
                                       interior=link.interior) for link in links])
            for root, links in r.paths]


def whoowns_doc(dump: Dump, o: Owner) -> WhoownsDoc:
    """The whoowns document (docs/json.md, "whoowns")."""
    region = None
    if o.region is not None or o.region_name:
        r = o.region
        region = RegionDoc(name=o.region_name or (r.path if r else ""),
                           start=hexaddr(r.start) if r else None,
                           end=hexaddr(r.end) if r else None)
    heap = heap_of(dump)
    tagged = o.block if isinstance(o.block, Block) else None
    chunk = o.block if isinstance(o.block, Chunk) else None
    block = block_doc(tagged, dump, offset=o.address - tagged.start) if tagged else None
    referrers = [ReferrerDoc(address=hexaddr(r.address), in_=r.where, block_start=hexaddr(r.block_start),
                             interior=r.interior, thread=r.thread, module=r.module, symbol=r.symbol)
                 for r in o.referrers]
    retainers = retainer_docs(dump, o.retention) if o.retention is not None else None
    # what the block is without its stacks: a C++ class by its vtable
    start = tagged.start if tagged is not None else chunk.user if chunk is not None else None
    type_ = dump.types.of(start) if start is not None else None
    without = heap.without if heap.without is not None else (
        heap.without_of(o.block) if isinstance(heap, BothSource) else None)
    near = None
    if o.near is not None:
        b, past = o.near
        near = NearDoc(block=block_doc(b, dump), past_end=past)
    return WhoownsDoc(
        core=dump.core.path if dump.core is not None else dump.mem.name,
        address=hexaddr(o.address),
        owner=o.owner,
        block=block,
        region=region,
        referrers=referrers,
        referrer_count=o.referrer_count,
        self_referrers=o.self_referrers,
        retainers=retainers,
        retainer_count=o.retention.count if o.retention is not None else None,
        retainers_depth_limited=o.retention.depth_limited if o.retention is not None else False,
        note=o.note,
        symbol=DataSymbolDoc(name=o.symbol.name, offset=o.symbol.offset, section=o.symbol.section,
                             module=o.symbol.module) if o.symbol is not None else None,
        use_after_free=UseAfterFreeDoc(
            address=hexaddr(o.block.start + o.damage[0]), offset=o.damage[0],
            written=o.damage[1].hex() if o.damage[1] is not None else None,
        ) if o.damage is not None and o.block is not None else None,
        # without libtag: glibc's chunk instead of a block (docs/json.md, "Without libtag")
        libtag=dump.libtag,
        chunk=chunk_doc(chunk, offset=o.address - chunk.user) if chunk is not None else None,
        type=type_,
        without_libtag=WithoutLibtag.of(without),
        thread=o.thread,
        near=near,
        # What the reader could not read or trust (a cut core, a corrupt
        # table) is said by every answer: the dump's own list, which the
        # stacks read above (and any reading after) add to.
        warnings=dump.warnings,
    )
