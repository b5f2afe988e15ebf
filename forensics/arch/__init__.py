"""The machine-specific facts of the reader, one module per architecture -
as mimalloc keeps ``prim/`` per operating system: the registers a core's
NT_PRSTATUS note holds and which of them are the pc, the stack pointer,
the frame pointer and the thread pointer, the DWARF register numbers of
the CFI, the frame-record and signal-frame layouts the unwinder walks,
what a return address must follow, how a return address signed by
pointer authentication is stripped, and capstone's mode for the faulting
instruction.

    from forensics.arch import for_machine, for_regs
    arch = for_machine(core.ehdr.e_machine)     # x86_64 or aarch64
    pc = regs[arch.pc]

A core's ELF header (e_machine) picks its Arch; a registers dict says
which machine it is from by its names (``for_regs``), so the code that
gets registers without a core (libtag's saved ones, a live process's)
needs no other hint.  Everything above the core layer asks these objects,
never spells a register name itself.
"""

from __future__ import annotations

from .aarch64 import AARCH64
from .base import Arch
from .x86_64 import X86_64

ARCHES: dict[int, Arch] = {X86_64.e_machine: X86_64, AARCH64.e_machine: AARCH64}
HOST = X86_64  # the machine live processes (ptrace, /proc) are read on


def for_machine(e_machine: int) -> Arch | None:
    """The Arch of an ELF e_machine, None for one the reader does not read."""
    return ARCHES.get(e_machine)


def for_regs(regs: dict[str, int] | None) -> Arch:
    """The Arch whose register names regs uses (x86_64 for an empty one)."""
    if regs and AARCH64.pc in regs and X86_64.pc not in regs:
        return AARCH64
    return X86_64


def supported() -> str:
    """The machines read, for a message: "x86_64 and AArch64"."""
    return " and ".join(a.title for a in ARCHES.values())


__all__ = ["AARCH64", "ARCHES", "HOST", "X86_64", "Arch", "for_machine", "for_regs", "supported"]
