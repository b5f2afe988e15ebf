"""The faulting instruction of a crash, decoded: which address it used, from
which registers, and where the register that held the bad pointer was loaded
from.

A general-protection fault (SIGSEGV with si_code SI_KERNEL) gives no address:
the kernel reports 0, for example for an access through a non-canonical
pointer such as libtag's free pattern 0xfdfdfdfdfdfdfdfd.  The address is
computed here the way the CPU did: the instruction's memory operand (base +
index * scale + displacement) over the registers at the fault.  Decoding is
capstone's.  The code bytes come from the core when it holds them, else from
the module's file on disk - only a file the symboliser accepted for the
module (its build-id is the one the process had) and only from a section
with contents (a separate debug file has none).

Where the bad pointer came from: scanning the function from its start to the
faulting instruction, the last instruction that wrote the operand's base
register is taken; when that is a load from memory whose own registers were
not written between it and the fault, its source address is known from the
registers at the fault.  A base register that is an argument the function
never wrote came from its caller: the caller's code up to the call is
scanned the same way, over the registers the unwinder gives it back
(rbx, rbp, r12-r15).  This follows the code in address order, not the paths
the program took: callers check that the word found there really holds the
value the register had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from forensics.arch import X86_64, Arch
from forensics.errors import ForensicsError
from forensics.reader.symbols import open_regular

MAX_INSN = 15  # bytes of the longest x86 instruction (aarch64's: 4, Arch.max_insn)
MAX_SCAN = 1 << 16  # bytes of a function scanned back from the fault, at most
# the System V ABI's integer argument registers: a function that never wrote
# one before the fault got its value from its caller (Arch.arg_regs)
ARG_REGS = X86_64.arg_regs


@dataclass(frozen=True)
class MemOperand:
    """A decoded instruction's memory operand and the address it names."""

    text: str  # the instruction, as capstone prints it ("mov rbx, qword ptr [rax]")
    address: int | None  # base + index * scale + disp over the registers; None: unknown
    base: str | None  # 64-bit base register name, None without one
    index: str | None
    scale: int
    disp: int
    size: int  # bytes of the instruction


def _md(arch: Arch = X86_64):
    return arch.capstone()


def _mem_operand(insn, regs: dict[str, int], arch: Arch = X86_64) -> MemOperand | None:
    if arch is not X86_64:
        return _mem_operand_arm64(insn, regs, arch)
    from capstone import x86  # deferred, start-up time: capstone (faults without an address)

    for op in insn.operands:
        if op.type != x86.X86_OP_MEM:
            continue
        m = op.mem
        if m.segment not in (0, x86.X86_REG_DS, x86.X86_REG_SS):
            # fs:/gs: relative (TLS): the segment base is not a register here
            return MemOperand(f"{insn.mnemonic} {insn.op_str}", None, None, None, 1, m.disp, insn.size)
        base = insn.reg_name(m.base) if m.base else None
        index = insn.reg_name(m.index) if m.index else None
        addr: int | None = m.disp
        if base == "rip":
            addr = insn.address + insn.size + m.disp
        elif base is not None:
            base = arch.full_reg(base)
            addr = None if base not in regs else addr + regs[base]
        if index is not None and addr is not None:
            index = arch.full_reg(index)
            addr = None if index not in regs else addr + regs[index] * m.scale
        return MemOperand(f"{insn.mnemonic} {insn.op_str}",
                          None if addr is None else addr & 0xFFFFFFFFFFFFFFFF,
                          base, index, m.scale, m.disp, insn.size)
    return None


def _arm64():
    import capstone  # deferred, start-up time: capstone (faults without an address)

    return getattr(capstone, "arm64", None) or capstone.aarch64


def _mem_operand_arm64(insn, regs: dict[str, int], arch: Arch) -> MemOperand | None:
    """aarch64's memory operand: [base, #disp] or [base, index, lsl #s]
    (a post-indexed access uses the base alone: disp is 0 there)."""
    a64 = _arm64()
    mem_type = getattr(a64, "ARM64_OP_MEM", None) or getattr(a64, "AARCH64_OP_MEM")
    for op in insn.operands:
        if op.type != mem_type:
            continue
        m = op.mem
        base = arch.full_reg(insn.reg_name(m.base)) if m.base else None
        index = arch.full_reg(insn.reg_name(m.index)) if m.index else None
        scale = 1 << op.shift.value if index is not None and op.shift.value else 1
        addr: int | None = m.disp
        if base is not None:
            addr = None if base not in regs else addr + regs[base]
        if index is not None and addr is not None:
            addr = None if index not in regs else addr + regs[index] * scale
        return MemOperand(f"{insn.mnemonic} {insn.op_str}",
                          None if addr is None else addr & 0xFFFFFFFFFFFFFFFF,
                          base, index, scale, m.disp, insn.size)
    return None


def decode_at(code: bytes, pc: int, regs: dict[str, int], arch: Arch = X86_64) -> MemOperand | None:
    """The memory operand of the instruction at pc (code starts at pc), or
    None when it has none or does not decode."""
    for insn in _md(arch).disasm(code[:arch.max_insn], pc, 1):
        return _mem_operand(insn, regs, arch)
    return None


def _last_writer(code: bytes, start: int, pc: int, reg: str, arch: Arch = X86_64):
    """The last instruction in [start, pc) that writes reg (None: none does)
    and the instructions after it, up to pc."""
    writer = None
    later: list = []
    for insn in _md(arch).disasm(code, start):
        if insn.address >= pc:
            break
        _, written = insn.regs_access()
        if reg in {arch.full_reg(insn.reg_name(r) or "") for r in written}:
            writer, later = insn, []
        else:
            later.append(insn)
    return writer, later


def start_of_last(code: bytes, start: int, arch: Arch = X86_64) -> int | None:
    """The address of the last instruction of code (which starts at start),
    when the code decodes to its end (a call before its return address)."""
    last = None
    for insn in _md(arch).disasm(code, start):
        last = insn
    return last.address if last is not None and last.address + last.size == start + len(code) else None


def writes(code: bytes, start: int, pc: int, reg: str, arch: Arch = X86_64) -> bool:
    """Does any instruction in [start, pc) write reg?  (False: reg holds the
    value the function was entered with - an argument, when it is one.)"""
    return _last_writer(code, start, pc, reg, arch)[0] is not None


# the loads of a 64-bit word into a register, by machine
_LOADS = {"x86_64": ("mov", "movabs"), "aarch64": ("ldr", "ldur")}


def load_source(code: bytes, start: int, pc: int, reg: str, regs: dict[str, int],
                arch: Arch = X86_64) -> tuple[int, str] | None:
    """Where register reg got its value before the instruction at pc:
    (the address it was loaded from, the loading instruction), or None.
    code holds [start, pc) of the function (see the module docstring)."""
    import capstone  # deferred, start-up time: capstone (faults without an address)

    writer, later = _last_writer(code, start, pc, reg, arch)
    if writer is None or writer.mnemonic not in _LOADS[arch.name] or len(writer.operands) != 2:
        return None
    dst, src = writer.operands
    if arch is X86_64:
        from capstone import x86  # deferred, start-up time: capstone (faults without an address)

        if dst.type != x86.X86_OP_REG or src.type != x86.X86_OP_MEM or src.size != 8:
            return None
    else:
        a64 = _arm64()
        reg_t = getattr(a64, "ARM64_OP_REG", None) or getattr(a64, "AARCH64_OP_REG")
        if dst.type != reg_t or not writer.reg_name(dst.reg).startswith("x"):
            return None  # a 64-bit load only
    mem = _mem_operand(writer, regs, arch)
    if mem is None or mem.address is None:
        return None
    used = {r for r in (mem.base, mem.index) if r and r != "rip"}
    if reg in used:
        return None  # "mov rax, [rax + 8]": the register's old value is gone
    for insn in later:
        _, written = insn.regs_access()
        if used & {arch.full_reg(insn.reg_name(r) or "") for r in written}:
            return None
        if insn.group(capstone.CS_GRP_CALL) or insn.group(capstone.CS_GRP_JUMP) \
                or insn.group(capstone.CS_GRP_RET):
            return None  # another path may have led to pc: only straight-line code is trusted
    return mem.address, mem.text


def module_code(path: str, vaddr: int, n: int) -> bytes | None:
    """n bytes at file address vaddr of an ELF file, from a section that has
    contents there (never a debug file's empty .text); fewer at a section's
    end; None when no such section holds vaddr."""
    from elftools.common.exceptions import ELFError  # deferred, start-up time: pyelftools
    from elftools.elf.elffile import ELFFile  # deferred, start-up time: pyelftools

    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            for sec in ELFFile(f).iter_sections():
                lo, size = sec["sh_addr"], sec["sh_size"]
                if sec["sh_type"] == "SHT_NOBITS" or not sec["sh_flags"] & 2 or not lo <= vaddr < lo + size:
                    continue  # 2: SHF_ALLOC
                f.seek(sec["sh_offset"] + vaddr - lo)
                return f.read(min(n, lo + size - vaddr))
        except (ELFError, OSError, ValueError):
            return None
    return None


def read_code(mem_read: Callable[[int, int], bytes], symbolizer, addr: int, n: int) -> bytes | None:
    """n bytes of code at addr (fewer at a section's end): from the memory
    when it holds them, else from the module's verified file."""
    try:
        return mem_read(addr, n)
    except (ForensicsError, ValueError, OSError):
        pass
    module = symbolizer.module_at(addr)
    source = symbolizer.source(module) if module is not None else None
    if source is None:
        return None
    return module_code(source.code, addr - module.load_bias, n)


__all__ = ["ARG_REGS", "MemOperand", "decode_at", "load_source", "module_code", "read_code", "start_of_last", "writes"]
