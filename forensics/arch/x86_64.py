"""x86_64: the registers of its cores, its CFI numbers, glibc's signal
frame, the call instructions a return address follows, the frame-pointer
walk, and capstone's x86-64 mode."""

from __future__ import annotations

from typing import Callable

from .base import Arch, Code, Regs, Word

# struct user_regs_struct (arch/x86/include/asm/user_64.h), in order: elf_gregset_t.
REG_NAMES = (
    "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8",
    "rax", "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags",
    "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs",
)  # fmt: skip

# DWARF register numbers of x86_64 (System V psABI, figure 3.36)
RSP, RBP, RA = 7, 6, 16
DWARF_NAMES = ("rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp",
               "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip")  # fmt: skip
# What a caller gets back from a call: the callee-saved registers (rbx, rbp,
# r12-r15); the others are unknown in every frame but the first.
CALLEE_SAVED = (3, 6, 12, 13, 14, 15)

# glibc's __restore_rt on x86_64: mov $__NR_rt_sigreturn, %rax; syscall
RESTORE_RT = bytes.fromhex("48c7c00f0000000f05")
# struct sigcontext in the ucontext: after uc_flags, uc_link and uc_stack
SIGCONTEXT_OFFSET = 40
# struct sigcontext (x86_64): r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip
_SIGCONTEXT_DWARF = (8, 9, 10, 11, 12, 13, 14, 15, 5, 4, 6, 3, 1, 0, 2, RSP, RA)

# 64-bit register of each general-purpose register name capstone gives
_FULL: dict[str, str] = {}
for _q, _d, _w, _b in (("rax", "eax", "ax", "al"), ("rbx", "ebx", "bx", "bl"), ("rcx", "ecx", "cx", "cl"),
                       ("rdx", "edx", "dx", "dl"), ("rsi", "esi", "si", "sil"), ("rdi", "edi", "di", "dil"),
                       ("rbp", "ebp", "bp", "bpl"), ("rsp", "esp", "sp", "spl")):
    _FULL.update({_q: _q, _d: _q, _w: _q, _b: _q})
for _n in range(8, 16):
    _FULL.update({f"r{_n}": f"r{_n}", f"r{_n}d": f"r{_n}", f"r{_n}w": f"r{_n}", f"r{_n}b": f"r{_n}"})
_FULL.update({"ah": "rax", "bh": "rbx", "ch": "rcx", "dh": "rdx"})


class _X86_64(Arch):
    name = "x86_64"
    title = "x86_64"
    e_machine = 62
    reg_names = REG_NAMES
    record_reg_names = REG_NAMES  # user_regs_struct, as NT_PRSTATUS
    pc, sp, fp, tp = "rip", "rsp", "rbp", "fs_base"
    not_data = frozenset(("fs_base", "gs_base", "orig_rax", "rip", "cs", "ss", "ds", "es", "fs",
                          "gs", "eflags"))
    # the System V ABI's integer argument registers
    arg_regs = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
    dwarf_names = DWARF_NAMES
    dw_sp, dw_fp, dw_pc, dw_ra = RSP, RBP, RA, RA
    callee_saved = CALLEE_SAVED
    max_insn = 15
    ra_slot = -8

    def is_sigtramp(self, code: Code, pc: int) -> bool:
        """pc is in glibc's __restore_rt (at its start, or at its syscall)."""
        return code(pc, len(RESTORE_RT)) == RESTORE_RT or code(pc - 7, len(RESTORE_RT)) == RESTORE_RT

    def sigcontext(self, read, sp: int) -> Regs | None:
        raw = read(sp + SIGCONTEXT_OFFSET, 8 * len(_SIGCONTEXT_DWARF))
        if raw is None or len(raw) != 8 * len(_SIGCONTEXT_DWARF):
            return None
        return {reg: int.from_bytes(raw[8 * i:8 * i + 8], "little")
                for i, reg in enumerate(_SIGCONTEXT_DWARF)}

    def after_call(self, code: Code, ra: int) -> bool:
        """ra follows a call instruction (e8 rel32, or ff /2 with its ModRM,
        SIB, displacement, up to two prefixes and a REX)."""
        before = code(ra - 16, 16)
        if before is None:
            return True
        return _is_call_before(before)

    def default_ra(self, r: Regs, cfa: int, word: Word) -> int | None:
        return word(cfa - 8)  # the word the call pushed

    def bad_pc_caller(self, r: Regs, word: Word, plausible: Callable[[int], bool],
                      mask: int) -> Regs | None:
        # the return address is the word the call pushed
        sp = r.get(RSP)
        ra = word(sp) if sp is not None else None
        if ra is not None and plausible(ra):
            return {**{k: r.get(k) for k in CALLEE_SAVED}, RSP: sp + 8, RA: ra}
        return None

    def frame_record_caller(self, r: Regs, word: Word, plausible: Callable[[int], bool],
                            stack: tuple[int, int] | None, mask: int) -> Regs | None:
        sp, bp = r.get(RSP), r.get(RBP)
        if sp is None or bp is None or bp < sp or (stack is not None and not bp + 16 <= stack[1]):
            return None
        ra, saved = word(bp + 8), word(bp)
        if ra is None or saved is None or not plausible(ra):
            return None
        out = {k: r.get(k) for k in CALLEE_SAVED}
        out.update({RSP: bp + 16, RBP: saved, RA: ra})
        return out

    def capstone(self):
        import capstone

        md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        md.detail = True
        return md

    def full_reg(self, name: str) -> str:
        return _FULL.get(name, name)


X86_64 = _X86_64()

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
