"""The PT_NOTE notes of an x86_64 or AArch64 Linux core, mirrored from the kernel's structs.

Layouts are those the kernel writes (fs/binfmt_elf.c, include/linux/elfcore.h,
arch/x86/include/asm/user_64.h, arch/arm64/include/uapi/asm/ptrace.h) and
gdb's gcore and qemu-user copy.  The machine (forensics.arch) says how many
registers NT_PRSTATUS holds and their names; everything else is the same
on both.  Notes this module does not decode are kept as RawNote and
otherwise ignored.

qemu-user's cores of an emulated program hold NT_PRSTATUS, NT_PRPSINFO and
NT_AUXV only: no NT_SIGINFO (the signal is taken from NT_PRSTATUS's
pr_info), no NT_FILE (forensics.reader.linkmap finds the modules) and no
NT_ARM_TLS (forensics.reader.threadptr finds the thread pointers).
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass, field
from typing import Any

from construct import Array, Bytes, Int8sl, Int8ul, Int16sl, Int32sl, Int32ul, Int64sl, Int64ul, Padding, Struct

from forensics.arch import X86_64, Arch

from .elf import NHDR_SIZE, Elf64_Nhdr, parse_at
from .errors import CoreParseError

NT_PRSTATUS = 1
NT_PRFPREG = 2
NT_PRPSINFO = 3
NT_AUXV = 6
NT_SIGINFO = 0x53494749  # "SIGI"
NT_FILE = 0x46494C45  # "FILE"
NT_ARM_TLS = 0x401  # "LINUX": tpidr_el0 (then tpidr2_el0 on SME machines)
# forensics' own note in a core it wrote from outside the process (the
# ptrace snapshot): key=value lines saying how it was taken (docs/format.md)
FORENSICS_NOTE = b"FORENSICS"
NT_FORENSICS_SNAPSHOT = 1

AT_NULL = 0
AT_PHDR = 3
AT_ENTRY = 9
AT_BASE = 7
AT_EXECFN = 31
AT_SYSINFO_EHDR = 33

# x86_64's elf_gregset_t (forensics.arch.x86_64): libtag's saved registers
# and the cores forensics writes are x86_64's
REG_NAMES = X86_64.reg_names

_timeval = Struct("tv_sec" / Int64sl, "tv_usec" / Int64sl)


def _prstatus_struct(nregs: int) -> Struct:
    """struct elf_prstatus (include/linux/elfcore.h), one per thread, of a
    machine whose elf_gregset_t has nregs registers."""
    return Struct(
        "pr_info" / Struct(  # struct elf_siginfo: note the order differs from siginfo_t
            "si_signo" / Int32sl,
            "si_code" / Int32sl,
            "si_errno" / Int32sl,
        ),
        "pr_cursig" / Int16sl,  # the signal that killed the process, 0 for gcore
        Padding(2),
        "pr_sigpend" / Int64ul,  # pending signal mask
        "pr_sighold" / Int64ul,  # blocked signal mask
        "pr_pid" / Int32sl,  # the thread id (what gettid() returned)
        "pr_ppid" / Int32sl,
        "pr_pgrp" / Int32sl,
        "pr_sid" / Int32sl,
        "pr_utime" / _timeval,
        "pr_stime" / _timeval,
        "pr_cutime" / _timeval,
        "pr_cstime" / _timeval,
        "pr_reg" / Array(nregs, Int64ul),  # elf_gregset_t, the machine's reg_names order
        "pr_fpvalid" / Int32sl,  # nonzero if an NT_PRFPREG note follows
        Padding(4),
    )


elf_prstatus = _prstatus_struct(len(REG_NAMES))  # x86_64
assert elf_prstatus.sizeof() == 336
_PRSTATUS: dict[int, Struct] = {}  # e_machine -> its struct elf_prstatus

# struct elf_prpsinfo (include/linux/elfcore.h), one per process.
elf_prpsinfo = Struct(
    "pr_state" / Int8sl,  # numeric process state
    "pr_sname" / Int8ul,  # state letter: R, S, D, T, Z
    "pr_zomb" / Int8ul,
    "pr_nice" / Int8sl,
    Padding(4),
    "pr_flag" / Int64ul,  # task flags
    "pr_uid" / Int32ul,
    "pr_gid" / Int32ul,
    "pr_pid" / Int32sl,  # the process id (thread group id)
    "pr_ppid" / Int32sl,
    "pr_pgrp" / Int32sl,
    "pr_sid" / Int32sl,
    "pr_fname" / Bytes(16),  # comm: executable base name, NUL padded, cut at 15
    "pr_psargs" / Bytes(80),  # command line, arguments joined by spaces, cut at 79
)
assert elf_prpsinfo.sizeof() == 136

# siginfo_t (include/uapi/asm-generic/siginfo.h): 128 bytes, union at offset 16.
siginfo_t = Struct(
    "si_signo" / Int32sl,
    "si_errno" / Int32sl,
    "si_code" / Int32sl,  # > 0: sent by the kernel (a fault); <= 0: by a process
    Padding(4),
    "sifields" / Bytes(112),
)
assert siginfo_t.sizeof() == 128
_sifields_kill = Struct("si_pid" / Int32sl, "si_uid" / Int32ul)  # SI_USER, SI_TKILL, SI_QUEUE
_sifields_fault = Struct("si_addr" / Int64ul)  # SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP

# NT_FILE: count, page size, count * (start, end, file offset in pages), then
# count NUL-terminated paths (fs/binfmt_elf.c fill_files_note).
nt_file_header = Struct("count" / Int64ul, "page_size" / Int64ul)
nt_file_entry = Struct("start" / Int64ul, "end" / Int64ul, "pgoff" / Int64ul)

auxv_entry = Struct("a_type" / Int64ul, "a_val" / Int64ul)

SI_USER = 0
SI_QUEUE = -1
SI_TKILL = -6
_FAULT_SIGNALS = {_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGILL, _signal.SIGFPE, _signal.SIGTRAP}


def note_bytes(name: bytes, ntype: int, desc: bytes) -> bytes:
    """One note as a core holds it: the header, the NUL-ended name and the
    description, each padded to 4 bytes."""
    name0 = name + b"\0"
    pad = lambda b: b + b"\0" * (-len(b) % 4)  # noqa: E731
    return (len(name0).to_bytes(4, "little") + len(desc).to_bytes(4, "little")
            + ntype.to_bytes(4, "little") + pad(name0) + pad(desc))


def prstatus_bytes(tid: int, regs, *, ppid: int = 0, pgrp: int = 0, sid: int = 0,
                   sigpend: int = 0, sighold: int = 0, fpvalid: bool = False) -> bytes:
    """An NT_PRSTATUS description for thread *tid* with registers *regs*
    (REG_NAMES order) and no signal: a thread of a snapshot, not of a crash."""
    return elf_prstatus.build({
        "pr_info": {"si_signo": 0, "si_code": 0, "si_errno": 0},
        "pr_cursig": 0, "pr_sigpend": sigpend, "pr_sighold": sighold,
        "pr_pid": tid, "pr_ppid": ppid, "pr_pgrp": pgrp, "pr_sid": sid,
        **{k: {"tv_sec": 0, "tv_usec": 0} for k in ("pr_utime", "pr_stime", "pr_cutime", "pr_cstime")},
        "pr_reg": [int(v) for v in regs],
        "pr_fpvalid": 1 if fpvalid else 0,
    })


def signal_name(num: int, unknown: str = "SIG{}") -> str:
    """A signal's name ("SIGSEGV"); unknown.format(num) for a number Python
    does not name."""
    try:
        return _signal.Signals(num).name
    except ValueError:
        return unknown.format(num)


@dataclass(frozen=True)
class RawNote:
    """A note as found: name, type, and the file offset and bytes of its desc."""

    name: bytes
    type: int
    offset: int  # file offset of desc
    desc: bytes


@dataclass(frozen=True)
class SigInfo:
    """The signal that ended the process (NT_SIGINFO)."""

    signo: int
    code: int
    errno: int
    addr: int | None = None  # faulting address, for kernel-raised SEGV/BUS/ILL/FPE/TRAP
    sender_pid: int | None = None  # for kill()/tkill()/sigqueue()
    sender_uid: int | None = None

    @property
    def name(self) -> str:
        return signal_name(self.signo, unknown="signal {}")


@dataclass
class PrStatus:
    """One thread's NT_PRSTATUS note as the kernel (or gdb) wrote it: the
    thread's id, its current signal and its registers.  Not a thread of the
    reader: forensics.reader.model.Thread is that, with these registers when
    they are the program's (Dump.saved_registers_first)."""

    tid: int
    signal: int  # pr_cursig
    regs: dict[str, int]  # the machine's reg_names -> value (aarch64: and tpidr_el0 from NT_ARM_TLS)
    siginfo: SigInfo | None = None  # gcore writes one per thread, the kernel one per core
    arch: Arch = X86_64
    info: tuple[int, int, int] = (0, 0, 0)  # pr_info: si_signo, si_code, si_errno

    @property
    def sp(self) -> int:
        return self.regs[self.arch.sp]

    @property
    def pc(self) -> int:
        return self.regs[self.arch.pc]


@dataclass(frozen=True)
class PrPsInfo:
    """Process-wide facts (NT_PRPSINFO)."""

    pid: int
    ppid: int
    uid: int
    gid: int
    state: str
    fname: str  # at most 15 characters
    psargs: str  # at most 79 characters


@dataclass(frozen=True)
class Mapping:
    """One file-backed mapping (NT_FILE)."""

    start: int
    end: int
    offset: int  # byte offset in the file (pgoff * page size)
    path: str

    def __contains__(self, addr: int) -> bool:
        return self.start <= addr < self.end


@dataclass(frozen=True)
class Auxv:
    """The auxiliary vector (NT_AUXV) as (type, value) pairs, AT_NULL dropped."""

    entries: tuple[tuple[int, int], ...] = ()

    def get(self, a_type: int) -> int | None:
        for t, v in self.entries:
            if t == a_type:
                return v
        return None

    @property
    def phdr(self) -> int | None:
        """AT_PHDR: address of the executable's program headers."""
        return self.get(AT_PHDR)

    @property
    def entry(self) -> int | None:
        """AT_ENTRY: the executable's entry point."""
        return self.get(AT_ENTRY)

    @property
    def base(self) -> int | None:
        """AT_BASE: load address of the dynamic loader (0 if static)."""
        return self.get(AT_BASE)

    @property
    def sysinfo_ehdr(self) -> int | None:
        """AT_SYSINFO_EHDR: where the kernel mapped the vDSO's ELF image."""
        return self.get(AT_SYSINFO_EHDR)

    @property
    def execfn(self) -> int | None:
        """AT_EXECFN: address of the path passed to execve (a C string in memory)."""
        return self.get(AT_EXECFN)


@dataclass
class Notes:
    """Everything decoded from a core's PT_NOTE segments."""

    threads: list[PrStatus] = field(default_factory=list)  # one NT_PRSTATUS a thread, in note order
    prpsinfo: PrPsInfo | None = None
    auxv: Auxv = field(default_factory=Auxv)
    mappings: list[Mapping] = field(default_factory=list)  # sorted by start
    siginfo: SigInfo | None = None  # the first NT_SIGINFO (the dumping thread's)
    raw: list[RawNote] = field(default_factory=list)  # every note, decoded or not


def _align4(n: int) -> int:
    return (n + 3) & ~3


def iter_notes(buf: Any, offset: int, size: int) -> list[RawNote]:
    """Split one PT_NOTE segment (already bounds-checked) into notes."""
    notes = []
    pos, end = offset, offset + size
    while pos + NHDR_SIZE <= end:
        nhdr = parse_at(Elf64_Nhdr, buf, pos, "note header")
        name_off = pos + NHDR_SIZE
        desc_off = _align4(name_off + nhdr.n_namesz)
        desc_end = desc_off + nhdr.n_descsz
        if desc_end > end:
            raise CoreParseError(
                f"bad note at offset {pos:#x}: namesz {nhdr.n_namesz:#x} descsz {nhdr.n_descsz:#x} "
                f"run past the end of its PT_NOTE segment at {end:#x}"
            )
        name = bytes(buf[name_off : name_off + nhdr.n_namesz]).rstrip(b"\0")
        notes.append(RawNote(name, nhdr.n_type, desc_off, bytes(buf[desc_off:desc_end])))
        pos = _align4(desc_end)
    return notes


def _parse_desc(struct: Struct, note: RawNote, what: str) -> Any:
    if len(note.desc) < struct.sizeof():
        raise CoreParseError(
            f"bad {what} note at offset {note.offset:#x}: desc is {len(note.desc)} bytes, "
            f"expected {struct.sizeof()}"
        )
    return parse_at(struct, note.desc, 0, f"{what} note (desc at file offset {note.offset:#x})")


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def decode_prstatus(note: RawNote, arch: Arch = X86_64) -> PrStatus:
    if arch is X86_64:
        struct = elf_prstatus
    else:
        struct = _PRSTATUS.get(arch.e_machine) or _PRSTATUS.setdefault(
            arch.e_machine, _prstatus_struct(len(arch.reg_names)))
    st = _parse_desc(struct, note, "NT_PRSTATUS")
    return PrStatus(tid=st.pr_pid, signal=st.pr_cursig, regs=dict(zip(arch.reg_names, st.pr_reg, strict=True)),
                    arch=arch, info=(st.pr_info.si_signo, st.pr_info.si_code, st.pr_info.si_errno))


def decode_prpsinfo(note: RawNote) -> PrPsInfo:
    ps = _parse_desc(elf_prpsinfo, note, "NT_PRPSINFO")
    return PrPsInfo(
        pid=ps.pr_pid,
        ppid=ps.pr_ppid,
        uid=ps.pr_uid,
        gid=ps.pr_gid,
        state=chr(ps.pr_sname) if ps.pr_sname else "",
        fname=_cstr(ps.pr_fname),
        # The kernel joins argv with spaces already; gdb may leave a trailing one.
        psargs=_cstr(ps.pr_psargs).rstrip(),
    )


def decode_siginfo(note: RawNote) -> SigInfo:
    si = _parse_desc(siginfo_t, note, "NT_SIGINFO")
    addr = sender_pid = sender_uid = None
    if si.si_code > 0 and si.si_signo in _FAULT_SIGNALS:
        addr = _sifields_fault.parse(si.sifields[: _sifields_fault.sizeof()]).si_addr
    elif si.si_code in (SI_USER, SI_QUEUE, SI_TKILL):
        kill = _sifields_kill.parse(si.sifields[: _sifields_kill.sizeof()])
        sender_pid, sender_uid = kill.si_pid, kill.si_uid
    return SigInfo(si.si_signo, si.si_code, si.si_errno, addr, sender_pid, sender_uid)


def decode_auxv(note: RawNote) -> Auxv:
    n = len(note.desc) // auxv_entry.sizeof()
    entries = _parse_desc(Array(n, auxv_entry), note, "NT_AUXV") if n else []
    pairs = []
    for e in entries:
        if e.a_type == AT_NULL:
            break
        pairs.append((e.a_type, e.a_val))
    return Auxv(tuple(pairs))


def decode_file(note: RawNote) -> list[Mapping]:
    hdr = _parse_desc(nt_file_header, note, "NT_FILE")
    table_off = nt_file_header.sizeof()
    table_end = table_off + hdr.count * nt_file_entry.sizeof()
    if table_end > len(note.desc):
        raise CoreParseError(
            f"bad NT_FILE note at offset {note.offset:#x}: {hdr.count} entries need "
            f"{table_end:#x} bytes, desc is {len(note.desc):#x}"
        )
    entries = parse_at(
        Array(hdr.count, nt_file_entry), note.desc, table_off, f"NT_FILE table (desc at {note.offset:#x})"
    )
    paths = note.desc[table_end:].split(b"\0")
    if len(paths) < hdr.count:
        raise CoreParseError(
            f"bad NT_FILE note at offset {note.offset:#x}: {hdr.count} entries but "
            f"{len(paths)} paths"
        )
    maps = [
        Mapping(e.start, e.end, e.pgoff * hdr.page_size, p.decode("utf-8", "surrogateescape"))
        for e, p in zip(entries, paths[: hdr.count], strict=True)
    ]
    maps.sort(key=lambda m: m.start)
    return maps


def decode_notes(raw: list[RawNote], arch: Arch = X86_64) -> Notes:
    """Decode the notes a core reader needs; keep the rest raw."""
    out = Notes(raw=raw)
    for note in raw:
        if note.name == b"LINUX" and note.type == NT_ARM_TLS and arch.tp == "tpidr_el0":
            # the thread pointer of the thread whose NT_PRSTATUS came before
            if out.threads and len(note.desc) >= 8:
                out.threads[-1].regs[arch.tp] = int.from_bytes(note.desc[:8], "little")
            continue
        if note.name != b"CORE":
            continue  # other "LINUX" notes are register sets (xstate, ...) we do not read
        if note.type == NT_PRSTATUS:
            out.threads.append(decode_prstatus(note, arch))
        elif note.type == NT_PRPSINFO and out.prpsinfo is None:
            out.prpsinfo = decode_prpsinfo(note)
        elif note.type == NT_AUXV:
            out.auxv = decode_auxv(note)
        elif note.type == NT_FILE:
            out.mappings = decode_file(note)
        elif note.type == NT_SIGINFO:
            si = decode_siginfo(note)
            if out.siginfo is None:
                out.siginfo = si
            if out.threads and out.threads[-1].siginfo is None:
                out.threads[-1].siginfo = si
    if out.siginfo is None and out.threads and out.threads[0].signal and arch is not X86_64:
        # qemu-user writes no NT_SIGINFO: the signal is NT_PRSTATUS's
        # (pr_info, which says no address or sender)
        signo, code, errno = out.threads[0].info
        out.siginfo = SigInfo(signo or out.threads[0].signal, code, errno)
    return out
