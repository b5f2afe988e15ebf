"""The answer of ``inspect``: what the core is, why it was taken, the anomaly or
crash with its stacks, the heap totals, the top allocation stacks and every
thread's logical stack - as the inspect document (docs/json.md, "inspect").
A heap without tags (glibc's) has no anomalies, stacks or counters; its
document has the heap map instead (docs/json.md, "Without libtag")."""

from __future__ import annotations

import dataclasses

from forensics._np import np

from forensics.answers.crash import crash_doc
from forensics.answers.documents import (AnomalyDoc, ArenaDoc, ChunkCount, Counters, GlibcMap, HeapSpan,
                                         HeapTotals, InspectDoc, ProcessRef, RuntimeSummary, SizeRow, StackBlock,
                                         StackBlocksDoc, TcacheDoc, ThreadDoc, TopSizes, TopStack, TypeCount,
                                         WithoutLibtag)
from forensics.answers.leaks import leaks_doc
from forensics.answers.runtime import split_stacks
from forensics.answers.shapes import block_doc, finding_doc, frames_doc, hexaddr, iso_time
from forensics.answers.signature import signature
from forensics.errors import InputError
from forensics.heaps import BothSource, heap_of
from forensics.heaps.glibc import GlibcSource
from forensics.reader import abi
from forensics.reader.dump import Dump
from forensics.reader.glibc_walk import S


def latent_uaf_docs(dump: Dump) -> list[AnomalyDoc]:
    """The use-after-free writes the core shows in freed blocks that libtag
    has not reported (docs/json.md: anomalies with ``detected_by`` "reader"),
    by address; the block of a recorded use-after-free is not repeated."""
    control = dump.control
    a = control.anomaly
    known = a.block.start if a is not None and a.kind == "use-after-free" and a.block else None
    found = [(b, off, w) for b, off, w in dump.heap.latent_uaf() if b.start != known]
    dump.prefetch([s for b, _, _ in found for s in (b.alloc_stack, b.free_stack or 0)])
    taken = control.taken_ms
    when = int(control.fields.start_realtime_ns) + (taken or 0) * 1_000_000
    return [AnomalyDoc(
        kind="use-after-free",
        address=hexaddr(b.start + off),
        block=block_doc(b, dump, offset=off),
        stack=[],
        thread=None,
        # found in the core: no later than the core's own time
        time=iso_time(when) if taken is not None else None,
        time_ms=taken,
        offset=off,
        written=w.hex() if w is not None else None,
        dealloc=None,
        access=None,
        pc=None,
        detected_by="reader",
    ) for b, off, w in found]


def inspect_reason(control) -> str:
    """inspect's reason: "on-demand", "exit", an anomaly kind, or "crash".  A core
    libtag did not trigger (gcore, a kill the crash hook did not see) has no
    recorded reason: it is a snapshot taken on demand by other means."""
    reason = control.reason
    if reason == "none" or reason.startswith("reason-"):
        return "crash" if control.crash is not None else "on-demand"
    return reason


def top_stacks(dump: Dump, *, runtime: bool = False, runtime_functions=()) -> tuple[list, dict]:
    """The live allocation stacks as inspect numbers them, most bytes first:
    [(stack id, blocks, bytes, is the runtime's)] without the C and C++
    runtimes' own stacks unless runtime, and the runtime's totals
    (forensics.answers.runtime)."""
    return split_stacks(dump, dump.heap.by_stack("live"), show=runtime, extra=runtime_functions)


def inspect_doc(dump: Dump, *, top: int = 10, runtime: bool = False, runtime_functions=()) -> InspectDoc:
    """The inspect document of dump (docs/json.md, "inspect"): without
    ``leaks`` and ``stack_blocks``, which the verb adds when asked
    (leaks_doc, stack_blocks)."""
    heap = heap_of(dump)
    totals = heap.totals()
    anomalies, tops, runtime_sum = [], [], None
    if heap.tagged:
        # top 0 (the report's events): no stacks, so none to sort out either
        stacks, runtime_sum = (top_stacks(dump, runtime=runtime, runtime_functions=runtime_functions)
                               if top else ([], None))
        by_stack = stacks[:top]
        dump.prefetch([s for s, _, _, _ in by_stack])
        anomalies = recorded_anomaly_docs(dump) + latent_uaf_docs(dump)
        tops = [TopStack(stack=frames_doc(dump.stack(s)), blocks=n, bytes=b, runtime=rt)
                for s, n, b, rt in by_stack]
    # after the stacks: what symbolising them warns of comes first
    crash = crash_doc(dump)
    threads = [ThreadDoc(tid=t.tid, sp=hexaddr(t.sp), stack=frames_doc(dump.thread_frames(t)))
               for t in dump.threads]
    glibc = (glibc_map(heap, top=top) if isinstance(heap, GlibcSource)
             # the blocks from before libtag was attached
             else glibc_map(heap.glibc, top=top) if isinstance(heap, BothSource) else None)
    return InspectDoc(
        core=dump.core.path if dump.core is not None else dump.mem.name,
        process=ProcessRef(pid=dump.pid, exe=dump.exe),
        reason=(inspect_reason(dump.control) if dump.control is not None
                else "crash" if crash is not None else "on-demand"),
        payload="omitted" if dump.control is not None and dump.control.payload_omitted else "kept",
        libtag=heap.tagged,
        crash=crash,
        heap=HeapTotals(live_blocks=totals.live_blocks, live_bytes=totals.live_bytes,
                        freed_blocks=totals.freed_blocks, freed_bytes=totals.freed_bytes),
        anomalies=anomalies,
        top_stacks=tops,
        runtime=RuntimeSummary(**runtime_sum) if runtime_sum is not None else None,
        threads=threads,
        counters=Counters(**dump.control.counters) if dump.control is not None else None,
        glibc=glibc,
        types=live_types(dump, heap, top=top),
        without_libtag=WithoutLibtag.of(heap.without),
        signature=signature(anomalies, crash),
        warnings=dump.warnings,
    )


def inspect_answer(dump: Dump, *, top: int = 10, runtime: bool = False, runtime_functions=(),
                   leaks: bool = False, blocks: int | None = None) -> InspectDoc:
    """The inspect verb's document: inspect_doc, then its leaks (--leaks)
    and the blocks of allocation stack #blocks (--blocks N), in that order
    (what reading them warns of is in its warnings)."""
    doc = inspect_doc(dump, top=top, runtime=runtime, runtime_functions=runtime_functions)
    if leaks:
        doc = dataclasses.replace(doc, leaks=leaks_doc(dump))
    if blocks:
        doc = dataclasses.replace(doc, stack_blocks=stack_blocks(dump, blocks, runtime=runtime,
                                                                 runtime_functions=runtime_functions))
    return doc


def live_types(dump: Dump, heap, *, top: int) -> list[TypeCount]:
    """The live blocks counted by C++ class (by vtable), most bytes first:
    the classes that can be told, at most *top* of them."""
    if not top:
        return []
    starts, sizes, live = heap.blocks()
    rows = dump.types.count(starts[live], sizes[live])
    return [TypeCount(type=c, blocks=n, bytes=b) for c, n, b in rows[:top]]


def recorded_anomaly_docs(dump: Dump) -> list[AnomalyDoc]:
    """The anomaly libtag recorded, as inspect lists it (none, or one)."""
    a = dump.control.anomaly
    if a is None:
        return []
    # libtag records no block for an invalid free (it is not a block's
    # start); when the address is inside a tagged block, that block is the
    # one the user needs (free(p + 32) of a live p).
    block = a.block if a.block is not None else dump.heap.block_at(a.address)
    if block is not None and block.state == "freed" and block.free_stack is None:
        # libtag copies a freed block's free record out of the quarantine
        # rings with process_vm_readv, which a seccomp filter may refuse and
        # qemu-user does not implement: the ring in this memory holds it
        held = dump.heap.block_at(block.start)
        if held is not None and (held.start, held.state) == (block.start, "freed") \
                and held.free_stack is not None:
            block = dataclasses.replace(block, free_thread=held.free_thread, free_time_ms=held.free_time_ms,
                                        free_stack=held.free_stack)
    dump.prefetch([a.stack] + ([block.alloc_stack, block.free_stack or 0] if block else []))
    return [AnomalyDoc(
        kind=a.kind,
        address=hexaddr(a.address),
        block=block_doc(block, dump, offset=a.address - block.start) if block else None,
        stack=frames_doc(dump.stack(a.stack)),
        thread=a.thread,
        time=iso_time(a.time_ns),
        time_ms=a.time_ms,
        # address - block start (negative: below it, -1 for p[-1]);
        # None when the block is unknown (its tag damaged beyond repair)
        offset=a.address - block.start if block else None,
        written=a.written.hex() if a.written is not None else None,
        dealloc=a.dealloc,
        access=a.access,
        pc=hexaddr(a.pc),
        detected_by="libtag",
    )]


def _chunk_counts(per: dict[str, dict[str, int]]) -> dict[str, ChunkCount]:
    return {state: ChunkCount(chunks=c["chunks"], bytes=c["bytes"]) for state, c in per.items()}


def glibc_map(source: GlibcSource, *, top: int) -> GlibcMap:
    """The ``glibc`` object of inspect's document: the libc, its arenas with
    their chunks by state, the tcaches, the most common chunk sizes in use
    and the corruption found."""
    heap = source.heap
    lay = heap.layout
    arenas = []
    for i, a in enumerate(heap.arenas):
        sel = heap.arena_ix == i
        per = {}
        for name, code in S.items():
            m = sel & (heap.state == code)
            if m.any():
                per[name] = ChunkCount(chunks=int(m.sum()), bytes=int(heap.size[m].sum()))
        arenas.append(ArenaDoc(address=hexaddr(a.address), kind="main" if a.main else "thread",
                               threads=list(a.threads), top=hexaddr(a.top), top_size=a.top_size,
                               system_mem=a.system_mem,
                               heaps=[HeapSpan(start=hexaddr(s), end=hexaddr(e)) for s, e in a.heaps],
                               chunks=per))
    by_size = heap.by_size(("inuse", "mmapped"))
    by_count = sorted(by_size, key=lambda t: (-t[1], t[0]))
    return GlibcMap(
        libc=lay.libc_path,
        build_id=lay.build_id,
        version=lay.version,
        layout_from=lay.source,
        arenas=arenas,
        chunks=_chunk_counts(heap.totals()),
        tcaches=[TcacheDoc(thread=tid, address=hexaddr(tc)) for tid, tc in sorted(heap.tcaches.items())],
        top_sizes=TopSizes(
            by_bytes=[_size_row(s, n, b) for s, n, b in by_size[:top]],
            by_count=[_size_row(s, n, b) for s, n, b in by_count[:top]],
        ),
        corruption=[finding_doc(f) for f in source.findings],
        abort_message=heap.abort_message,
    )


def _size_row(size: int, n: int, nbytes: int) -> SizeRow:
    return SizeRow(size=size, usable=size - 8, chunks=n, bytes=nbytes)


# Blocks a --blocks answer lists at the most (it counts them all).
MAX_STACK_BLOCKS = 200


def blocks_of_stacks(dump: Dump, stack_ids, limit: int) -> dict[int, list[StackBlock]]:
    """The first limit live blocks of each allocation stack in stack_ids, by
    address: start, size, thread and age at the snapshot (ms; None when the
    core's time is unknown).  One sort of the live blocks for all of them."""
    x = dump.heap.index
    live = np.flatnonzero(x["state"] == abi.TAG_STATE_LIVE)
    by = live[np.argsort(x["alloc_stack"][live], kind="stable")]  # stable: by address within a stack
    keys = x["alloc_stack"][by]
    taken = dump.taken_ms
    out: dict[int, list[StackBlock]] = {}
    for sid in stack_ids:
        lo = int(np.searchsorted(keys, sid, "left"))
        hi = min(int(np.searchsorted(keys, sid, "right")), lo + limit)
        blocks = []
        for i in by[lo:hi].tolist():
            alloc = int(x["alloc_time"][i])
            blocks.append(StackBlock(start=hexaddr(int(x["start"][i])), size=int(x["size"][i]),
                                     thread=int(x["tid"][i]),
                                     age_ms=taken - alloc if taken is not None and taken >= alloc else None))
        out[sid] = blocks
    return out


def stack_blocks(dump: Dump, rank: int, *, runtime: bool = False, runtime_functions=()) -> StackBlocksDoc:
    """The live blocks of the rank-th allocation stack by live bytes (as
    inspect numbers them: #1 is the first): every block's start, size,
    thread and age at the snapshot, by address, at most MAX_STACK_BLOCKS."""
    if not heap_of(dump).tagged:
        raise InputError("inspect: --blocks: a core without libtag has no allocation stacks")
    stacks, folded = top_stacks(dump, runtime=runtime, runtime_functions=runtime_functions)
    if not 1 <= rank <= len(stacks):
        more = (f" (and {folded['stacks']} of the runtime's, which --runtime lists)"
                if folded["stacks"] and not runtime else "")
        raise InputError(f"inspect: --blocks {rank}: the core has {len(stacks)} allocation "
                         f"stacks with live blocks (#1 to #{len(stacks)}){more}")
    sid, count, nbytes, _ = stacks[rank - 1]
    blocks = blocks_of_stacks(dump, [sid], MAX_STACK_BLOCKS)[sid]
    return StackBlocksDoc(rank=rank, stack=frames_doc(dump.stack(sid)), count=count, bytes=nbytes,
                          blocks=blocks)
