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
from typing import Iterable, Sequence
import numpy as np

from forensics.errors import ForensicsError
from forensics.reader.abi import TAG_FRAME_CALL, TAG_FRAME_SIGNAL
from forensics.reader.symbols import open_regular

# DWARF register numbers of x86_64 (System V psABI, figure 3.36)
RSP, RBP, RA = 7, 6, 16
DWARF_NAMES = ("rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp",
               "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip")  # fmt: skip
# What a caller gets back from a call: the callee-saved registers (rbx, rbp,
# r12-r15); the others are unknown in every frame but the first.
CALLEE_SAVED = (3, 6, 12, 13, 14, 15)

# A stack deeper than this is cut (gdb has no limit; a runaway recursion of
# a million frames would take minutes in Python and say nothing more).
MAX_FRAMES = 8192

# glibc's __restore_rt on x86_64: mov $__NR_rt_sigreturn, %rax; syscall
RESTORE_RT = bytes.fromhex("48c7c00f0000000f05")
# struct sigcontext in the ucontext: after uc_flags, uc_link and uc_stack
SIGCONTEXT_OFFSET = 40
# struct sigcontext (x86_64): r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip
_SIGCONTEXT_DWARF = (8, 9, 10, 11, 12, 13, 14, 15, 5, 4, 6, 3, 1, 0, 2, RSP, RA)

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

    def __init__(self, mem, modules: Iterable, *, vdso: int | None = None) -> None:
        """vdso: where the kernel's vDSO is mapped (AT_SYSINFO_EHDR), whose
        image - CFI and symbols - is read from the memory itself."""
        self.mem = mem
        self.modules = sorted((m for m in modules if not getattr(m, "deleted", False)),
                              key=lambda m: m.start)
        self._starts = [m.start for m in self.modules]
        self._images: dict[str, _Image | None] = {}
        self._rows: dict[int, object] = {}
        self._exec: list[tuple[int, int]] | None = None
        self._exec_starts: list[int] = []
        self._code_cache: dict[tuple[int, int], bytes | None] = {}
        self.vdso = _vdso_image(mem, vdso) if vdso else None

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
            self._images[module.path] = _open_image(module.path, module.load_bias)
        return self._images[module.path]

    def _image_at(self, pc: int) -> _Image | None:
        v = self.vdso
        if v is not None and v.bias <= pc < v.bias + v.size:
            return v
        m = self._module_at(pc)
        return self._image(m) if m is not None else None

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
        """pc is in glibc's __restore_rt (at its start, or at its syscall)."""
        return self.code(pc, len(RESTORE_RT)) == RESTORE_RT or \
            self.code(pc - 7, len(RESTORE_RT)) == RESTORE_RT

    def after_call(self, ra: int) -> bool:
        """ra follows a call instruction (e8 rel32, or ff /2 with its ModRM,
        SIB, displacement, up to two prefixes and a REX).  Unknown code bytes
        do not refute it."""
        before = self.code(ra - 16, 16)
        if before is None:
            return True
        return _is_call_before(before)

    def plausible_return(self, ra: int) -> bool:
        return ra > 0 and self.is_executable(ra) and self.after_call(ra)

    # ------------------------------------------------------------- unwind --

    def unwind(self, regs: dict[str, int], *, stack: tuple[int, int] | None = None,
               limit: int = MAX_FRAMES) -> list[Step]:
        """The physical frames from registers (names of user_regs_struct:
        rip, rsp, rbp, ...), innermost first.  stack: [lo, hi) of the stack
        the registers' rsp is on, to refuse a CFA outside it (None: no bound)."""
        r: dict[int, int | None] = {i: regs.get(n) for i, n in enumerate(DWARF_NAMES)}
        pc = r[RA]
        exact = True
        out: list[Step] = []
        hops = 0  # signal frames crossed, bounded like frames
        while pc is not None and len(out) + hops < limit:
            if self.is_sigtramp(pc):
                hops += 1
                sp = r.get(RSP)
                nr = self._sigcontext(sp) if sp is not None else None
                if nr is None or not nr.get(RA):
                    break
                r, pc, exact, stack = nr, nr[RA], True, None
                continue
            sp = r.get(RSP)
            kind = TAG_FRAME_SIGNAL if exact else TAG_FRAME_CALL
            nr = self._caller(r, pc, exact, first=not out, stack=stack)
            cfa = nr.get(RSP) if nr is not None else None
            out.append(Step(pc, kind, cfa, sp))
            if nr is None:
                break
            ra = nr.get(RA)
            if not ra or cfa is None or sp is None or cfa <= sp:
                break
            if stack is not None and not stack[0] <= cfa <= stack[1]:
                break
            if not self.is_executable(ra):
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
        r: dict[int, int | None] = {i: regs.get(n) for i, n in enumerate(DWARF_NAMES)}
        if r[RA] is None:
            return None
        nr = self._caller(r, r[RA], True, first=True, stack=None)
        if nr is None or not nr.get(RA):
            return None
        return {DWARF_NAMES[i]: v for i, v in nr.items()
                if v is not None and (i in CALLEE_SAVED or i in (RSP, RA))}

    def _caller(self, r: dict, pc: int, exact: bool, *, first: bool,
                stack: tuple[int, int] | None) -> dict | None:
        """The caller's registers, or None where the walk ends."""
        row = self.row(pc if exact else pc - 1)
        if row is not None:
            return _apply(row, r, self.word)
        sp, bp = r.get(RSP), r.get(RBP)
        if sp is None:
            return None
        if first and not self.is_executable(pc):
            # frame 0 outside any code (a call through a bad pointer): the
            # return address is the word the call pushed
            ra = self.word(sp)
            if ra is not None and self.plausible_return(ra):
                return {**{k: r.get(k) for k in CALLEE_SAVED}, RSP: sp + 8, RA: ra}
        # no CFI: a frame pointer, only where it is one
        if bp is None or bp < sp or (stack is not None and not bp + 16 <= stack[1]):
            return None
        ra, saved = self.word(bp + 8), self.word(bp)
        if ra is None or saved is None or not self.plausible_return(ra):
            return None
        out = {k: r.get(k) for k in CALLEE_SAVED}
        out.update({RSP: bp + 16, RBP: saved, RA: ra})
        return out

    def _sigcontext(self, sp: int) -> dict | None:
        """The registers the kernel saved for a signal handler whose frame's
        stack pointer (the handler's CFA) is sp."""
        try:
            raw = self.mem.read(sp + SIGCONTEXT_OFFSET, 8 * len(_SIGCONTEXT_DWARF))
        except (ForensicsError, ValueError, OSError):
            return None
        if len(raw) != 8 * len(_SIGCONTEXT_DWARF):
            return None
        return {reg: int.from_bytes(raw[8 * i:8 * i + 8], "little")
                for i, reg in enumerate(_SIGCONTEXT_DWARF)}


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
        best["_ra"] = fde.cie["return_address_register"] if fde.cie is not None else RA
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


def _apply(row, r: dict, word) -> dict | None:
    """The caller's registers from one CFI row (None: they cannot be known)."""
    rule = row["cfa"]
    if rule.expr is not None:
        cfa = _eval(rule.expr, r, word, [])
    else:
        base = r.get(rule.reg)
        cfa = None if base is None else (base + rule.offset) & 0xFFFFFFFFFFFFFFFF
    if cfa is None:
        return None
    out: dict[int, int | None] = {RSP: cfa}
    ra_reg = row.get("_ra", RA)
    for reg in (*CALLEE_SAVED, ra_reg):
        rr = row.get(reg)
        if rr is None:
            value = r.get(reg) if reg != ra_reg else word(cfa - 8)
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
        out[RA if reg == ra_reg else reg] = value
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


# -- call instructions ----------------------------------------------------------

_LEGACY_PREFIXES = frozenset((0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF2, 0xF3))


def _modrm_length(code: bytes, i: int) -> int | None:
    """Length of a ModRM byte at code[i] with its SIB and displacement."""
    if i >= len(code):
        return None
    modrm = code[i]
    mod, rm = modrm >> 6, modrm & 7
    n = 1
    if mod == 3:
        return n
    if rm == 4:  # SIB
        if i + 1 >= len(code):
            return None
        sib = code[i + 1]
        n += 1
        if mod == 0 and sib & 7 == 5:
            return n + 4
    elif mod == 0 and rm == 5:  # rip-relative
        return n + 4
    return n + (1 if mod == 1 else 4 if mod == 2 else 0)


def _is_call_before(before: bytes) -> bool:
    """The bytes before a return address end with a call: e8 rel32, or an
    indirect call ff /2 (any ModRM form, with up to two prefixes and a REX)."""
    end = len(before)
    if end >= 5 and before[end - 5] == 0xE8:
        return True
    for length in range(2, min(end, 12) + 1):
        start = end - length
        i = start
        for _ in range(2):
            if i < end and before[i] in _LEGACY_PREFIXES:
                i += 1
        if i < end and 0x40 <= before[i] <= 0x4F:
            i += 1
        if i + 1 >= end or before[i] != 0xFF or (before[i + 1] >> 3) & 7 != 2:
            continue
        n = _modrm_length(before, i + 1)
        if n is not None and i + 1 + n == end:
            return True
    return False


__all__ = ["MAX_FRAMES", "Step", "Unwinder"]
