"""What every architecture module says (forensics.arch.x86_64,
forensics.arch.aarch64): the fields are facts, the methods the few
machine-specific steps of the unwinder and the leak scan."""

from __future__ import annotations

from typing import Callable

Code = Callable[[int, int], "bytes | None"]  # code(addr, n): n bytes of code, None when unknown
Word = Callable[[int], "int | None"]  # word(addr): the 8-byte word there, None when unreadable
Regs = dict  # DWARF register number -> value (None: unknown)

MASK64 = (1 << 64) - 1


class Arch:
    """One machine.  Subclasses fill the class attributes and the methods
    marked as theirs; one instance each (forensics.arch.X86_64, AARCH64)."""

    name: str  # "x86_64", "aarch64": what docs and JSON call it
    title: str  # what ELF calls it: "x86_64", "AArch64"
    e_machine: int
    # elf_gregset_t of NT_PRSTATUS, in order
    reg_names: tuple[str, ...]
    # libtag's thread record's registers (tag_abi.h's TAG_NREGS words), in
    # order: the ones it saved for the thread at a snapshot or a crash
    record_reg_names: tuple[str, ...]
    # which of those the reader uses, by role
    pc: str
    sp: str
    fp: str
    tp: str  # the thread pointer: x86_64's fs_base, aarch64's tpidr_el0 (NT_ARM_TLS)
    # registers that never hold a data pointer of the program (code, segment
    # and thread state): the leak scan does not take them as roots
    not_data: frozenset[str]
    # the integer argument registers of the calling convention
    arg_regs: tuple[str, ...]
    # DWARF register numbers (index = number) and the roles among them
    dwarf_names: tuple[str, ...]
    dw_sp: int
    dw_fp: int
    dw_pc: int  # where the walk keeps a frame's pc (x86_64: the RA column, rip)
    dw_ra: int  # the return address column of a CIE that names none
    callee_saved: tuple[int, ...]
    max_insn: int  # bytes of the longest instruction
    # the return-address slot of a call, relative to the caller's CFA
    # (x86_64: the word the call pushed, CFA - 8); None where a call leaves
    # it in a register (aarch64's x30) and no slot is known
    ra_slot: int | None

    # -------------------------------------------------------- registers --

    def regs_of(self, values) -> dict[str, int]:
        """An NT_PRSTATUS elf_gregset_t as {name: value}."""
        return dict(zip(self.reg_names, (int(v) for v in values), strict=True))

    def pointer_mask(self, highest: int) -> int:
        """The mask that strips what is not address from a code pointer
        (a return address), given the highest mapped address of the
        process; all ones on a machine that signs none."""
        return MASK64

    # ---------------------------------------------------------- unwinding --

    def is_sigtramp(self, code: Code, pc: int) -> bool:
        """pc is in the signal return trampoline."""
        raise NotImplementedError

    def sigcontext(self, read: Callable[[int, int], bytes], sp: int) -> Regs | None:
        """The registers the kernel saved for a signal handler whose frame's
        CFA (its stack pointer at entry) is sp, by DWARF number."""
        raise NotImplementedError

    def after_call(self, code: Code, ra: int) -> bool:
        """ra follows a call instruction.  Unknown code bytes do not refute it."""
        raise NotImplementedError

    def default_ra(self, r: Regs, cfa: int, word: Word) -> int | None:
        """The return address of a CFI row that has no rule for it."""
        raise NotImplementedError

    def bad_pc_caller(self, r: Regs, word: Word, plausible: Callable[[int], bool],
                      mask: int) -> Regs | None:
        """The caller of frame 0 when its pc is in no code (a call through
        a bad pointer); None where it cannot be told."""
        raise NotImplementedError

    def frame_record_caller(self, r: Regs, word: Word, plausible: Callable[[int], bool],
                            stack: tuple[int, int] | None, mask: int) -> Regs | None:
        """The caller through the frame pointer, where a frame has no CFI
        and the frame pointer is one; None else."""
        raise NotImplementedError

    # ----------------------------------------------------------- decoding --

    def capstone(self):
        """A capstone decoder for this machine, detail on."""
        raise NotImplementedError

    def full_reg(self, name: str) -> str:
        """The 64-bit register a capstone register name is part of."""
        return name

    def __repr__(self) -> str:
        return f"<Arch {self.name}>"
