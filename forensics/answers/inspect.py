"""The answer of ``inspect``: what the core is, why it was taken, the anomaly or
crash with its stacks, the heap totals, the top allocation stacks and every
thread's logical stack - as the inspect document (docs/json.md, "inspect")."""

from __future__ import annotations

from forensics.answers.shapes import block_json, frames_json, hexaddr, iso_time
from forensics.reader import abi
from forensics.reader.dump import Dump


def crash_frames(dump: Dump, tid: int):
    """The faulting thread's stack: the faulting instruction, then its shadow
    stack (libtag records no stack id in the signal handler: no locks there)."""
    t = dump.heap.thread(tid)
    regs = t.regs if t is not None else None
    shadow = dump.symbolize(t.shadow) if t is not None else []
    if not (regs and regs.get("rip")):
        return shadow
    # the pc itself, not a return address (ENTRY: looked up as is)
    pc = dump.symbolize([(regs["rip"], abi.TAG_FRAME_ENTRY)])
    # The shadow stack starts with the ENTRY of the innermost instrumented
    # function; when the pc is in that function they are one frame, not two
    # ("crash_read, crash_read, main").
    if (shadow and t.shadow[0][1] == abi.TAG_FRAME_ENTRY and pc[0].function is not None
            and (pc[0].function, pc[0].module) == (shadow[0].function, shadow[0].module)):
        shadow = shadow[1:]
    return pc + shadow


def inspect_reason(heap) -> str:
    """inspect's reason: "on-demand", an anomaly kind, or "crash".  A core
    libtag did not trigger (gcore, a kill the crash hook did not see) has no
    recorded reason: it is a snapshot taken on demand by other means."""
    reason = heap.reason
    if reason == "none" or reason.startswith("reason-"):
        return "crash" if heap.crash is not None else "on-demand"
    return reason


def inspect_doc(dump: Dump, *, top: int = 10) -> dict:
    from forensics.answers.owners import classify, near_note

    heap = dump.heap
    totals = heap.totals
    by_stack = heap.by_stack("live")[:top]
    dump.prefetch([s for s, _, _ in by_stack])

    anomalies = []
    a = heap.anomaly
    if a is not None:
        # libtag records no block for an invalid free (it is not a block's
        # start); when the address is inside a tagged block, that block is the
        # one the user needs (free(p + 32) of a live p).
        block = a.block if a.block is not None else heap.block_at(a.address)
        dump.prefetch([a.stack] + ([block.alloc_stack, block.free_stack or 0] if block else []))
        anomalies.append({
            "kind": a.kind,
            "address": hexaddr(a.address),
            "block": block_json(block, dump.stack, offset=a.address - block.start) if block else None,
            "stack": frames_json(dump.stack(a.stack)),
            "thread": a.thread,
            "time": iso_time(a.time_ns),
            "time_ms": a.time_ms,
            # address - block start (negative: below it, -1 for p[-1]);
            # None when the block is unknown (its tag damaged beyond repair)
            "offset": a.address - block.start if block else None,
            "written": a.written.hex() if a.written is not None else None,
            "dealloc": a.dealloc,
            "access": a.access,
            "pc": hexaddr(a.pc),
        })

    crash = None
    c = heap.crash
    if c is not None:
        where = classify(dump, c.address)
        crash = {
            "signal": c.signal_name,
            "address": hexaddr(c.address),
            "thread": c.thread,
            "stack": frames_json(crash_frames(dump, c.thread)),
            "code": c.code,
            "address_owner": {
                "owner": where.owner,
                "region": where.region_name,
                "note": where.note or (near_note(where.near) if where.near else ""),
                "block": block_json(where.block, dump.stack, offset=c.address - where.block.start)
                if where.block else None,
            },
        }

    threads = []
    for t in dump.threads:
        threads.append({"tid": t.tid, "sp": hexaddr(t.sp),
                        "stack": frames_json(dump.symbolize(t.raw))})

    counters = heap.counters
    return {
        "core": dump.core.path if dump.core is not None else dump.mem.name,
        "process": {"pid": dump.pid, "exe": dump.exe},
        "reason": inspect_reason(heap),
        "payload": "omitted" if heap.payload_omitted else "kept",
        "crash": crash,
        "heap": {
            "live_blocks": totals.live_blocks,
            "live_bytes": totals.live_bytes,
            "freed_blocks": totals.freed_blocks,
            "freed_bytes": totals.freed_bytes,
        },
        "anomalies": anomalies,
        "top_stacks": [{"stack": frames_json(dump.stack(s)), "blocks": n, "bytes": b}
                       for s, n, b in by_stack],
        "threads": threads,
        "counters": counters,
        "warnings": dump.warnings,
    }
