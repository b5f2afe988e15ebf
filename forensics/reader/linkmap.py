"""The modules of a core that has no NT_FILE note, from the dynamic
loader's own list: qemu-user's cores of an emulated program (which hold
NT_PRSTATUS, NT_PRPSINFO and NT_AUXV only) and any core written without
one.

    found = link_map_mappings(core, sysroot)   # LinkMap, or None
    core.adopt_mappings(found.mappings)

The executable is the file AT_EXECFN names (a relative name is taken
from the core's directory: qemu-user writes its core in the program's
working directory), placed by AT_ENTRY against its e_entry.  Its dynamic
section's DT_DEBUG entry points at ``struct r_debug``, whose ``r_map`` is
the loader's ``struct link_map`` list: for each shared object its load
bias (``l_addr``), its path as the process opened it (``l_name``) and its
dynamic section (``l_ld``).  The mappings of each are its PT_LOAD
segments, read from the file at that path under ``sysroot`` (the root the
program ran in: qemu's ``-L``), else at the path itself - only a file of
the core's machine; for a file that is found nowhere, the core's segments
from ``l_addr`` through the one holding ``l_ld``.  A core without the
executable's first page (qemu-user dumps no read-only code) needs the
files for this: their build-ids are the files' (``LinkMap.files``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from forensics.core import elf
from forensics.core.notes import Mapping
from forensics.errors import ForensicsError
from forensics.reader.symbols import open_regular

AT_PAGESZ = 6
DT_NULL, DT_DEBUG = 0, 21
PT_DYNAMIC = 2
MAX_OBJECTS = 4096  # a longer list is a damaged one


@dataclass
class LinkMap:
    """What the loader's list gave: the mappings of every module, and the
    file found here for each path."""

    mappings: list[Mapping] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # path as the process had it -> file here
    biases: dict[str, int] = field(default_factory=dict)  # path -> load bias (l_addr; the executable's)


def _file_facts(path: str, machine: int):
    """(e_entry, PT_LOADs, PT_DYNAMIC vaddr) of an ELF file of the given
    machine, or None."""

    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            head = f.read(elf.EHDR_SIZE)
            if len(head) < elf.EHDR_SIZE or head[:4] != elf.ELFMAG:
                return None
            ehdr = elf.parse_at(elf.Elf64_Ehdr, head, 0, "ELF header")
            if ehdr.e_machine != machine:
                return None
            phdrs = elf.file_program_headers(f) or []
        except (OSError, ValueError, ForensicsError):
            return None
    loads = [p for p in phdrs if p.p_type == elf.PT_LOAD]
    dyn = next((p.p_vaddr for p in phdrs if p.p_type == PT_DYNAMIC), None)
    return (ehdr.e_entry, loads, dyn) if loads else None


def _local(path: str, sysroot: str | None, machine: int, base_dir: str | None = None):
    """(file here, its facts) for a path the process had: under sysroot,
    then the path itself (a relative one from base_dir)."""
    cands = []
    if os.path.isabs(path):
        if sysroot:
            cands.append(os.path.join(sysroot, path.lstrip("/")))
        cands.append(path)
    elif base_dir is not None:
        cands.append(os.path.normpath(os.path.join(base_dir, path)))
    for c in cands:
        facts = _file_facts(c, machine)
        if facts is not None:
            return c, facts
    return None, None


def _segment_maps(path: str, bias: int, loads, page: int) -> list[Mapping]:
    """The file-backed mappings of a module's PT_LOADs at bias."""
    out = []
    for p in loads:
        lo = (p.p_vaddr & ~(page - 1))
        hi = (p.p_vaddr + p.p_filesz + page - 1) & ~(page - 1)
        if hi > lo:
            out.append(Mapping(bias + lo, bias + hi, p.p_offset & ~(page - 1), path))
    return out


def _cstring(core, found: LinkMap, addr: int) -> str:
    """The C string at addr: from the core, else from the file of a module
    found so far that maps it (the loader's own l_name is the executable's
    PT_INTERP string, in code qemu-user does not dump)."""
    try:
        return core.read_cstring(addr, 4096).decode("utf-8", "surrogateescape")
    except (ForensicsError, ValueError):
        pass

    for m in found.mappings:
        local = found.files.get(m.path)
        if local is None or not m.start <= addr < m.end:
            continue
        f = open_regular(local)
        if f is None:
            return ""
        with f:
            try:
                f.seek(m.offset + addr - m.start)
                raw = f.read(4096)
            except (OSError, ValueError):
                return ""
        return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return ""


def link_map_mappings(core, sysroot: str | None = None) -> LinkMap | None:
    """The modules of core (see the module docstring), or None when the
    executable or the loader's list cannot be found."""
    auxv = core.auxv
    page = auxv.get(AT_PAGESZ) or 4096
    machine = core.ehdr.e_machine
    execfn, entry = core.execfn, auxv.entry
    if not execfn or not entry:
        return None
    exe, facts = _local(execfn, sysroot, machine, os.path.dirname(os.path.abspath(core.path)))
    if exe is None:
        return None
    e_entry, loads, dyn = facts
    bias = entry - e_entry
    out = LinkMap()
    exe_path = exe if not os.path.isabs(execfn) else execfn
    out.mappings += _segment_maps(exe_path, bias, loads, page)
    out.files[exe_path] = exe
    out.biases[exe_path] = bias

    def u64(addr: int) -> int | None:
        try:
            return core.read_u64(addr)
        except (ForensicsError, ValueError):
            return None

    r_debug = None
    if dyn is not None:
        at = bias + dyn
        for _ in range(1024):
            tag, val = u64(at), u64(at + 8)
            if tag is None or tag == DT_NULL:
                break
            if tag == DT_DEBUG:
                r_debug = val
                break
            at += 16
    lm = u64(r_debug + 8) if r_debug else None  # struct r_debug: r_version, r_map
    seen = set()
    while lm and lm not in seen and len(seen) < MAX_OBJECTS:
        seen.add(lm)
        l_addr, l_name, l_ld, l_next = u64(lm), u64(lm + 8), u64(lm + 16), u64(lm + 24)
        name = _cstring(core, out, l_name) if l_name else ""
        if name.startswith("/") and l_addr is not None:
            local, facts = _local(name, sysroot, machine)
            if local is not None:
                out.mappings += _segment_maps(name, l_addr, facts[1], page)
                out.files[name] = local
                out.biases[name] = l_addr
            else:
                seg = core.find_segment(l_ld) if l_ld else None
                start = core.find_segment(l_addr)
                if seg is not None and start is not None and seg.end > l_addr:
                    out.mappings.append(Mapping(l_addr, seg.end, 0, name))
        lm = l_next
    out.mappings.sort(key=lambda m: m.start)
    return out


__all__ = ["LinkMap", "link_map_mappings"]
