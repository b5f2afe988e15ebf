"""AArch64 (arm64) Linux: the registers of its cores (``user_pt_regs``:
x0-x30, sp, pc, pstate; the thread pointer tpidr_el0 from NT_ARM_TLS), the
CFI numbers of the AAPCS64 DWARF (x0-x30 are 0-30, sp 31, pc 32), the
frame record (x29 points at the caller's x29 and the return address), the
signal frame the kernel - and qemu-user, which copies its layout - pushes,
the branch-and-link instructions a return address follows, pointer
authentication, and capstone's ARM64 mode.

Pointer authentication (ARMv8.3 PAC, ``-mbranch-protection=standard``):
a return address saved on the stack carries a signature in the bits above
the virtual address space.  It is stripped before it is looked up with the
mask of ``pointer_mask``: the bits up to the highest mapped address of the
process and none above.  Every code address the process had lies below
that address, so the mask never cuts a real one; the bits above it are the
signature's or zero, whatever the kernel's VA size (39, 42, 47, 48 or 52
bits) and whether top-byte-ignore is on - which a core does not say.
"""

from __future__ import annotations

from typing import Callable

from .base import MASK64, Arch, Code, Regs, Word

# struct user_pt_regs (arch/arm64/include/uapi/asm/ptrace.h): elf_gregset_t
REG_NAMES = (*(f"x{i}" for i in range(31)), "sp", "pc", "pstate")
# libtag's thread record keeps 27 words (libtag/src/base/arch_aarch64.h):
# x0-x7, x19-x30, sp, pc, pstate, x8-x11; x12-x18 hold nothing across a call
RECORD_REG_NAMES = (*(f"x{i}" for i in range(8)), *(f"x{i}" for i in range(19, 31)), "sp", "pc",
                    "pstate", *(f"x{i}" for i in range(8, 12)))
TP = "tpidr_el0"  # from the NT_ARM_TLS note (the kernel's; qemu-user writes none)

SP, FP, LR, PC = 31, 29, 30, 32
DWARF_NAMES = (*(f"x{i}" for i in range(31)), "sp", "pc")
# AAPCS64: x19-x28 and the frame pointer x29 are preserved across a call
CALLEE_SAVED = (19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29)

# the signal return trampoline (the vDSO's __kernel_rt_sigreturn, and
# qemu-user's own page): mov x8, #__NR_rt_sigreturn (139); svc #0
SIGRETURN = bytes.fromhex("681180d2010000d4")
# struct rt_sigframe: siginfo (128 bytes), then struct ucontext: uc_flags,
# uc_link, uc_stack (40 bytes), the 1024-bit sigset (128), and the
# 16-aligned struct sigcontext: fault_address, regs[31], sp, pc, pstate
SIGCONTEXT_REGS = 128 + 176 + 8

_WREGS = {f"w{i}": f"x{i}" for i in range(31)}


def _is_call(w: int) -> bool:
    """The 32-bit instruction w is a branch with link: BL imm26, BLR Xn, or
    the authenticating BLRAA/BLRAB/BLRAAZ/BLRABZ."""
    return ((w >> 26) == 0x25 or (w & 0xFFFFFC1F) == 0xD63F0000
            or (w & 0xFFFFF81F) == 0xD63F081F or (w & 0xFFFFF800) == 0xD73F0800)


class _AArch64(Arch):
    name = "aarch64"
    title = "AArch64"
    e_machine = 183
    reg_names = REG_NAMES
    record_reg_names = RECORD_REG_NAMES
    pc, sp, fp, tp = "pc", "sp", "x29", TP
    not_data = frozenset(("pc", "pstate", TP))
    arg_regs = tuple(f"x{i}" for i in range(8))
    dwarf_names = DWARF_NAMES
    dw_sp, dw_fp, dw_pc, dw_ra = SP, FP, PC, LR
    callee_saved = CALLEE_SAVED
    max_insn = 4
    ra_slot = None  # bl leaves the return address in x30; where a callee saves it varies

    def pointer_mask(self, highest: int) -> int:
        bits = max(int(highest).bit_length(), 32)
        return MASK64 if bits >= 64 else (1 << bits) - 1

    def is_sigtramp(self, code: Code, pc: int) -> bool:
        return code(pc, 8) == SIGRETURN or code(pc - 4, 8) == SIGRETURN

    def sigcontext(self, read, sp: int) -> Regs | None:
        raw = read(sp + SIGCONTEXT_REGS, 8 * 33)  # x0-x30, sp, pc
        if raw is None or len(raw) != 8 * 33:
            return None
        out = {i: int.from_bytes(raw[8 * i:8 * i + 8], "little") for i in range(33)}
        return out

    def after_call(self, code: Code, ra: int) -> bool:
        before = code(ra - 4, 4)
        if before is None:
            return True
        return _is_call(int.from_bytes(before, "little"))

    def default_ra(self, r: Regs, cfa: int, word: Word) -> int | None:
        return r.get(LR)  # a leaf that kept the return address in x30

    def bad_pc_caller(self, r: Regs, word: Word, plausible: Callable[[int], bool],
                      mask: int) -> Regs | None:
        # blr to a bad pointer: the return address is still in x30
        sp, lr = r.get(SP), r.get(LR)
        if sp is None or lr is None:
            return None
        ra = lr & mask
        if not plausible(ra):
            return None
        return {**{k: r.get(k) for k in CALLEE_SAVED}, SP: sp, PC: ra, LR: ra}

    def frame_record_caller(self, r: Regs, word: Word, plausible: Callable[[int], bool],
                            stack: tuple[int, int] | None, mask: int) -> Regs | None:
        # the frame record: x29 points at {the caller's x29, the return address}
        sp, fp = r.get(SP), r.get(FP)
        if sp is None or fp is None or fp < sp or (stack is not None and not fp + 16 <= stack[1]):
            return None
        ra, saved = word(fp + 8), word(fp)
        if ra is None or saved is None:
            return None
        ra &= mask
        if not plausible(ra):
            return None
        out = {k: r.get(k) for k in CALLEE_SAVED}
        out.update({SP: fp + 16, FP: saved, PC: ra, LR: ra})
        return out

    def capstone(self):
        import capstone

        arch = getattr(capstone, "CS_ARCH_ARM64", None)
        if arch is None:  # capstone 6 calls it AArch64
            arch = capstone.CS_ARCH_AARCH64
        md = capstone.Cs(arch, capstone.CS_MODE_ARM)
        md.detail = True
        return md

    def full_reg(self, name: str) -> str:
        if name in ("fp",):
            return "x29"
        if name in ("lr",):
            return "x30"
        if name == "wsp":
            return "sp"
        return _WREGS.get(name, name)


AARCH64 = _AArch64()
