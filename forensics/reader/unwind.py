"""Call stacks unwound from a thread's registers with the modules' own CFI.

A thread's stack is found the way gdb's ``bt`` finds it: start from its
registers (a core's NT_PRSTATUS note, or the ones libtag saved for a
snapshot), find the frame description entry (FDE) that covers the pc in the
module's ``.eh_frame`` (through the sorted table of ``.eh_frame_hdr``) or
``.debug_frame``, run its call frame instructions to the pc (pyelftools
decodes them) and compute the caller's registers from the row: the CFA, the
return address and the callee-saved registers.  Repeat from the caller.

- Frame 0 and a frame a signal interrupted are looked up at their exact pc;
  every other frame's pc is a return address, looked up at ``pc - 1`` (the
  call, which may be the last instruction of its function).
- A return address that is glibc's ``__restore_rt`` (``mov $15,%rax;
  syscall``, the bytes gdb checks) is a signal frame: the interrupted
  registers are in the ``ucontext`` the kernel pushed, whose ``sigcontext``
  lies 40 bytes above that frame's stack pointer.  No frame is reported for
  the trampoline itself (gdb prints it as ``<signal handler called>``); the
  interrupted frame is reported with its exact pc (``TAG_FRAME_SIGNAL``).
- A return address rule that is undefined (``_start``, ``clone3``) ends the
  stack where gdb ends it.
- No junk frames: a return address must lie in an executable segment of a
  loaded module, just after a call instruction, and each frame's CFA must be
  above the one before (except across a signal frame: a handler may run on
  an alternate stack).  Where a pc has no CFI, the walk goes on only through
  a frame pointer that passes those checks (and, for frame 0 in no module -
  a call through a bad pointer - through the return address at the stack
  pointer), else it ends.
- Memory that cannot be read ends the walk; nothing here raises for a
  garbage stack.

Code bytes (for the trampoline and call checks) are read from the memory
when the dump holds them, else from the module file: a kernel core leaves
out file-backed text.
"""

from __future__ import annotations

import bisect
import io
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Sequence
from forensics._np import np

from forensics.arch import X86_64, Arch
from forensics.arch import x86_64 as X
from forensics.arch.base import MASK64
from forensics.errors import ForensicsError
from forensics.reader.abi import TAG_FRAME_CALL, TAG_FRAME_SIGNAL
from forensics.reader.symbols import open_regular

# x86_64's DWARF numbers, signal frame and call check live in
# forensics.arch.x86_64 (aarch64's in forensics.arch.aarch64); these names
# stay for the x86_64 default
RSP, RBP, RA = X.RSP, X.RBP, X.RA
DWARF_NAMES = X.DWARF_NAMES
CALLEE_SAVED = X.CALLEE_SAVED

# A stack deeper than this is cut (gdb has no limit; a runaway recursion of
# a million frames would take minutes in Python and say nothing more).
MAX_FRAMES = 8192

PT_LOAD, PT_GNU_EH_FRAME, PF_X = 1, 0x6474E550, 1


@dataclass(frozen=True)
class Step:
    """One physical frame: its pc, how to look it up, and its CFA (the stack
    pointer of its caller; None when the walk could not compute it)."""

    pc: int
    kind: int  # TAG_FRAME_SIGNAL: an exact pc (frame 0, after a signal frame); TAG_FRAME_CALL: a return address
    cfa: int | None
    sp: int | None = None  # the frame's own stack pointer


@dataclass
class _Image:
    """One loaded ELF module: its file, load bias and segments, and its CFI
    parsed on demand."""

    path: str
    bias: int
    segments: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # vaddr, memsz, offset, filesz, flags
    eh_hdr: object | None = None  # (locs, fde vaddrs) numpy arrays, sorted
    eh_cfi: object | None = None
    eh_addr: int = 0
    debug_index: tuple[list[int], list[object]] | None = None  # sorted starts, FDEs
    debug_cfi: object | None = None
    file: object | None = None
    data: bytes | None = None  # the whole image, for one read from memory (the vDSO)
    decoded: dict[int, object] = field(default_factory=dict)  # FDE offset -> decoded table
    loaded: bool = False
    size: int = 0

    def exec_ranges(self) -> list[tuple[int, int]]:
        return [(self.bias + v, self.bias + v + m) for v, m, _, _, fl in self.segments if fl & PF_X]

    def file_bytes(self, vaddr: int, n: int) -> bytes | None:
        for v, m, off, fsz, _ in self.segments:
            if v <= vaddr and vaddr + n <= v + fsz:
                if self.data is not None:
                    return self.data[off + vaddr - v:off + vaddr - v + n]
                try:
                    return os.pread(self.file.fileno(), n, off + vaddr - v)
                except (OSError, AttributeError, ValueError):
                    return None
        return None


class Unwinder:
    """Unwinds stacks in one memory given its modules (``symbols.Module``:
    path, start, end, load_bias, deleted)."""

    def __init__(self, mem, modules: Iterable, *, vdso: int | None = None, arch: Arch = X86_64,
                 ptr_mask: int = MASK64) -> None:
        """vdso: where the kernel's vDSO is mapped (AT_SYSINFO_EHDR), whose
        image - CFI and symbols - is read from the memory itself.  arch:
        the machine (forensics.arch); ptr_mask: what of a return address is
        address (Arch.pointer_mask: aarch64's strips a PAC signature)."""
        self.mem = mem
        self.arch = arch
        self.ptr_mask = ptr_mask
        self.modules = sorted((m for m in modules if not getattr(m, "deleted", False)),
                              key=lambda m: m.start)
        self._starts = [m.start for m in self.modules]
        self._images: dict[str, _Image | None] = {}
        self._rows: dict[int, object] = {}
        self._exec: list[tuple[int, int]] | None = None
        self._exec_starts: list[int] = []
        self._code_cache: dict[tuple[int, int], bytes | None] = {}
        self._vdso_base = vdso

    @cached_property
    def vdso(self) -> _Image | None:
        """The vDSO's image, read when a pc is first looked for (its ELF
        reader is pyelftools', whose import a question that unwinds
        nothing need not pay)."""
        return _vdso_image(self.mem, self._vdso_base) if self._vdso_base else None

    def close(self) -> None:
        for img in self._images.values():
            if img is not None and img.file is not None:
                img.file.close()
                img.file = None

    # ------------------------------------------------------------ modules --

    def _module_at(self, pc: int):
        i = bisect.bisect_right(self._starts, pc) - 1
        if i >= 0 and self.modules[i].start <= pc < self.modules[i].end:
            return self.modules[i]
        return None

    def _image(self, module) -> _Image | None:
        if module.path not in self._images:
            self._images[module.path] = _open_image(module.file or module.path, module.load_bias)
        return self._images[module.path]

    def _image_at(self, pc: int) -> _Image | None:
        m = self._module_at(pc)
        if m is not None:
            return self._image(m)
        v = self.vdso  # no module's: read the vDSO's image only now
        if v is not None and v.bias <= pc < v.bias + v.size:
            return v
        return None

    def vdso_symbol(self, pc: int) -> tuple[str, int] | None:
        """(name, start) of the vDSO function that holds pc, or None."""
        v = self.vdso
        if v is None or not v.bias <= pc < v.bias + v.size:
            return None
        syms = getattr(v, "_symbols", None)
        if syms is None:
            syms = v._symbols = _function_symbols(v._elf)  # type: ignore[attr-defined]
        rel = pc - v.bias
        best = None
        for start, size, name in syms:
            if start <= rel < start + max(size, 1) and (best is None or start > best[1]):
                best = (name, start)
        return (best[0], best[1] + v.bias) if best else None

    def is_executable(self, pc: int) -> bool:
        """pc lies in an executable segment of a loaded module."""
        img = self._image_at(pc)
        if img is None:
            return False
        return any(lo <= pc < hi for lo, hi in img.exec_ranges())

    def code(self, addr: int, n: int) -> bytes | None:
        """n bytes of code at addr: from the memory, else the module file."""
        key = (addr, n)
        if key not in self._code_cache:
            data = None
            try:
                data = self.mem.read(addr, n)
            except (ForensicsError, ValueError, OSError):
                img = self._image_at(addr)
                if img is not None and img.file is not None:
                    data = img.file_bytes(addr - img.bias, n)
            self._code_cache[key] = data if data is not None and len(data) == n else None
        return self._code_cache[key]

    def word(self, addr: int) -> int | None:
        try:
            data = self.mem.read(addr, 8)
        except (ForensicsError, ValueError, OSError):
            return None
        return int.from_bytes(data, "little") if len(data) == 8 else None

    # --------------------------------------------------------------- CFI --

    def row(self, pc: int):
        """The CFI row in effect at pc (a pyelftools table row: 'cfa' and
        register rules), or None."""
        if pc in self._rows:
            return self._rows[pc]
        row = None
        img = self._image_at(pc)
        if img is not None:
            try:
                row = _find_row(img, pc - img.bias)
            except Exception:  # pyelftools on a damaged file: no CFI there
                row = None
        self._rows[pc] = row
        return row

    # ------------------------------------------------------------- checks --

    def is_sigtramp(self, pc: int) -> bool:
        """pc is in the signal return trampoline (x86_64: glibc's
        __restore_rt, at its start or at its syscall)."""
        return self.arch.is_sigtramp(self.code, pc)

    def after_call(self, ra: int) -> bool:
        """ra follows a call instruction (Arch.after_call).  Unknown code
        bytes do not refute it."""
        return self.arch.after_call(self.code, ra)

    def plausible_return(self, ra: int) -> bool:
        return ra > 0 and self.is_executable(ra) and self.after_call(ra)

    # ------------------------------------------------------------- unwind --

    def unwind(self, regs: dict[str, int], *, stack: tuple[int, int] | None = None,
               limit: int = MAX_FRAMES) -> list[Step]:
        """The physical frames from registers (the names of the machine's
        NT_PRSTATUS: x86_64's rip, rsp, rbp, ...; aarch64's pc, sp, x29,
        ...), innermost first.  stack: [lo, hi) of the stack the registers'
        stack pointer is on, to refuse a CFA outside it (None: no bound)."""
        A = self.arch
        SP, PC = A.dw_sp, A.dw_pc
        r: dict[int, int | None] = {i: regs.get(n) for i, n in enumerate(A.dwarf_names)}
        pc = r[PC]
        exact = True
        out: list[Step] = []
        hops = 0  # signal frames crossed, bounded like frames
        while pc is not None and len(out) + hops < limit:
            if self.is_sigtramp(pc):
                hops += 1
                sp = r.get(SP)
                nr = self._sigcontext(sp) if sp is not None else None
                if nr is None or not nr.get(PC):
                    break
                r, pc, exact, stack = nr, nr[PC], True, None
                continue
            sp = r.get(SP)
            kind = TAG_FRAME_SIGNAL if exact else TAG_FRAME_CALL
            nr = self._caller(r, pc, exact, first=not out, stack=stack)
            cfa = nr.get(SP) if nr is not None else None
            out.append(Step(pc, kind, cfa, sp))
            if nr is None:
                break
            ra = nr.get(PC)
            if not ra or cfa is None or sp is None or cfa < sp:
                break
            # a CFA equal to the stack pointer: aarch64's leaf at frame 0,
            # whose return address is still in x30 (x86_64's call pushed one)
            if cfa == sp and (A.ra_slot is not None or len(out) > 1):
                break
            if stack is not None and not stack[0] <= cfa <= stack[1]:
                break
            if not self.is_executable(ra):
                # qemu-user's signal trampoline is a page of its own, in no module
                if A is X86_64 or not self.is_sigtramp(ra):
                    break
            if not self.is_sigtramp(ra) and not self.after_call(ra):
                break
            r, pc, exact = nr, ra, False
        return out

    def caller_regs(self, regs: dict[str, int]) -> dict[str, int] | None:
        """The registers the caller of frame 0 (regs: at an exact pc, a
        fault's) is known to have at its call: its pc (the return address),
        stack pointer and callee-saved registers, by name; None where the
        walk cannot tell."""
        A = self.arch
        names = A.dwarf_names
        r: dict[int, int | None] = {i: regs.get(n) for i, n in enumerate(names)}
        if r[A.dw_pc] is None:
            return None
        nr = self._caller(r, r[A.dw_pc], True, first=True, stack=None)
        if nr is None or not nr.get(A.dw_pc):
            return None
        return {names[i]: v for i, v in nr.items()
                if v is not None and (i in A.callee_saved or i in (A.dw_sp, A.dw_pc))}

    def _caller(self, r: dict, pc: int, exact: bool, *, first: bool,
                stack: tuple[int, int] | None) -> dict | None:
        """The caller's registers, or None where the walk ends."""
        A = self.arch
        row = self.row(pc if exact else pc - 1)
        if row is not None:
            return _apply(row, r, self.word, A, self.ptr_mask)
        if r.get(A.dw_sp) is None:
            return None
        if first and not self.is_executable(pc):
            # frame 0 outside any code (a call through a bad pointer): the
            # return address is where the call left it (x86_64: the word it
            # pushed; aarch64: x30)
            nr = A.bad_pc_caller(r, self.word, self.plausible_return, self.ptr_mask)
            if nr is not None:
                return nr
        # no CFI: a frame pointer, only where it is one
        return A.frame_record_caller(r, self.word, self.plausible_return, stack, self.ptr_mask)

    def _sigcontext(self, sp: int) -> dict | None:
        """The registers the kernel saved for a signal handler whose frame's
        stack pointer (the handler's CFA) is sp."""
        def read(addr: int, n: int) -> bytes | None:
            try:
                return self.mem.read(addr, n)
            except (ForensicsError, ValueError, OSError):
                return None

        return self.arch.sigcontext(read, sp)


# -- CFI ----------------------------------------------------------------------


def _open_image(path: str, bias: int) -> _Image | None:
    """A module file's segments (its CFI is read on first use), or None when
    it cannot be read as a 64-bit ELF file."""
    from elftools.common.exceptions import ELFError  # deferred, start-up time: pyelftools
    from elftools.elf.elffile import ELFFile  # deferred, start-up time: pyelftools

    f = open_regular(path)
    if f is None:
        return None
    try:
        elf = ELFFile(f)
        img = _Image(path, bias, file=f)
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD":
                img.segments.append((seg["p_vaddr"], seg["p_memsz"], seg["p_offset"],
                                     seg["p_filesz"], seg["p_flags"]))
        img._elf = elf  # type: ignore[attr-defined]
        return img
    except (ELFError, OSError, ValueError, AttributeError):
        f.close()
        return None


def _vdso_image(mem, base: int) -> _Image | None:
    """The vDSO's ELF image as the memory holds it (a core keeps it)."""
    from elftools.common.exceptions import ELFError  # deferred, start-up time: pyelftools
    from elftools.elf.elffile import ELFFile  # deferred, start-up time: pyelftools

    try:
        head = mem.read(base, 64)
        if head[:4] != b"\x7fELF":
            return None
        shoff = int.from_bytes(head[0x28:0x30], "little")
        shentsize = int.from_bytes(head[0x3A:0x3C], "little")
        shnum = int.from_bytes(head[0x3C:0x3E], "little")
        size = shoff + shentsize * shnum
        if not 64 <= size <= 1 << 20:
            return None
        data = mem.read(base, size)
        elf = ELFFile(io.BytesIO(data))
        img = _Image("[vdso]", 0, data=data, size=size)
        first = None
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD":
                img.segments.append((seg["p_vaddr"], seg["p_memsz"], seg["p_offset"],
                                     seg["p_filesz"], seg["p_flags"]))
                first = seg["p_vaddr"] - seg["p_offset"] if first is None else first
        img.bias = base - (first or 0)
        img._elf = elf  # type: ignore[attr-defined]
        return img
    except (ForensicsError, ValueError, OSError, ELFError):
        return None


def _function_symbols(elf) -> list[tuple[int, int, str]]:
    from elftools.elf.sections import SymbolTableSection  # deferred, start-up time: pyelftools

    out = []
    for sec in elf.iter_sections():
        if isinstance(sec, SymbolTableSection):
            for sym in sec.iter_symbols():
                if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"] and sym.name:
                    out.append((sym["st_value"], sym["st_size"], sym.name))
    return out


def _load_cfi(img: _Image) -> None:
    """Find .eh_frame(_hdr) and .debug_frame once."""
    from elftools.dwarf.callframe import CallFrameInfo  # deferred, start-up time: pyelftools
    from elftools.dwarf.structs import DWARFStructs  # deferred, start-up time: pyelftools

    img.loaded = True
    elf = img._elf  # type: ignore[attr-defined]
    structs = DWARFStructs(little_endian=True, dwarf_format=32, address_size=8)
    eh = elf.get_section_by_name(".eh_frame")
    if eh is not None and eh["sh_type"] != "SHT_NOBITS" and eh["sh_size"]:
        data = eh.data()
        img.eh_addr = eh["sh_addr"]
        img.eh_cfi = CallFrameInfo(stream=io.BytesIO(data), size=len(data), address=eh["sh_addr"],
                                   base_structs=structs, for_eh_frame=True)
        hdr = elf.get_section_by_name(".eh_frame_hdr")
        table = _eh_frame_hdr(hdr.data(), hdr["sh_addr"]) if hdr is not None else None
        if table is None:
            # no usable index: every FDE of .eh_frame, sorted
            fdes = [e for e in img.eh_cfi.get_entries() if _is_fde(e)]
            fdes.sort(key=lambda e: e.header["initial_location"])
            locs = np.array([e.header["initial_location"] for e in fdes], dtype=np.int64)
            table = (locs, np.array([eh["sh_addr"] + e.offset for e in fdes], dtype=np.int64))
        img.eh_hdr = table
    dbg = elf.get_section_by_name(".debug_frame")
    if dbg is not None and dbg["sh_type"] != "SHT_NOBITS" and dbg["sh_size"]:
        data = dbg.data()
        img.debug_cfi = CallFrameInfo(stream=io.BytesIO(data), size=len(data), address=dbg["sh_addr"],
                                      base_structs=structs, for_eh_frame=False)


def _eh_frame_hdr(data: bytes, vaddr: int):
    """(initial locations, FDE addresses) of .eh_frame_hdr's binary search
    table, as file vaddrs; None unless it is version 1 with the datarel
    sdata4 table every linker writes."""

    if len(data) < 12 or data[0] != 1 or data[3] != 0x3B or data[2] != 0x03:
        return None
    count = int.from_bytes(data[8:12], "little")
    if 12 + 8 * count > len(data):
        return None
    table = np.frombuffer(data, "<i4", 2 * count, 12).reshape(-1, 2).astype(np.int64) + vaddr
    return table[:, 0].copy(), table[:, 1].copy()


def _is_fde(entry) -> bool:
    from elftools.dwarf.callframe import FDE  # deferred, start-up time: pyelftools

    return isinstance(entry, FDE)


def _parse_at(cfi, offset: int):
    """The CFI entry at offset (pyelftools parses one entry and its CIE)."""
    parse = getattr(cfi, "_parse_entry_at", None)
    if parse is not None:
        return parse(offset)
    return next((e for e in cfi.get_entries() if e.offset == offset), None)


def _decoded_row(img: _Image, key: int, fde, rel: int):
    if fde is None or not _is_fde(fde):
        return None
    lo = fde.header["initial_location"]
    if not lo <= rel < lo + fde.header["address_range"]:
        return None
    if key not in img.decoded:
        img.decoded[key] = fde.get_decoded().table
    best = None
    for row in img.decoded[key]:
        if row["pc"] > rel:
            break
        best = row
    if best is not None:
        best = dict(best)
        best["_ra"] = fde.cie["return_address_register"] if fde.cie is not None else None
    return best


def _find_row(img: _Image, rel: int):
    """The row for a module-relative address: .eh_frame first, then
    .debug_frame (where gdb looks too)."""

    if not img.loaded:
        _load_cfi(img)
    if img.eh_hdr is not None:
        locs, fdes = img.eh_hdr
        i = int(np.searchsorted(locs, rel, side="right")) - 1
        if i >= 0:
            off = int(fdes[i]) - img.eh_addr
            row = _decoded_row(img, off, _parse_at(img.eh_cfi, off), rel)
            if row is not None:
                return row
    if img.debug_cfi is not None:
        if img.debug_index is None:
            fdes = sorted((e for e in img.debug_cfi.get_entries() if _is_fde(e)),
                          key=lambda e: e.header["initial_location"])
            img.debug_index = ([e.header["initial_location"] for e in fdes], fdes)
        starts, fdes = img.debug_index
        i = bisect.bisect_right(starts, rel) - 1
        if i >= 0:
            return _decoded_row(img, -1 - fdes[i].offset, fdes[i], rel)
    return None


def _apply(row, r: dict, word, arch: Arch = X86_64, mask: int = MASK64) -> dict | None:
    """The caller's registers from one CFI row (None: they cannot be known).
    The return address column's value is the caller's pc (arch.dw_pc), its
    signature stripped with mask."""
    rule = row["cfa"]
    if rule.expr is not None:
        cfa = _eval(rule.expr, r, word, [])
    else:
        base = r.get(rule.reg)
        cfa = None if base is None else (base + rule.offset) & 0xFFFFFFFFFFFFFFFF
    if cfa is None:
        return None
    PC = arch.dw_pc
    out: dict[int, int | None] = {arch.dw_sp: cfa}
    ra_reg = row.get("_ra")
    if ra_reg is None:
        ra_reg = arch.dw_ra
    for reg in (*arch.callee_saved, ra_reg):
        rr = row.get(reg)
        if rr is None:
            value = r.get(reg) if reg != ra_reg else arch.default_ra(r, cfa, word)
        elif rr.type == "UNDEFINED":
            value = None
        elif rr.type == "SAME_VALUE":
            value = r.get(reg)
        elif rr.type == "OFFSET":
            value = word(cfa + rr.arg)
        elif rr.type == "VAL_OFFSET":
            value = cfa + rr.arg
        elif rr.type == "REGISTER":
            value = r.get(rr.arg)
        elif rr.type == "EXPRESSION":
            at = _eval(rr.arg, r, word, [cfa])
            value = word(at) if at is not None else None
        elif rr.type == "VAL_EXPRESSION":
            value = _eval(rr.arg, r, word, [cfa])
        else:
            value = None
        if reg == ra_reg:
            if value is not None:
                value &= mask
            out[PC] = value
            if ra_reg != PC:
                out[ra_reg] = value  # aarch64: x30 holds the return address after the return
        else:
            out[reg] = value
    return out


_BINARY = {
    "DW_OP_plus": lambda a, b: a + b, "DW_OP_minus": lambda a, b: a - b,
    "DW_OP_mul": lambda a, b: a * b, "DW_OP_and": lambda a, b: a & b,
    "DW_OP_or": lambda a, b: a | b, "DW_OP_xor": lambda a, b: a ^ b,
    "DW_OP_shl": lambda a, b: a << (b & 63), "DW_OP_shr": lambda a, b: a >> (b & 63),
    "DW_OP_shra": lambda a, b: _signed(a) >> (b & 63),
    "DW_OP_ge": lambda a, b: int(_signed(a) >= _signed(b)), "DW_OP_gt": lambda a, b: int(_signed(a) > _signed(b)),
    "DW_OP_le": lambda a, b: int(_signed(a) <= _signed(b)), "DW_OP_lt": lambda a, b: int(_signed(a) < _signed(b)),
    "DW_OP_eq": lambda a, b: int(a == b), "DW_OP_ne": lambda a, b: int(a != b),
}  # fmt: skip


def _signed(v: int) -> int:
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >> 63 else v


def _eval(expr: Sequence[int], r: dict, word, stack: list[int]) -> int | None:
    """A DWARF expression of a CFI rule (the ones compilers emit for PLT
    entries and realigned stacks), or None for one it cannot evaluate."""
    from elftools.dwarf.dwarf_expr import DWARFExprParser  # deferred, start-up time: pyelftools
    from elftools.dwarf.structs import DWARFStructs  # deferred, start-up time: pyelftools

    try:
        ops = DWARFExprParser(DWARFStructs(little_endian=True, dwarf_format=32,
                                           address_size=8)).parse_expr(list(expr))
    except Exception:
        return None
    st = list(stack)
    try:
        for op in ops:
            name, args = op.op_name, op.args
            if name.startswith("DW_OP_lit"):
                st.append(int(name[9:]))
            elif name.startswith("DW_OP_breg") and name != "DW_OP_bregx":
                base = r.get(int(name[10:]))
                if base is None:
                    return None
                st.append(base + args[0])
            elif name == "DW_OP_bregx":
                base = r.get(args[0])
                if base is None:
                    return None
                st.append(base + args[1])
            elif name.startswith("DW_OP_const"):
                st.append(args[0])
            elif name == "DW_OP_plus_uconst":
                st.append(st.pop() + args[0])
            elif name == "DW_OP_deref":
                v = word(st.pop() & 0xFFFFFFFFFFFFFFFF)
                if v is None:
                    return None
                st.append(v)
            elif name in _BINARY:
                b, a = st.pop(), st.pop()
                st.append(_BINARY[name](a, b))
            elif name == "DW_OP_dup":
                st.append(st[-1])
            elif name == "DW_OP_drop":
                st.pop()
            elif name == "DW_OP_swap":
                st[-1], st[-2] = st[-2], st[-1]
            elif name == "DW_OP_over":
                st.append(st[-2])
            elif name == "DW_OP_neg":
                st.append(-st.pop())
            elif name == "DW_OP_not":
                st.append(~st.pop())
            elif name == "DW_OP_nop":
                continue
            else:
                return None
    except IndexError:
        return None
    return st[-1] & 0xFFFFFFFFFFFFFFFF if st else None


__all__ = ["MAX_FRAMES", "Step", "Unwinder"]
