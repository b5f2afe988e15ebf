"""The crash of a core, as every verb says it (docs/json.md, "The crash"):
the signal and its si_code, who sent it or what address faulted, the
faulting thread and its stack, what holds the address, and - where that is
known - the cause: a pointer read from a freed block (libtag), or what a
crash inside glibc's malloc family means for its heap (without libtag).

The signal comes from libtag's crash record when the process ran libtag
(it has the fault's time and registers), else from the kernel's NT_SIGINFO
for a fatal signal; the si_code tables that name it are here.  Signal
names themselves are forensics.core.notes.signal_name (the reader names
signals too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from forensics.answers.documents import AddressOwnerDoc, CauseDoc, CrashDoc, MallocDoc, SenderDoc
from forensics.answers.owners import classify, near_note
from forensics.answers.shapes import block_doc, chunk_doc, frames_doc, hexaddr, iso_time
from forensics.core.notes import signal_name
from forensics.heaps import heap_of
from forensics.heaps.glibc_crash import malloc_explanation
from forensics.reader import abi
from forensics.reader import insn as ins
from forensics.reader.dump import Dump
from forensics.reader.glibc_walk import Chunk
from forensics.reader.model import Block, Frame


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
# the signals a core the kernel wrote (no libtag record) is read as a crash for
FATAL = {"SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE", "SIGTRAP", "SIGSYS"}
# a word of libtag's free pattern: a pointer read from a freed block
FREED_WORD = int.from_bytes(bytes([abi.TAG_FREE_PATTERN]) * 8, "little")
_NEAR_FREED = 1 << 16  # a pattern pointer plus a field offset is still "from a freed block"


def _freed_pointer(value: int | None) -> bool:
    return value is not None and abs(value - FREED_WORD) < _NEAR_FREED


def code_name(signal: str, code: int) -> str | None:
    """The name of a signal's si_code ("SEGV_MAPERR", "SI_TKILL"), None when
    it has none."""
    codes = {**SI_CODES, **FAULT_CODES.get(signal, {})} if 0 < code != SI_KERNEL else SI_CODES
    return codes.get(code)


@dataclass
class _Signal:
    """The signal of a crash, from libtag's record or the kernel's note."""

    name: str
    code: int
    thread: int
    frames: list[Frame]
    address: int | None = None
    source: str | None = None  # "fault" | "instruction" | "decoded"
    sender: SenderDoc | None = None
    insn: str | None = None
    cause: CauseDoc | None = None
    time_ms: int | None = None
    time: str | None = None


def _recorded(dump: Dump, c) -> _Signal:
    """The crash libtag recorded: a fault address only when the kernel gave
    one; else the sender, or the address decoded from the faulting
    instruction, with its cause when it is known (a pointer read from a
    freed block)."""
    name = c.signal_name
    code = c.code - (1 << 32) if c.code >= 1 << 31 else c.code  # si_code is a signed int
    s = _Signal(name, code, c.thread, crash_frames(dump, c.thread), time_ms=c.time_ms,
                time=iso_time(int(dump.control.fields.start_realtime_ns) + c.time_ms * 1_000_000))
    if code <= 0:
        if code in _SENDER_CODES:
            pid, uid = c.address & 0xFFFFFFFF, c.address >> 32
            s.sender = SenderDoc(pid=pid, uid=uid, self=pid == dump.pid)
    elif code == SI_KERNEL:
        regs = dump.crash_registers(c.thread)
        if regs is not None and name in ("SIGSEGV", "SIGBUS"):
            s.address, s.insn, s.cause = _decode_fault(dump, regs)
            s.source = "decoded" if s.address is not None else None
    else:
        s.address = c.address
        s.source = "instruction" if name in _PC_SIGNALS else "fault"
    return s


def _kernel(dump: Dump) -> _Signal | None:
    """The fatal signal of a core the kernel wrote (NT_SIGINFO), taken by
    the core's first thread; None for a core without one (gcore of a
    running process)."""
    si = dump.core.siginfo if dump.core is not None else None
    if si is None or not dump.threads:
        return None
    name = signal_name(si.signo)
    if name not in FATAL:
        return None
    thread = dump.threads[0]
    s = _Signal(name, si.code, thread.tid, dump.thread_frames(thread))
    if si.sender_pid is not None and si.code <= 0:
        s.sender = SenderDoc(pid=si.sender_pid, uid=si.sender_uid, self=si.sender_pid == dump.pid)
    elif si.code > 0 and si.code != SI_KERNEL and si.addr is not None:
        s.address = si.addr
        s.source = "instruction" if name in _PC_SIGNALS else "fault"
    return s


def crash_doc(dump: Dump) -> CrashDoc | None:
    """The crash of inspect's document (docs/json.md, "The crash"); None
    when the core has none."""
    if dump.control is not None:
        c = dump.control.crash
        s = _recorded(dump, c) if c is not None else None
    else:
        s = _kernel(dump)
    if s is None:
        return None
    heap = heap_of(dump)
    cname = code_name(s.name, s.code)
    owner = None
    if s.address is not None:
        where = classify(dump, s.address)
        b = where.block
        # glibc's chunk: without libtag, or from before libtag was attached
        chunks = not heap.tagged or isinstance(b, Chunk)
        owner = AddressOwnerDoc(
            owner=where.owner, region=where.region_name,
            note=where.note or (near_note(where.near) if where.near else ""),
            block=block_doc(b, dump, offset=s.address - b.start) if isinstance(b, Block) else None,
            chunk=chunk_doc(b, offset=s.address - b.user) if chunks and isinstance(b, Chunk) else None,
            chunks=chunks)
    stack = frames_doc(s.frames)
    malloc = None
    glibc = heap.kind == "glibc"
    if glibc:
        thread = next(t for t in dump.threads if t.tid == s.thread)
        m = malloc_explanation(dump, thread, s.frames)
        malloc = None if m is None else MallocDoc(
            call=m.call, glibc_message=m.glibc_message,
            chunk=chunk_doc(m.chunk) if m.chunk is not None else None, summary=m.summary)
    return CrashDoc(
        signal=s.name,
        address=hexaddr(s.address),
        address_source=s.source,
        sender=s.sender,
        instruction=s.insn,
        cause=s.cause,
        summary=crash_summary(s.name, s.code, cname, s.address, s.source, s.sender, s.insn, s.cause),
        thread=s.thread,
        time=s.time,
        time_ms=s.time_ms,
        stack=stack,
        code=s.code,
        code_name=cname,
        address_owner=owner,
        malloc=malloc,
        glibc=glibc,
    )


def _decode_fault(dump: Dump, regs: dict[str, int]) -> tuple[int | None, str | None, CauseDoc | None]:
    """(address, instruction text, cause) of a fault the kernel gave no
    address for, from the instruction at the faulting pc and the registers.
    The cause (docs/json.md, "The crash"): "use-after-free" when the
    address or its base register holds libtag's free pattern, with the
    freed block the pointer was read from when the load that gave it is
    found and the word there still holds it (else that block is null:
    unknown, never a guess); "unknown" otherwise, with where the pointer was
    read from when that is found."""
    arch = dump.arch
    pc = regs.get(arch.pc)
    sym = dump.symbolizer
    code = ins.read_code(dump.mem.read, sym, pc, arch.max_insn) if pc else None
    mem = ins.decode_at(code, pc, regs, arch) if code else None
    if mem is None:
        return None, None, None
    base_value = regs.get(mem.base) if mem.base else None
    freed = _freed_pointer(mem.address) or _freed_pointer(base_value)
    cause = CauseDoc(kind="use-after-free" if freed else "unknown", register=mem.base,
                     value=hexaddr(base_value), loaded_from=None, load=None, load_in=None, block=None)
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
            block = dump.heap.block_at(holder)
            cause = dataclasses.replace(
                cause, loaded_from=hexaddr(holder), load=load, load_in=where,
                block=block_doc(block, dump, offset=holder - block.start) if block is not None else None)
    return mem.address, mem.text, cause


def _pointer_load(dump: Dump, pc: int, reg: str | None, regs: dict[str, int]
                  ) -> tuple[int, str, str] | None:
    """(address, load instruction, "function" | "caller") of the load that
    gave register reg its value at the fault: in the faulting function
    before pc, or - reg an argument that function never wrote - in its
    caller before the call."""
    if not reg:
        return None
    body = _function_code(dump, pc)
    if body is None:
        return None
    start, code = body
    arch = dump.arch
    found = ins.load_source(code, start, pc, reg, regs, arch)
    if found is not None:
        return (*found, "function")
    if reg not in arch.arg_regs or ins.writes(code, start, pc, reg, arch):
        return None
    caller = dump.unwinder.caller_regs(regs)
    ra = caller.get(arch.pc) if caller else None
    body = _function_code(dump, ra) if ra else None
    if body is None:
        return None
    start, code = body
    # the caller's code before its call (ra is the instruction after it)
    call = ins.start_of_last(code, start, arch)
    found = ins.load_source(code, start, call, reg, caller, arch) if call is not None else None
    return (*found, "caller") if found is not None else None


def _function_code(dump: Dump, pc: int) -> tuple[int, bytes] | None:
    """(start, code) of the function holding pc, from its start up to pc."""
    sym = dump.symbolizer
    (frame,) = sym.symbolize([(pc, abi.TAG_FRAME_SIGNAL)])
    if frame.offset is None or not 0 <= frame.offset <= ins.MAX_SCAN:
        return None
    if frame.offset == 0:
        return pc, b""  # the function's first instruction: nothing ran before it
    start = pc - frame.offset
    code = ins.read_code(dump.mem.read, sym, start, frame.offset)
    return (start, code) if code else None


def crash_summary(name, code, code_name, address, source, sender, insn, cause) -> str:
    """One line that says what the crash is, for people (text and report)."""
    if sender is not None:
        who = "the process itself (abort, raise)" if sender.self else f"pid {sender.pid}"
        return f"{name} sent by {who} (pid {sender.pid}, uid {sender.uid}, {code_name})"
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


def _cause_text(cause: CauseDoc) -> str:
    b = cause.block
    where = (f"{b.state} block {b.start} ({b.size} bytes), at offset {b.offset} of it"
             if b is not None else f"{cause.loaded_from}, in no block" if cause.loaded_from else None)
    if cause.kind == "use-after-free":
        if b is not None and b.state == "freed":
            return f"a use-after-free: a pointer read from freed block {b.start} ({b.size} bytes), " \
                   f"at offset {b.offset} of it"
        return (f"a pointer read from a freed block ({cause.register} = {cause.value}); "
                "which block is unknown" + (f" (it was loaded from {where})" if where else
                                             f": the load that gave {cause.register} was not found"))
    return ("no freed block explains it (cause unknown"
            + (f"; the pointer was read from {where}" if where else "") + ")")


__all__ = ["FAULT_CODES", "FATAL", "SI_CODES", "SI_KERNEL", "code_name", "crash_doc", "crash_frames",
           "crash_summary"]
