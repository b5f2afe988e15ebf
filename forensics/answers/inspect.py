"""The answer of ``inspect``: what the core is, why it was taken, the anomaly or
crash with its stacks, the heap totals, the top allocation stacks and every
thread's logical stack - as the inspect document (docs/json.md, "inspect")."""

from __future__ import annotations

from forensics.answers.shapes import block_json, frames_json, hexaddr, iso_time
from forensics.reader import abi
from forensics.reader.dump import Dump
from forensics.reader.model import Frame


def crash_frames(dump: Dump, tid: int) -> list[Frame]:
    """The faulting thread's stack as gdb's bt shows it on the core: unwound
    from the thread's registers in the core (through a signal handler's
    frame into the code it interrupted).  Where that gives fewer frames than
    the stack libtag recorded from the signal's context (crash.stack), or
    none, the recorded one."""
    t = dump.thread(tid)
    frames = dump.thread_frames(t) if t is not None else []
    c = dump.control.crash
    recorded = dump.stack(c.stack) if c is not None and c.stack else []
    return recorded if len(recorded) > len(frames) else frames


# si_code values (<asm-generic/siginfo.h>): who sent the signal, and for the
# kernel's faults what kind of fault.  si_code <= 0: a process sent it, and
# si_pid/si_uid share si_addr's place in the union.
SI_CODES = {0: "SI_USER", -1: "SI_QUEUE", -2: "SI_TIMER", -3: "SI_MESGQ", -4: "SI_ASYNCIO",
            -5: "SI_SIGIO", -6: "SI_TKILL", 0x80: "SI_KERNEL"}
SI_KERNEL = 0x80
_SENDER_CODES = (0, -1, -3, -6)  # the codes whose siginfo carries si_pid and si_uid
FAULT_CODES = {
    "SIGSEGV": {1: "SEGV_MAPERR", 2: "SEGV_ACCERR", 3: "SEGV_BNDERR", 4: "SEGV_PKUERR"},
    "SIGBUS": {1: "BUS_ADRALN", 2: "BUS_ADRERR", 3: "BUS_OBJERR", 4: "BUS_MCEERR_AR", 5: "BUS_MCEERR_AO"},
    "SIGFPE": {1: "FPE_INTDIV", 2: "FPE_INTOVF", 3: "FPE_FLTDIV", 4: "FPE_FLTOVF", 5: "FPE_FLTUND",
               6: "FPE_FLTRES", 7: "FPE_FLTINV", 8: "FPE_FLTSUB"},
    "SIGILL": {1: "ILL_ILLOPC", 2: "ILL_ILLOPN", 3: "ILL_ILLADR", 4: "ILL_ILLTRP", 5: "ILL_PRVOPC",
               6: "ILL_PRVREG", 7: "ILL_COPROC", 8: "ILL_BADSTK"},
}
# signals whose si_addr is the address of the faulting instruction, not of data
_PC_SIGNALS = ("SIGFPE", "SIGILL", "SIGTRAP")
# a word of libtag's free pattern: a pointer read from a freed block
FREED_WORD = int.from_bytes(bytes([abi.TAG_FREE_PATTERN]) * 8, "little")
_NEAR_FREED = 1 << 16  # a pattern pointer plus a field offset is still "from a freed block"


def _freed_pointer(value: int | None) -> bool:
    return value is not None and abs(value - FREED_WORD) < _NEAR_FREED


def crash_doc(dump: Dump, c) -> dict:
    """The crash of inspect's document (docs/json.md, "The crash"): what the
    signal says (a fault address only when the kernel gave one; else the
    sender, or the address decoded from the faulting instruction) and its
    cause when it is known (a pointer read from a freed block)."""
    from forensics.answers.owners import classify, near_note

    name = c.signal_name
    code = c.code - (1 << 32) if c.code >= 1 << 31 else c.code  # si_code is a signed int
    codes = {**SI_CODES, **FAULT_CODES.get(name, {})} if 0 < code != SI_KERNEL else SI_CODES
    code_name = codes.get(code)
    address = source = sender = cause = insn = None
    if code <= 0:
        if code in _SENDER_CODES:
            pid, uid = c.address & 0xFFFFFFFF, c.address >> 32
            sender = {"pid": pid, "uid": uid, "self": pid == dump.pid}
    elif code == SI_KERNEL:
        regs = dump.crash_registers(c.thread)
        if regs is not None and name in ("SIGSEGV", "SIGBUS"):
            address, insn, cause = _decode_fault(dump, regs)
            source = "decoded" if address is not None else None
    else:
        address = c.address
        source = "instruction" if name in _PC_SIGNALS else "fault"
    summary = _crash_summary(name, code, code_name, address, source, sender, insn, cause)
    owner = None
    if address is not None:
        where = classify(dump, address)
        owner = {
            "owner": where.owner,
            "region": where.region_name,
            "note": where.note or (near_note(where.near) if where.near else ""),
            "block": block_json(where.block, dump, offset=address - where.block.start)
            if where.block else None,
        }
    return {
        "signal": name,
        "address": hexaddr(address),
        "address_source": source,
        "sender": sender,
        "instruction": insn,
        "cause": cause,
        "summary": summary,
        "thread": c.thread,
        "time": iso_time(int(dump.control.fields.start_realtime_ns) + c.time_ms * 1_000_000),
        "time_ms": c.time_ms,
        "stack": frames_json(crash_frames(dump, c.thread)),
        "code": code,
        "code_name": code_name,
        "address_owner": owner,
    }


def _decode_fault(dump: Dump, regs: dict[str, int]) -> tuple[int | None, str | None, dict | None]:
    """(address, instruction text, cause) of a fault the kernel gave no
    address for, from the instruction at the faulting pc and the registers.
    The cause (docs/json.md, "The crash"): "use-after-free" when the
    address or its base register holds libtag's free pattern, with the
    freed block the pointer was read from when the load that gave it is
    found and the word there still holds it (else that block is null:
    unknown, never a guess); "unknown" otherwise, with where the pointer was
    read from when that is found."""
    from forensics.reader import insn as ins

    pc = regs.get("rip")
    sym = dump.symbolizer
    code = ins.read_code(dump.mem.read, sym, pc, ins.MAX_INSN) if pc else None
    mem = ins.decode_at(code, pc, regs) if code else None
    if mem is None:
        return None, None, None
    base_value = regs.get(mem.base) if mem.base else None
    freed = _freed_pointer(mem.address) or _freed_pointer(base_value)
    cause = {"kind": "use-after-free" if freed else "unknown", "register": mem.base,
             "value": hexaddr(base_value), "loaded_from": None, "load": None, "load_in": None,
             "block": None}
    found = _pointer_load(dump, pc, mem.base, regs) if base_value is not None else None
    if found is not None:
        holder, load, where = found
        # the word there must hold what the register held: the load is
        # the one that gave the pointer, not another path's
        try:
            word = int.from_bytes(dump.mem.read(holder, 8), "little")
        except Exception:  # noqa: BLE001 - unreadable: the load is not confirmed
            word = None
        if word == base_value:
            cause.update(loaded_from=hexaddr(holder), load=load, load_in=where)
            block = dump.heap.block_at(holder)
            if block is not None:
                cause["block"] = block_json(block, dump, offset=holder - block.start)
    return mem.address, mem.text, cause


def _pointer_load(dump: Dump, pc: int, reg: str | None, regs: dict[str, int]
                  ) -> tuple[int, str, str] | None:
    """(address, load instruction, "function" | "caller") of the load that
    gave register reg its value at the fault: in the faulting function
    before pc, or - reg an argument that function never wrote - in its
    caller before the call."""
    from forensics.reader import insn as ins

    if not reg:
        return None
    body = _function_code(dump, pc)
    if body is None:
        return None
    start, code = body
    found = ins.load_source(code, start, pc, reg, regs)
    if found is not None:
        return (*found, "function")
    if reg not in ins.ARG_REGS or ins.writes(code, start, pc, reg):
        return None
    caller = dump.unwinder.caller_regs(regs)
    ra = caller.get("rip") if caller else None
    body = _function_code(dump, ra) if ra else None
    if body is None:
        return None
    start, code = body
    # the caller's code before its call (ra is the instruction after it)
    call = ins.start_of_last(code, start)
    found = ins.load_source(code, start, call, reg, caller) if call is not None else None
    return (*found, "caller") if found is not None else None


def _function_code(dump: Dump, pc: int) -> tuple[int, bytes] | None:
    """(start, code) of the function holding pc, from its start up to pc."""
    from forensics.reader import insn as ins

    sym = dump.symbolizer
    (frame,) = sym.symbolize([(pc, abi.TAG_FRAME_SIGNAL)])
    if frame.offset is None or not 0 <= frame.offset <= ins.MAX_SCAN:
        return None
    if frame.offset == 0:
        return pc, b""  # the function's first instruction: nothing ran before it
    start = pc - frame.offset
    code = ins.read_code(dump.mem.read, sym, start, frame.offset)
    return (start, code) if code else None


def _crash_summary(name, code, code_name, address, source, sender, insn, cause) -> str:
    """One line that says what the crash is, for people (text and report)."""
    if sender is not None:
        who = "the process itself (abort, raise)" if sender["self"] else f"pid {sender['pid']}"
        return f"{name} sent by {who} (pid {sender['pid']}, uid {sender['uid']}, {code_name})"
    if code <= 0:
        return f"{name} sent by a process ({code_name or code})"
    if code == SI_KERNEL:
        head = f"{name}: general-protection fault (the kernel gives no address)"
        if address is None:
            return head
        head += f"; {insn} accesses {address:#x}"
        if cause is not None:
            head += ": " + _cause_text(cause)
        return head
    what = "instruction" if source == "instruction" else "address"
    return f"{name} ({code_name or code}) at {what} {address:#x}"


def _cause_text(cause: dict) -> str:
    b = cause["block"]
    where = (f"{b['state']} block {b['start']} ({b['size']} bytes), at offset {b['offset']} of it"
             if b is not None else f"{cause['loaded_from']}, in no block" if cause["loaded_from"] else None)
    if cause["kind"] == "use-after-free":
        if b is not None and b["state"] == "freed":
            return f"a use-after-free: a pointer read from freed block {b['start']} ({b['size']} bytes), " \
                   f"at offset {b['offset']} of it"
        return (f"a pointer read from a freed block ({cause['register']} = {cause['value']}); "
                "which block is unknown" + (f" (it was loaded from {where})" if where else
                                             f": the load that gave {cause['register']} was not found"))
    return ("no freed block explains it (cause unknown"
            + (f"; the pointer was read from {where}" if where else "") + ")")


def latent_uaf_docs(dump: Dump) -> list[dict]:
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
    return [{
        "kind": "use-after-free",
        "address": hexaddr(b.start + off),
        "block": block_json(b, dump, offset=off),
        "stack": [],
        "thread": None,
        # found in the core: no later than the core's own time
        "time": iso_time(when) if taken is not None else None,
        "time_ms": taken,
        "offset": off,
        "written": w.hex() if w is not None else None,
        "dealloc": None,
        "access": None,
        "pc": None,
        "detected_by": "reader",
    } for b, off, w in found]


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
    from forensics.answers.runtime import split_stacks

    return split_stacks(dump, dump.heap.by_stack("live"), show=runtime, extra=runtime_functions)


def inspect_doc(dump: Dump, *, top: int = 10, runtime: bool = False, runtime_functions=()) -> dict:

    heap, control = dump.heap, dump.control
    totals = heap.totals
    # top 0 (the report's events): no stacks, so none to sort out either
    stacks, runtime_sum = (top_stacks(dump, runtime=runtime, runtime_functions=runtime_functions)
                           if top else ([], None))
    by_stack = stacks[:top]
    dump.prefetch([s for s, _, _, _ in by_stack])

    anomalies = []
    a = control.anomaly
    if a is not None:
        # libtag records no block for an invalid free (it is not a block's
        # start); when the address is inside a tagged block, that block is the
        # one the user needs (free(p + 32) of a live p).
        block = a.block if a.block is not None else heap.block_at(a.address)
        dump.prefetch([a.stack] + ([block.alloc_stack, block.free_stack or 0] if block else []))
        anomalies.append({
            "kind": a.kind,
            "address": hexaddr(a.address),
            "block": block_json(block, dump, offset=a.address - block.start) if block else None,
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
            "detected_by": "libtag",
        })

    anomalies += latent_uaf_docs(dump)

    crash = crash_doc(dump, control.crash) if control.crash is not None else None

    threads = []
    for t in dump.threads:
        threads.append({"tid": t.tid, "sp": hexaddr(t.sp),
                        "stack": frames_json(dump.thread_frames(t))})

    counters = control.counters
    return {
        "core": dump.core.path if dump.core is not None else dump.mem.name,
        "process": {"pid": dump.pid, "exe": dump.exe},
        "reason": inspect_reason(control),
        "payload": "omitted" if control.payload_omitted else "kept",
        "libtag": True,
        "crash": crash,
        "heap": {
            "live_blocks": totals.live_blocks,
            "live_bytes": totals.live_bytes,
            "freed_blocks": totals.freed_blocks,
            "freed_bytes": totals.freed_bytes,
        },
        "anomalies": anomalies,
        "top_stacks": [{"stack": frames_json(dump.stack(s)), "blocks": n, "bytes": b, "runtime": rt}
                       for s, n, b, rt in by_stack],
        "runtime": runtime_sum,
        "threads": threads,
        "counters": counters,
        "warnings": dump.warnings,
    }


# Blocks a --blocks answer lists at the most (it counts them all).
MAX_STACK_BLOCKS = 200


def blocks_of_stacks(dump: Dump, stack_ids, limit: int) -> dict[int, list[dict]]:
    """The first limit live blocks of each allocation stack in stack_ids, by
    address: start, size, thread and age at the snapshot (ms; None when the
    core's time is unknown).  One sort of the live blocks for all of them."""
    import numpy as np

    x = dump.heap.index
    live = np.flatnonzero(x["state"] == abi.TAG_STATE_LIVE)
    by = live[np.argsort(x["alloc_stack"][live], kind="stable")]  # stable: by address within a stack
    keys = x["alloc_stack"][by]
    taken = dump.taken_ms
    out: dict[int, list[dict]] = {}
    for sid in stack_ids:
        lo = int(np.searchsorted(keys, sid, "left"))
        hi = min(int(np.searchsorted(keys, sid, "right")), lo + limit)
        blocks = []
        for i in by[lo:hi].tolist():
            alloc = int(x["alloc_time"][i])
            blocks.append({"start": hexaddr(int(x["start"][i])), "size": int(x["size"][i]),
                           "thread": int(x["tid"][i]),
                           "age_ms": taken - alloc if taken is not None and taken >= alloc else None})
        out[sid] = blocks
    return out


def stack_blocks(dump: Dump, rank: int, *, runtime: bool = False, runtime_functions=()) -> dict:
    """The live blocks of the rank-th allocation stack by live bytes (as
    inspect numbers them: #1 is the first): every block's start, size,
    thread and age at the snapshot, by address, at most MAX_STACK_BLOCKS."""
    from forensics.errors import InputError

    stacks, folded = top_stacks(dump, runtime=runtime, runtime_functions=runtime_functions)
    if not 1 <= rank <= len(stacks):
        more = (f" (and {folded['stacks']} of the runtime's, which --runtime lists)"
                if folded["stacks"] and not runtime else "")
        raise InputError(f"inspect: --blocks {rank}: the core has {len(stacks)} allocation "
                         f"stacks with live blocks (#1 to #{len(stacks)}){more}")
    sid, count, nbytes, _ = stacks[rank - 1]
    blocks = blocks_of_stacks(dump, [sid], MAX_STACK_BLOCKS)[sid]
    return {"rank": rank, "stack": frames_json(dump.stack(sid)), "count": count, "bytes": nbytes,
            "blocks": blocks}
