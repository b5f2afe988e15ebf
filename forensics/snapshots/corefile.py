"""Writing the ELF core of a stopped process from outside it.

The ptrace snapshot (forensics/snapshots/ptrace.py) leaves a forked copy of
the process stopped, never run; this writes its core as the kernel would
have written the process's: one PT_LOAD per mapping, chosen and sized by
the kernel's own rules (fs/binfmt_elf.c vma_dump_size) under the process's
``/proc/PID/coredump_filter``, and the notes gdb and forensics read - an
NT_PRSTATUS, NT_PRFPREG and NT_X86_XSTATE per thread of the process (from the
registers read before the fork, under the process's thread ids), then
NT_PRPSINFO, NT_AUXV and NT_FILE - plus one note of ours, name "FORENSICS",
that says how the core was taken (``method=ptrace``, the pause): a snapshot,
not a crash (no NT_SIGINFO, no current signal).

Memory is read from ``/proc/COPY/mem``.  A private anonymous mapping is read
only where ``/proc/COPY/pagemap`` says a page is present or swapped (the rest
is zero: a hole in the file); every page that reads as zeros is a hole too,
so the core is as sparse as the kernel's.  A page that cannot be read (a
file mapping past its file's end) is left zero, as the kernel leaves it.
"""

from __future__ import annotations

import errno as _errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from forensics._np import np

from forensics.core.elf import (
    EHDR_SIZE,
    ELFCLASS64,
    ELFDATA2LSB,
    ELFMAG,
    EM_X86_64,
    ET_CORE,
    PF_R,
    PF_W,
    PF_X,
    PHDR_SIZE,
    PT_LOAD,
    PT_NOTE,
    Elf64_Ehdr,
    Elf64_Phdr,
)
from forensics.core.notes import (
    FORENSICS_NOTE,
    NT_AUXV,
    NT_FILE,
    NT_FORENSICS_SNAPSHOT,
    NT_PRFPREG,
    NT_PRPSINFO,
    NT_PRSTATUS,
    elf_prpsinfo,
    note_bytes,
    prstatus_bytes,
)
from forensics.errors import InputError
from forensics.snapshots.ptrace import read_status

PAGE = os.sysconf("SC_PAGE_SIZE")
NT_X86_XSTATE = 0x202

# /proc/PID/coredump_filter bits (core(5))
_ANON_PRIVATE, _ANON_SHARED, _MAPPED_PRIVATE, _MAPPED_SHARED, _ELF_HEADERS = 1, 2, 4, 8, 16
_HUGETLB_PRIVATE, _HUGETLB_SHARED = 32, 64
DEFAULT_FILTER = 0x33

_CHUNK = 8 << 20  # bytes read from the copy at a time
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) \S+ (\d+)\s*(.*)$")


@dataclass
class Vma:
    start: int
    end: int
    perms: str
    pgoff: int            # file offset in pages
    inode: int
    path: str | None
    flags: set[str] = field(default_factory=set)  # VmFlags
    anon_kb: int = 0      # Anonymous + Swap: pages the process wrote (its anon_vma)

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def file_backed(self) -> bool:
        return self.inode != 0 and self.path is not None and self.path.startswith("/")

    @property
    def private_anonymous(self) -> bool:
        """Memory of the process's own, zero until written: a page that is
        neither present nor swapped reads as zeros (not the vDSO, not shared
        memory, not a file)."""
        p = self.path
        return "sh" not in self.flags and (p is None or p in ("[heap]", "[stack]")
                                           or p.startswith("[anon:"))

    @property
    def pflags(self) -> int:
        return ((PF_R if self.perms[0] == "r" else 0) | (PF_W if self.perms[1] == "w" else 0)
                | (PF_X if self.perms[2] == "x" else 0))


def read_smaps(pid: int) -> list[Vma]:
    """The mappings of *pid* with their VmFlags and written pages."""
    out: list[Vma] = []
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            m = _HEADER.match(line)
            if m:
                path = m[6] or None
                out.append(Vma(int(m[1], 16), int(m[2], 16), m[3], int(m[4], 16) // PAGE,
                               int(m[5]), path))
                continue
            if not out:
                continue
            key, _, rest = line.partition(":")
            if key == "VmFlags":
                out[-1].flags = set(rest.split())
            elif key in ("Anonymous", "Swap"):
                try:
                    out[-1].anon_kb += int(rest.split()[0])
                except (ValueError, IndexError):
                    pass
    return out


def dump_size(vma: Vma, filt: int, elf_magic: Callable[[Vma], bool]) -> int:
    """How many bytes of *vma* the kernel would dump (vma_dump_size)."""
    if vma.path in ("[vdso]", "[vsyscall]"):
        return vma.size if vma.path == "[vdso]" else 0  # vsyscall cannot be read through mem
    if "dd" in vma.flags:
        return 0
    if "ht" in vma.flags:
        return vma.size if filt & (_HUGETLB_SHARED if "sh" in vma.flags else _HUGETLB_PRIVATE) else 0
    if "io" in vma.flags or "pf" in vma.flags:
        return 0
    if "sh" in vma.flags:
        unlinked = not vma.file_backed or (vma.path or "").endswith(" (deleted)")
        return vma.size if filt & (_ANON_SHARED if unlinked else _MAPPED_SHARED) else 0
    if vma.anon_kb and filt & _ANON_PRIVATE:
        return vma.size
    if not vma.file_backed:
        return 0
    if filt & _MAPPED_PRIVATE:
        return vma.size
    if filt & _ELF_HEADERS and vma.pgoff == 0 and vma.perms[0] == "r" and elf_magic(vma):
        return PAGE
    return 0


def coredump_filter(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/coredump_filter") as f:
            return int(f.read().strip(), 16)
    except (OSError, ValueError):
        return DEFAULT_FILTER


# ------------------------------------------------------------ the notes --

def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the comm."""
    with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
        text = f.read()
    return text[text.rindex(")") + 2:].split()


def _mask(st: dict[str, str], *keys: str) -> int:
    v = 0
    for k in keys:
        try:
            v |= int(st.get(k, "0"), 16)
        except ValueError:
            pass
    return v


@dataclass
class ProcessFacts:
    """What the process notes say, read from /proc while it runs."""
    pid: int
    ppid: int
    pgrp: int
    sid: int
    state: str
    uid: int
    gid: int
    comm: bytes
    psargs: bytes
    auxv: bytes
    sigmasks: dict[int, tuple[int, int]]  # tid -> (pending, blocked)


def process_facts(pid: int, tids: list[int], copy_pid: int) -> ProcessFacts:
    """The process's facts: its command, arguments and auxiliary vector from
    its copy (the same memory, and there while the process may have exited),
    its parent, group, session and signal masks from the process itself
    (the copy's own where it is gone)."""
    try:
        f = _stat_fields(pid)
    except OSError:
        f = _stat_fields(copy_pid)
    st = read_status(f"/proc/{pid}/status") or read_status(f"/proc/{copy_pid}/status")
    with open(f"/proc/{copy_pid}/comm", "rb") as fh:
        comm = fh.read().rstrip(b"\n")[:15]
    try:
        with open(f"/proc/{copy_pid}/cmdline", "rb") as fh:
            psargs = fh.read(4096).rstrip(b"\0").replace(b"\0", b" ")[:79]
    except OSError:
        psargs = comm
    with open(f"/proc/{copy_pid}/auxv", "rb") as fh:
        auxv = fh.read()
    masks = {}
    for t in tids:
        ts = read_status(f"/proc/{pid}/task/{t}/status")
        masks[t] = (_mask(ts, "SigPnd", "ShdPnd"), _mask(ts, "SigBlk"))
    uid = int(st.get("Uid", "0").split()[0] or 0)
    gid = int(st.get("Gid", "0").split()[0] or 0)
    return ProcessFacts(pid, int(f[1]), int(f[2]), int(f[3]), f[0], uid, gid, comm, psargs,
                        auxv, masks)


def _prpsinfo(p: ProcessFacts) -> bytes:
    states = "RSDTZW"
    return elf_prpsinfo.build({
        "pr_state": states.index(p.state) if p.state in states else 0,
        "pr_sname": ord(p.state[:1] or "R"), "pr_zomb": 0, "pr_nice": 0, "pr_flag": 0,
        "pr_uid": p.uid, "pr_gid": p.gid, "pr_pid": p.pid, "pr_ppid": p.ppid,
        "pr_pgrp": p.pgrp, "pr_sid": p.sid,
        "pr_fname": p.comm.ljust(16, b"\0")[:16], "pr_psargs": p.psargs.ljust(80, b"\0")[:80],
    })


def _nt_file(vmas: list[Vma]) -> bytes:
    files = [v for v in vmas if v.file_backed]
    head = len(files).to_bytes(8, "little") + PAGE.to_bytes(8, "little")
    ents = b"".join(v.start.to_bytes(8, "little") + v.end.to_bytes(8, "little")
                    + v.pgoff.to_bytes(8, "little") for v in files)
    names = b"".join(os.fsencode(v.path) + b"\0" for v in files)
    return head + ents + names


def build_notes(proc: ProcessFacts, threads, vmas: list[Vma], marker: dict[str, str]) -> bytes:
    """The PT_NOTE contents: threads in order (the first is the one gdb shows first)."""
    out = []
    for i, th in enumerate(threads):
        regs = np.frombuffer(th.regs, dtype="<u8")
        pend, held = proc.sigmasks.get(th.tid, (0, 0))
        out.append(note_bytes(b"CORE", NT_PRSTATUS, prstatus_bytes(
            th.tid, regs, ppid=proc.ppid, pgrp=proc.pgrp, sid=proc.sid, sigpend=pend,
            sighold=held, fpvalid=bool(th.fpregs))))
        if i == 0:
            out.append(note_bytes(b"CORE", NT_PRPSINFO, _prpsinfo(proc)))
            out.append(note_bytes(b"CORE", NT_AUXV, proc.auxv))
            out.append(note_bytes(b"CORE", NT_FILE, _nt_file(vmas)))
            text = "".join(f"{k}={v}\n" for k, v in marker.items()).encode()
            out.append(note_bytes(FORENSICS_NOTE, NT_FORENSICS_SNAPSHOT, text))
        if th.fpregs:
            out.append(note_bytes(b"CORE", NT_PRFPREG, th.fpregs))
        if th.xstate:
            out.append(note_bytes(b"LINUX", NT_X86_XSTATE, th.xstate))
    return b"".join(out)


# ----------------------------------------------------------- the memory --

@dataclass
class Written:
    core_bytes: int        # the file's size
    data_bytes: int        # bytes of memory written (not holes)
    segments: int


def _present_runs(pagemap: int, vma: Vma) -> list[tuple[int, int]]:
    """[(start, end)] of the pages of *vma* that are present or swapped."""
    runs: list[tuple[int, int]] = []
    step = 1 << 16  # pages per pagemap read
    first = vma.start // PAGE
    last = vma.end // PAGE
    p = first
    while p < last:
        n = min(step, last - p)
        try:
            raw = os.pread(pagemap, n * 8, p * 8)
        except OSError:
            return [(vma.start, vma.end)]
        ents = np.frombuffer(raw, dtype="<u8")
        have = (ents >> np.uint64(62)) != 0  # bit 63 present, bit 62 swapped
        if have.any():
            edges = np.flatnonzero(np.diff(np.concatenate(([0], have.view(np.int8), [0]))))
            for a, b in zip(edges[::2], edges[1::2]):
                lo, hi = (p + int(a)) * PAGE, (p + int(b)) * PAGE
                if runs and runs[-1][1] == lo:
                    runs[-1] = (runs[-1][0], hi)
                else:
                    runs.append((lo, hi))
        p += n
    return runs


def _copy_range(mem: int, out: int, lo: int, hi: int, file_at: int, buf: bytearray) -> int:
    """Copy [lo, hi) of the copy's memory to the core at file_at + (lo - seg
    start) given as file_at for lo; pages of zeros become holes.  Returns
    the bytes written."""
    written = 0
    view = memoryview(buf)
    a = lo
    while a < hi:
        n = min(_CHUNK, hi - a)
        try:
            got = os.preadv(mem, [view[:n]], a)
        except OSError:
            got = 0
        if got < n:
            # a page that cannot be read: the rest one page at a time
            for pg in range(a + (got - got % PAGE), a + n, PAGE):
                try:
                    data = os.pread(mem, PAGE, pg)
                except OSError:
                    continue
                if data.count(0) != len(data):
                    os.pwrite(out, data, file_at + (pg - lo))
                    written += len(data)
            n_ok = got - got % PAGE
        else:
            n_ok = n
        if n_ok:
            pages = np.frombuffer(view[:n_ok], dtype="<u8").reshape(-1, PAGE // 8)
            nz = pages.any(axis=1)
            if nz.any():
                edges = np.flatnonzero(np.diff(np.concatenate(([0], nz.view(np.int8), [0]))))
                for s, e in zip(edges[::2], edges[1::2]):
                    s, e = int(s) * PAGE, int(e) * PAGE
                    os.pwrite(out, view[s:e], file_at + (a - lo) + s)
                    written += e - s
        a += n
    return written


def write_core(path: Path, *, pid: int, copy_pid: int, threads, marker: dict[str, str],
               progress: Callable[[int, int], None] | None = None) -> Written:
    """Write the core of process *pid* (its threads' registers in *threads*,
    first shown first) from its stopped copy *copy_pid* to *path* (a new
    file, 0600, never through a symlink).  On failure nothing is left."""
    try:
        return _write_core(path, pid=pid, copy_pid=copy_pid, threads=threads, marker=marker,
                           progress=progress)
    except OSError as e:  # the copy's /proc, before the file existed
        raise InputError(f"cannot read the copy of pid {pid} ({copy_pid}): "
                         f"{e.strerror or e}; no core written") from None


def _write_core(path: Path, *, pid: int, copy_pid: int, threads, marker: dict[str, str],
                progress: Callable[[int, int], None] | None = None) -> Written:
    vmas = read_smaps(copy_pid)
    filt = coredump_filter(pid)
    mem = os.open(f"/proc/{copy_pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        def elf_magic(v: Vma) -> bool:
            try:
                return os.pread(mem, 4, v.start) == ELFMAG
            except OSError:
                return False

        sizes = [dump_size(v, filt, elf_magic) for v in vmas]
        proc = process_facts(pid, [t.tid for t in threads], copy_pid)
        notes = build_notes(proc, threads, vmas, marker)
        phnum = 1 + len(vmas)
        if phnum >= 0xFFFF:
            raise InputError(f"process {pid} has {len(vmas)} mappings: more than an ELF core's "
                             f"program headers can count")
        notes_at = EHDR_SIZE + phnum * PHDR_SIZE
        data_at = -(-(notes_at + len(notes)) // PAGE) * PAGE
        phdrs = [Elf64_Phdr.build(dict(p_type=PT_NOTE, p_flags=0, p_offset=notes_at, p_vaddr=0,
                                       p_paddr=0, p_filesz=len(notes), p_memsz=0, p_align=0))]
        offsets = []
        off = data_at
        for v, n in zip(vmas, sizes):
            offsets.append(off)
            phdrs.append(Elf64_Phdr.build(dict(p_type=PT_LOAD, p_flags=v.pflags, p_offset=off,
                                               p_vaddr=v.start, p_paddr=0, p_filesz=n,
                                               p_memsz=v.size, p_align=PAGE)))
            off += n
        total = off
        ehdr = Elf64_Ehdr.build(dict(
            e_ident=dict(magic=ELFMAG, ei_class=ELFCLASS64, ei_data=ELFDATA2LSB, ei_version=1,
                         ei_osabi=0, ei_abiversion=0, ei_pad=bytes(7)),
            e_type=ET_CORE, e_machine=EM_X86_64, e_version=1, e_entry=0, e_phoff=EHDR_SIZE,
            e_shoff=0, e_flags=0, e_ehsize=EHDR_SIZE, e_phentsize=PHDR_SIZE, e_phnum=phnum,
            e_shentsize=0, e_shnum=0, e_shstrndx=0))
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600)
        try:
            os.pwrite(out, ehdr + b"".join(phdrs) + notes, 0)
            pagemap = os.open(f"/proc/{copy_pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            buf = bytearray(_CHUNK)
            data = 0
            done = 0
            want = sum(sizes)
            try:
                for v, n, at in zip(vmas, sizes, offsets):
                    if not n:
                        continue
                    if n == v.size and v.private_anonymous:
                        runs = _present_runs(pagemap, v)
                    else:
                        runs = [(v.start, v.start + n)]
                    for lo, hi in runs:
                        data += _copy_range(mem, out, lo, hi, at + (lo - v.start), buf)
                    done += n
                    if progress is not None:
                        progress(done, want)
            finally:
                os.close(pagemap)
            os.ftruncate(out, total)
            os.fsync(out)
        except BaseException as e:
            os.close(out)
            os.unlink(path)
            if isinstance(e, OSError) and e.errno == _errno.ENOSPC:
                raise InputError(f"no space left on the device of {path}: no core written") \
                    from None
            if isinstance(e, OSError):
                raise InputError(f"cannot write {path}: {e.strerror}") from None
            raise
        os.close(out)
    finally:
        os.close(mem)
    return Written(total, data, len(vmas))
