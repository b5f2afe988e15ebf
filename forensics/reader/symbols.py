"""Code addresses to function, file and line: symbolised frames.

The modules are the ELF files mapped into the process: from a core's NT_FILE
note (``Core.mappings``) or a live process's ``/proc/PID/maps``
(``forensics.reader.live.read_maps``).  :func:`modules_from_mappings` groups the mappings
per loaded file and works out each file's load bias from its program headers.

:class:`Symbolizer` resolves ``(pc, kind)`` pairs to :class:`SymbolFrame`
(a ``forensics.reader.model.Frame`` with two offsets more), where kind is the stack
node kind of ``tag_abi.h``: ``FRAME_CALL`` (a return address: the line wanted
is the call's, so ``pc - 1`` is looked up, but the frame reports ``pc``) or
``FRAME_ENTRY`` (a function's entry) or ``FRAME_SIGNAL`` (the instruction a
signal interrupted): ``pc`` itself is looked up.  Each address is
resolved with the calls inlined there (llvm-symbolizer's ``--inlines``,
addr2line's ``-i``): the frame names the physical function and the line
executed in it, and carries the inlined functions for
:func:`expand_inlines`.  Work is
batched: one subprocess per module per :meth:`Symbolizer.symbolize` call, for
all of that module's addresses not already cached.  Results are cached in
memory and, with ``cache_dir``, in a small SQLite file (mode 0600) keyed by
the answering file's path, mtime, size and build-id and the address, so a
rebuilt file is never answered from stale entries.  Which file answers is
checked first: a module is symbolised only from a file whose build-id is the
one the process had (see :class:`Symbolizer`).

A frame is never dropped, it only loses detail:

=====================================  ========  ====  ====  ======  ======  =============
what is known                          function  file  line  offset  module  module_offset
=====================================  ========  ====  ====  ======  ======  =============
debug info                             name      path  int   int     path    int
symbols only (``symbol+offset``)       name      None  None  int     path    int
no symbols (``module+offset``)         None      None  None  None    path    int
module file missing, deleted, non-ELF  None      None  None  None    path    int
pc in no module                        None      None  None  None    None    None
=====================================  ========  ====  ====  ======  ======  =============

``offset`` is ``pc`` minus the start of its function symbol; ``module_offset``
is ``pc`` minus the module's load bias, i.e. the address as the file's own
headers, ``nm`` and ``addr2line -e`` see it.

The tools, measured on this project's machine (Debian 12, binutils 2.40,
LLVM 14, pyelftools 0.33; libc.so.6 with its libc6-dbg debug file found by
build id) for 1000 random text addresses, one process per module, wall time:

=========================================  ==================  ===============
tool                                       libc.so.6           sym_victim (-g)
=========================================  ==================  ===============
``addr2line -a -f -C -e`` (argv or stdin)  0.16 - 0.18 s       0.005 s
``llvm-symbolizer --output-style=JSON``    0.15 - 0.18 s       0.036 - 0.040 s
pyelftools, symbol tables only             0.35 s              0.006 s
pyelftools, + DWARF line tables            9.7 s (291k rows)   0.018 s
=========================================  ==================  ===============

(``eu-addr2line`` is not installed there.)  End to end, ``symbolize`` of
those 1000 return addresses (500 in libc, 500 in the victim) takes 0.35 -
0.65 s cold (addr2line: 0.57 - 0.75 s, loading libc's symbol table for the
offsets), 4 - 13 ms again from the memory cache, and 20 - 30 ms from the
disk cache in a new Symbolizer.  The two external tools cost the
same; llvm-symbolizer is used when it is on PATH because it names functions
as the source does (DWARF ``qsort`` where addr2line, reading the debug
file's symbol table, says ``__GI_qsort``) and reports the function's start
address, which ``symbol+offset`` needs.  addr2line is the fallback (it comes
with gcc's binutils); its symbol starts come from the file's own symbol
tables read with pyelftools, only for modules that need them.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

from forensics.core import elf
from forensics.errors import ForensicsError, InputError
from forensics.files import create_private, ensure_private_dir
from forensics.reader.abi import TAG_FRAME_CALL as FRAME_CALL  # pc is a return address: look up pc - 1
from forensics.reader.abi import TAG_FRAME_ENTRY as FRAME_ENTRY  # pc is an instrumented entry: look up pc
from forensics.reader.abi import TAG_FRAME_SIGNAL as FRAME_SIGNAL  # pc a signal interrupted: look up pc
from forensics.reader.abi import LOST_FRAMES, TAG_FRAME_LOST  # the table was full: a marker
from forensics.reader.debuginfod import Client, urls
from forensics.reader.model import Frame

# A symbolizer that hangs (a debuginfod server that does not answer...) must
# not hang forensics: past this the module's frames get module+offset only.
TOOL_TIMEOUT = 120.0

_DELETED = " (deleted)"


@dataclass(frozen=True)
class SymbolFrame(Frame):
    """A forensics.reader.model.Frame (the JSON frame's fields) plus the two
    offsets and the calls inlined at its address.

    ``function``, ``file`` and ``line`` name the physical function (the one
    the code belongs to) and the line being executed in it - for a pc in
    inlined code, the line of the inlined call.  ``inlined_calls`` are the
    inlined functions at the address, innermost first, each with the line
    being executed in it (the innermost's own line, the others' call sites);
    :func:`expand_inlines` turns them into frames of their own.
    """

    offset: int | None = None  # address - start of `function`'s symbol
    module_offset: int | None = None  # address - the module's load bias
    inlined_calls: tuple[Frame, ...] = ()


# -- modules -------------------------------------------------------------------


class MappingLike(Protocol):
    start: int
    end: int
    offset: int
    path: str


@dataclass(frozen=True)
class Module:
    """One loaded ELF file: the span of its mappings and its load bias.

    ``pc - load_bias`` is the address as the file's headers see it (0 bias for
    a non-PIE executable).  ``deleted``: the process had a file that has since
    been deleted or replaced at ``path``.  ``build_id``: the GNU build-id of
    the file the process had, read from its memory (the first page of the
    file's offset-0 mapping, which every core holds), and ``headers`` the
    ELF and program headers there; None when the memory does not show them.
    A file on disk is read for this module only when they match it.
    """

    path: str
    start: int
    end: int
    load_bias: int
    deleted: bool = False
    build_id: bytes | None = None
    headers: bytes | None = None
    # where its file is here, when the module was found with it (a core
    # without NT_FILE: forensics.reader.linkmap); None: path, under sysroot
    file: str | None = None

    def __contains__(self, addr: int) -> bool:
        return self.start <= addr < self.end


_PAGE = 4096


def open_regular(path: str):
    """A module file named by a core, opened for reading only if it is a
    regular file - a core can name a FIFO, a tty or /dev/zero, which would
    hang or never end - else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _loads(phdrs) -> list[tuple[int, int, int]] | None:
    loads = [(p.p_offset, p.p_vaddr, p.p_filesz) for p in phdrs or () if p.p_type == elf.PT_LOAD]
    return loads or None


def _load_segments(path: str) -> list[tuple[int, int, int]] | None:
    """(p_offset, p_vaddr, p_filesz) of each PT_LOAD of a 64-bit little-endian
    ELF file, or None if it is not one (or cannot be read)."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        return _loads(elf.file_program_headers(f))


def _load_bias(loads: list[tuple[int, int, int]] | None, first: MappingLike) -> int | None:
    """The load bias of `path` given its mapping with the lowest file offset.

    The loader maps each PT_LOAD at bias + page_down(p_vaddr), from file offset
    page_down(p_offset).  So the mapping of file offset `o`, inside some PT_LOAD,
    starts at bias + page_down(p_vaddr) + (o - page_down(p_offset)).  For a PIE
    or a shared library the first PT_LOAD has p_vaddr 0 and the bias is the
    start of the offset-0 mapping; for a non-PIE executable p_vaddr is
    e.g. 0x400000, where it was mapped, and the bias is 0.
    """
    if loads is None:
        return None
    for p_offset, p_vaddr, p_filesz in loads:
        lo = p_offset & ~(_PAGE - 1)
        if lo <= first.offset < max(p_offset + p_filesz, lo + _PAGE):
            return first.start - ((p_vaddr & ~(_PAGE - 1)) + first.offset - lo)
    return None


Read = Callable[[int, int], bytes]  # read(addr, n) of the process's memory; raises on failure


def _image_reader(read: Read, first: MappingLike) -> Read:
    """read(file offset, n) of a module's image through the memory of its
    offset-0 mapping (never past that mapping's end)."""
    def image(offset: int, n: int) -> bytes:
        if offset < 0 or first.start + offset + n > first.end:
            raise ValueError(f"file offset {offset:#x} is past the mapping at {first.start:#x}")
        return read(first.start + offset, n)

    return image


def _image_headers(image: Read, phdrs) -> bytes | None:
    """The ELF header and program headers of an image, as bytes (what the
    process had, compared with a file when there is no build-id)."""
    try:
        head = image(0, elf.EHDR_SIZE)
        ehdr = elf.parse_at(elf.Elf64_Ehdr, head, 0, "ELF header")
        return head + image(ehdr.e_phoff, ehdr.e_phentsize * len(phdrs))
    except (ValueError, OSError, ForensicsError):
        return None


def modules_from_mappings(mappings: Iterable[MappingLike], read: Read | None = None,
                          sysroot: str | None = None) -> list[Module]:
    """Group file mappings (Core.mappings, live.read_maps(pid)) into modules.

    Consecutive mappings of one path form one module; a path mapped again from
    file offset 0 starts a new one (the same file loaded twice).  With
    ``read`` (the process's memory: a core's, a live process's), each
    module's build-id, ELF headers and load bias come from the first page of
    its offset-0 mapping - what the process really had.  Otherwise (or when
    that page is not there) the bias comes from the file's program headers
    (under ``sysroot``, see _load_bias); for a file that is missing, deleted
    or not ELF, it is ``start - offset`` of its first mapping, which is right
    for PIEs and shared libraries (first PT_LOAD at vaddr 0).
    """
    groups: list[list[MappingLike]] = []
    files = (m for m in mappings if m.path and m.path.startswith("/"))  # not [heap], [vdso] ...
    for m in sorted(files, key=lambda m: m.start):
        last = groups[-1][-1] if groups else None
        if last is not None and last.path == m.path and m.offset != 0:
            groups[-1].append(m)
        else:
            groups.append([m])
    modules = []
    for group in groups:
        raw_path = group[0].path
        deleted = raw_path.endswith(_DELETED)
        path = raw_path[: -len(_DELETED)] if deleted else raw_path
        first = min(group, key=lambda m: m.offset)
        build_id = headers = bias = None
        if read is not None and first.offset == 0:
            image = _image_reader(read, first)
            phdrs = elf.image_program_headers(image)
            if phdrs:
                build_id = elf.image_build_id(image)
                headers = _image_headers(image, phdrs)
                bias = _load_bias(_loads(phdrs), first)
        if bias is None and not deleted:
            bias = _load_bias(_load_segments(in_sysroot(path, sysroot)), first)
        if bias is None:
            bias = first.start - first.offset
        modules.append(Module(path, group[0].start, max(m.end for m in group), bias, deleted,
                              build_id, headers))
    return modules


def in_sysroot(path: str, sysroot: str | None) -> str:
    """Where the file a process had at ``path`` is here: under ``sysroot``
    (the other machine's root, for a core from there), else at path."""
    return os.path.join(sysroot, path.lstrip("/")) if sysroot else path


# -- symbol lookups ----------------------------------------------------------


@dataclass(frozen=True)
class _Sym:
    """What a module says about one address (module-relative): the physical
    function, with the line executed in it, and the inlined calls there."""

    function: str | None
    file: str | None
    line: int | None
    start: int | None  # module-relative start of the function's symbol
    inlines: tuple[tuple[str | None, str | None, int | None], ...] = ()  # innermost first

    def inlines_json(self) -> str | None:
        return json.dumps([list(i) for i in self.inlines]) if self.inlines else None


def _sym_from_row(function, file, line, start, inlines) -> _Sym:
    chain: tuple = ()
    if inlines:
        try:
            chain = tuple((f, p, n) for f, p, n in json.loads(inlines))
        except (ValueError, TypeError):
            chain = ()
    return _Sym(function, file, line, start, chain)


def _chain_sym(levels: list[tuple[str | None, str | None, int | None]], start: int | None) -> _Sym:
    """A _Sym from a tool's levels at one address, innermost first: the last
    is the physical function, the others are inlined into it."""
    if not levels:
        return _NOTHING
    function, file, line = levels[-1]
    return _Sym(function, file, line, start, tuple(levels[:-1]))


_NOTHING = _Sym(None, None, None, None)


def _tool_run(argv: list[str], stdin: str) -> str | None:
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=TOOL_TIMEOUT,
            errors="surrogateescape",
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


_COLD_PART = re.compile(r"\.cold(?:\.\d+)?$")


def _whole_function(name: str | None) -> str | None:
    """The function a name from the symbol table belongs to: gcc moves a
    function's unlikely code into a part of its own, "f.cold", which the
    debug information (and gdb) call f.  llvm-symbolizer's linkage names
    keep the part's symbol."""
    return _COLD_PART.sub("", name) if name else None


def _llvm_symbolizer(exe: str, path: str, addrs: Sequence[int],
                     debug_dirs: Sequence[str] = ()) -> dict[int, _Sym]:
    out = _tool_run(
        [exe, "--inlines", "--demangle", "--functions=linkage", "--output-style=JSON",
         *(f"--debug-file-directory={d}" for d in debug_dirs), f"--obj={path}"],
        "".join(f"{a:#x}\n" for a in addrs),
    )
    result: dict[int, _Sym] = {}
    for line in (out or "").splitlines():
        try:
            rec = json.loads(line)
            addr = int(rec["Address"], 16)
            syms = [s for s in rec.get("Symbol") or [] if isinstance(s, dict)]
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if not syms:
            result[addr] = _NOTHING
            continue
        # innermost first; only the physical function (the last) has a start
        start = syms[-1].get("StartAddress") or ""
        try:
            start_addr = int(start, 16) if start else None
        except ValueError:
            start_addr = None
        levels = [(_whole_function(s.get("FunctionName")), s.get("FileName") or None, s.get("Line") or None)
                  for s in syms]
        result[addr] = _chain_sym(levels, start_addr)
    return result


_A2L_FILE_LINE = re.compile(r"^(.*):(\d+|\?)(?: \(discriminator \d+\))?$")


_A2L_ADDRESS = re.compile(r"^0x[0-9a-f]{16}$")


def _addr2line(exe: str, path: str, addrs: Sequence[int]) -> dict[int, _Sym]:
    out = _tool_run([exe, "-a", "-f", "-i", "-C", "-e", path], "".join(f"{a:#x}\n" for a in addrs))
    lines = (out or "").splitlines()
    result: dict[int, _Sym] = {}
    # -a -i: the address, then a (function, file:line) pair per level,
    # innermost first, until the next address
    i = 0
    while i < len(lines):
        if not _A2L_ADDRESS.match(lines[i]):
            break  # out of step: keep what parsed, the rest falls back
        addr = int(lines[i], 16)
        i += 1
        levels = []
        while i + 1 < len(lines) and not _A2L_ADDRESS.match(lines[i]):
            function = lines[i] if lines[i] != "??" else None
            m = _A2L_FILE_LINE.match(lines[i + 1])
            file = m.group(1) if m and m.group(1) != "??" else None
            line = int(m.group(2)) if m and file and m.group(2) != "?" and m.group(2) != "0" else None
            levels.append((function, file, line))
            i += 2
        result[addr] = _chain_sym(levels, None)
    return result


def _elf_symbols(path: str, types: tuple[str, ...]) -> tuple[list, list]:
    """([(value, size, name)] of the symbols of these types that have a
    value (.symtab and .dynsym), [(start, end, name)] of the allocated
    sections) of the ELF file at path; both empty when it cannot be read."""
    from elftools.common.exceptions import ELFError  # deferred, start-up time: pyelftools
    from elftools.elf.elffile import ELFFile  # deferred, start-up time: pyelftools
    from elftools.elf.sections import SymbolTableSection  # deferred, start-up time: pyelftools

    symbols: list[tuple[int, int, str]] = []
    sections: list[tuple[int, int, str]] = []
    f = open_regular(path)
    if f is None:
        return symbols, sections
    with f:
        try:
            for sec in ELFFile(f).iter_sections():
                if sec["sh_flags"] & 2 and sec["sh_size"] and sec["sh_addr"]:  # SHF_ALLOC
                    sections.append((sec["sh_addr"], sec["sh_addr"] + sec["sh_size"], sec.name))
                if isinstance(sec, SymbolTableSection):
                    symbols += [(sym["st_value"], sym["st_size"], sym.name) for sym in sec.iter_symbols()
                                if sym["st_info"]["type"] in types and sym["st_value"]]
        except (OSError, ELFError):
            return [], []
    return symbols, sections


class _SymbolTable:
    """Function symbols of one file (.symtab and .dynsym), for symbol starts."""

    def __init__(self, path: str) -> None:
        spans: dict[int, int] = {}
        for v, size, _ in _elf_symbols(path, ("STT_FUNC", "STT_GNU_IFUNC"))[0]:
            spans[v] = max(spans.get(v, 0), size)
        self.starts = sorted(spans)
        self.sizes = [spans[s] for s in self.starts]

    def start_of(self, addr: int) -> int | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        if self.sizes[i] and addr >= self.starts[i] + self.sizes[i]:
            return None
        return self.starts[i]


@dataclass(frozen=True)
class _Contents:
    """What an ELF file holds for naming code: a symbol table (.symtab),
    debug information (.debug_info with contents), and its .gnu_debuglink
    (the separate debug file's name and the CRC-32 of that file), if any."""

    symtab: bool
    dwarf: bool
    debuglink: tuple[str, int] | None


def _elf_contents(path: str) -> _Contents | None:
    """The _Contents of the ELF file at path (from its section headers:
    forensics.core.elf.file_section_headers); None when it cannot be read."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            sections = elf.file_section_headers(f)
            if sections is None:
                return None
            symtab = dwarf = False
            debuglink = None
            for name, sh_type, offset, size, entsize in sections:
                if sh_type == elf.SHT_SYMTAB and size > entsize:
                    symtab = True  # more than the null symbol
                elif name in (b".debug_info", b".zdebug_info") and sh_type != elf.SHT_NOBITS:
                    dwarf = size > 0
                elif name == b".gnu_debuglink" and sh_type != elf.SHT_NOBITS:
                    f.seek(offset)
                    data = f.read(min(size, 4096))
                    end = data.find(b"\0")
                    crc_at = (end + 4) & ~3  # the name, its NUL, padding to 4, then the CRC
                    if end > 0 and len(data) >= crc_at + 4:
                        link = data[:end].decode("utf-8", "surrogateescape")
                        if "/" not in link:
                            debuglink = (link, int.from_bytes(data[crc_at:crc_at + 4], "little"))
        except (OSError, ValueError):
            return None
    return _Contents(symtab, dwarf, debuglink)


def _file_crc32(path: str) -> int | None:
    """The CRC-32 (zlib's, as .gnu_debuglink records it) of the file at path."""
    f = open_regular(path)
    if f is None:
        return None
    crc = 0
    with f:
        try:
            while chunk := f.read(1 << 20):
                crc = zlib.crc32(chunk, crc)
        except OSError:
            return None
    return crc


@dataclass(frozen=True)
class _Identity:
    """A readable ELF file as it is now."""

    mtime_ns: int
    size: int
    build_id: bytes | None
    headers: bytes | None  # its ELF and program headers, as Module.headers


def _elf_identity(path: str) -> _Identity | None:
    """The identity of a regular, readable 64-bit ELF file at path, else None."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            st = os.fstat(f.fileno())
        except OSError:
            return None
        read = elf.file_reader(f)
        phdrs = elf.image_program_headers(read)
        if not phdrs:
            return None
        return _Identity(st.st_mtime_ns, st.st_size, elf.image_build_id(read), _image_headers(read, phdrs))


@dataclass(frozen=True)
class DataSymbol:
    """What a module's own file says about an address in its data: the
    object symbol holding it (None when none does) and the section."""

    name: str | None  # the symbol (demangled as the file spells it: no demangling)
    offset: int  # address - the symbol's start (or the section's, without a symbol)
    section: str | None  # ".data", ".bss", ".rodata" ...
    module: str  # the module's path, as the process had it

    @property
    def label(self) -> str:
        """"kv_inst+8", "kv_inst", or ".bss+0x40" without a symbol."""
        base = self.name or self.section or "?"
        if self.offset == 0:
            return base
        return f"{base}+{self.offset}" if self.name else f"{base}+{self.offset:#x}"


class _DataTable:
    """Object symbols (STT_OBJECT, STT_COMMON) and allocated sections of one
    file, for naming data addresses."""

    def __init__(self, path: str) -> None:
        spans: dict[int, tuple[int, str]] = {}
        symbols, sections = _elf_symbols(path, ("STT_OBJECT", "STT_COMMON"))
        for v, size, name in symbols:
            if name and size >= spans.get(v, (0, ""))[0]:
                spans[v] = (size, name)
        self.sections = sorted(sections)
        self.starts = sorted(spans)
        self.spans = [spans[v] for v in self.starts]

    def lookup(self, vaddr: int) -> tuple[str | None, int, str | None] | None:
        section = next((name for lo, hi, name in self.sections if lo <= vaddr < hi), None)
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i >= 0:
            size, name = self.spans[i]
            if vaddr < self.starts[i] + max(size, 1):
                return name, vaddr - self.starts[i], section
        if section is None:
            return None
        lo = next(lo for lo, hi, name in self.sections if lo <= vaddr < hi)
        return None, vaddr - lo, section


# -- the symbolizer ------------------------------------------------------------


DEFAULT_DEBUG_DIR = "/usr/lib/debug"


@dataclass(frozen=True)
class SymbolOptions:
    """Where the files of a core's modules are: ``debug_dirs`` searched by
    build-id before /usr/lib/debug (``--debug-dir``), and ``sysroot``, the
    root the process's paths are under here (``--sysroot``: a core from
    another machine)."""

    debug_dirs: tuple[str, ...] = ()
    sysroot: str | None = None


@dataclass(frozen=True)
class _Source:
    """The file a module's addresses are looked up in, and its identity: the
    cache key, so entries made from one file never answer for another."""

    path: str  # the file names are looked up in: the module's own, or its debug file
    key: str  # JSON: [path, mtime_ns, size, build-id, the debug dirs searched]
    image: str = ""  # the file whose bytes the process mapped, for its code (path when "")

    @property
    def code(self) -> str:
        """The file to read the module's code from (a debug file has none)."""
        return self.image or self.path


class Symbolizer:
    """Batched, cached (pc, kind) -> SymbolFrame for a fixed set of modules.

    ``tool``: "llvm-symbolizer" or "addr2line" (default: the first on PATH, in
    that order).  Raises InputError if neither is installed.

    Which file answers for a module: the file at its path (under
    ``sysroot``), when its build-id is the one the process had
    (``Module.build_id``; without one, when its ELF and program headers are);
    else a file with that build-id in the debug directories - each of
    ``debug_dirs``, then /usr/lib/debug (under ``sysroot`` too) - as
    ``.build-id/xx/rest.debug``, ``xx/rest.debug``, or the module's own file
    name.  With none, the module's frames keep module+offset and
    ``warnings`` says why, once per module: a rebuilt binary never names a
    frame.

    When the file chosen has no symbol table or no debug information (a
    stripped binary, as distributions ship them), its separate debug file
    answers instead: the file with its build-id in the debug directories
    (``.build-id/xx/rest.debug``: Debian's -dbgsym layout), else the file
    its ``.gnu_debuglink`` names, beside it, in ``.debug/`` beside it, or
    under a debug directory at the module's directory, with the CRC-32 the
    link records, else - with DEBUGINFOD_URLS set - the one a debuginfod
    server has for its build-id (forensics.reader.debuginfod: cached as
    elfutils caches, one warning when a server does not answer).  The
    debug file has the same addresses; the code is still
    read from the module's file (``_Source.code``), and llvm-symbolizer is
    asked about the module's file first, so that functions keep the names
    the file exports (see _lookup).  Without one, the
    stripped file answers what it can (.dynsym names, else module+offset).
    """

    def __init__(self, modules: Iterable[Module], *, cache_dir: os.PathLike | str | None = None,
                 tool: str | None = None, debug_dirs: Sequence[str] = (),
                 sysroot: str | None = None) -> None:
        self.modules = sorted(modules, key=lambda m: m.start)
        self._starts = [m.start for m in self.modules]
        names = [tool] if tool else ["llvm-symbolizer", "addr2line"]
        for name in names:
            exe = shutil.which(name)
            if exe:
                self.tool, self._exe = name, exe
                break
        else:
            raise InputError(
                f"cannot symbolise: {' or '.join(names)} not found on PATH; install llvm or binutils"
            )
        if self.tool not in ("llvm-symbolizer", "addr2line"):
            raise ValueError(f"unknown symbolizer tool {self.tool!r}")
        self.sysroot = sysroot
        system = in_sysroot(DEFAULT_DEBUG_DIR, sysroot)
        self.debug_dirs = [os.fspath(d) for d in debug_dirs] + [system]
        if sysroot:
            self.debug_dirs.append(DEFAULT_DEBUG_DIR)
        self.warnings: list[str] = []
        # debuginfod servers (DEBUGINFOD_URLS): after every local place
        self._debuginfod = Client(self.warnings) if urls() else None
        self._memo: dict[tuple[str, int], _Sym] = {}
        self._sources: dict[Module, _Source | None] = {}
        self._symtabs: dict[str, _SymbolTable] = {}
        self._datatabs: dict[str, _DataTable] = {}
        self._db: sqlite3.Connection | None = None
        if cache_dir is not None:
            self._db = self._open_cache(Path(cache_dir))

    # -- cache ---------------------------------------------------------------

    def _open_cache(self, cache_dir: Path) -> sqlite3.Connection | None:
        """The on-disk cache, or None (memory only) when it cannot be used: an
        unwritable state dir, a damaged or locked file must not stop an answer."""

        try:
            ensure_private_dir(cache_dir)
            path = cache_dir / "symbols.sqlite"
            create_private(path)
            db = sqlite3.connect(path, timeout=1.0)
            # sym3: `source` is _Source.key - the file's path, mtime, size and
            # build-id (and the debug dirs searched), so a rebuilt file never
            # answers from the entries of the one it replaced; rows carry the
            # inlined calls (JSON, innermost first)
            db.execute(
                "CREATE TABLE IF NOT EXISTS sym3 (tool TEXT, source TEXT, addr INTEGER,"
                " function TEXT, file TEXT, line INTEGER, start INTEGER, inlines TEXT,"
                " PRIMARY KEY (tool, source, addr))"
            )
            return db
        except (OSError, sqlite3.Error, ForensicsError):
            return None

    # -- which file ------------------------------------------------------------

    def source(self, module: Module) -> _Source | None:
        """The file module's addresses are looked up in (see the class), or
        None (with a warning) when there is none that is certainly its."""
        if module not in self._sources:
            self._sources[module] = self._choose(module)
        return self._sources[module]

    def _choose(self, module: Module) -> _Source | None:
        local = module.file or in_sysroot(module.path, self.sysroot)
        want = module.build_id
        found = _elf_identity(local)
        problem = None
        if found is None:
            problem = (f"{local} is missing or not a readable ELF file" if not module.deleted
                       else f"{module.path} was deleted or replaced after the process loaded it")
        elif want is not None and found.build_id != want:
            have = found.build_id.hex() if found.build_id else "none"
            problem = (f"{local} is not the file the process ran "
                       f"(build-id {have}, the process had {want.hex()})")
        elif want is None and module.headers is not None and found.headers != module.headers:
            problem = f"{local} is not the file the process ran (its ELF headers differ)"
        elif want is None and module.deleted:
            problem = f"{module.path} was deleted or replaced after the process loaded it"
        if problem is None:
            return self._with_debug_file(module, local, found)
        if want is not None:
            for path in self._debug_candidates(module, want):
                other = _elf_identity(path)
                if other is not None and other.build_id == want:
                    return self._with_debug_file(module, path, other)
        hint = (f"; give --debug-dir DIR holding a file with build-id {want.hex()}" if want is not None
                else "")
        self.warnings.append(f"{module.path}: {problem}; its frames are shown as module+offset{hint}")
        return None

    def _debug_candidates(self, module: Module, build_id: bytes) -> Iterable[str]:
        hexid = build_id.hex()
        name = os.path.basename(module.path)
        for d in self.debug_dirs:
            yield os.path.join(d, ".build-id", hexid[:2], hexid[2:] + ".debug")
            yield os.path.join(d, hexid[:2], hexid[2:] + ".debug")
            yield os.path.join(d, name)
            yield os.path.join(d, name + ".debug")

    def _with_debug_file(self, module: Module, path: str, ident: _Identity) -> _Source:
        """The source for a module whose file is path (its build-id checked):
        that file itself, or - when it has no symbol table or no debug
        information (stripped, as distributions ship) - its separate debug
        file, found as the class says, with the code still read from path."""
        contents = _elf_contents(path)
        if contents is None or (contents.symtab and contents.dwarf):
            return self._source(path, ident)
        found = self._separate_debug_file(module, path, ident, contents)
        if found is None:
            return self._source(path, ident)
        debug, debug_ident = found
        return self._source(debug, debug_ident, image=path)

    def _separate_debug_file(self, module: Module, path: str, ident: _Identity,
                             contents: _Contents) -> tuple[str, _Identity] | None:
        """The debug file of the ELF file at path (see _with_debug_file):
        by its build-id in the debug directories, then by its
        .gnu_debuglink (the name beside it, in .debug/ beside it, and under
        each debug directory at the module's own directory), only when the
        CRC-32 matches.  It must hold a symbol table or debug information."""
        def usable(candidate: str) -> _Identity | None:
            try:
                if os.path.samefile(candidate, path):
                    return None
            except OSError:
                return None
            other = _elf_identity(candidate)
            if other is None or (ident.build_id is not None and other.build_id not in (None, ident.build_id)):
                return None
            more = _elf_contents(candidate)
            return other if more is not None and (more.symtab or more.dwarf) else None

        if ident.build_id is not None:
            hexid = ident.build_id.hex()
            for d in self.debug_dirs:
                for candidate in (os.path.join(d, ".build-id", hexid[:2], hexid[2:] + ".debug"),
                                  os.path.join(d, hexid[:2], hexid[2:] + ".debug")):
                    other = usable(candidate)
                    if other is not None and other.build_id == ident.build_id:
                        return candidate, other
        if contents.debuglink is not None:
            name, crc = contents.debuglink
            here = os.path.dirname(path)
            beside = os.path.dirname(module.path).lstrip("/")
            for candidate in (os.path.join(here, name), os.path.join(here, ".debug", name),
                              *(os.path.join(d, beside, name) for d in self.debug_dirs)):
                other = usable(candidate)
                if other is not None and _file_crc32(candidate) == crc:
                    return candidate, other
        if ident.build_id is not None and self._debuginfod is not None:
            # last: a debuginfod server (DEBUGINFOD_URLS), by build-id
            fetched = self._debuginfod.debuginfo(ident.build_id, usable)
            other = usable(fetched) if fetched is not None else None
            if other is not None and other.build_id == ident.build_id:
                return fetched, other
        return None

    def _source(self, path: str, ident: _Identity, image: str = "") -> _Source:
        key = [path, ident.mtime_ns, ident.size, ident.build_id.hex() if ident.build_id else None,
               self.debug_dirs if self.tool == "llvm-symbolizer" else []]
        if image:
            key.append(image)  # a debug file answers with the module's file (see _lookup)
        return _Source(path, json.dumps(key), image)

    def _cached(self, source: _Source, rels: Iterable[int]) -> dict[int, _Sym]:
        found = {}
        missing = []
        for rel in rels:
            sym = self._memo.get((source.key, rel))
            if sym is not None:
                found[rel] = sym
            else:
                missing.append(rel)
        if self._db is not None and missing:
            q = "SELECT function, file, line, start, inlines FROM sym3 WHERE tool=? AND source=? AND addr=?"
            try:
                for rel in missing:
                    row = self._db.execute(q, (self.tool, source.key, rel)).fetchone()
                    if row is not None:
                        found[rel] = self._memo[(source.key, rel)] = _sym_from_row(*row)
            except sqlite3.Error:
                self._db = None  # damaged or locked: go on from memory
        return found

    def _store(self, source: _Source, syms: dict[int, _Sym]) -> None:
        for rel, sym in syms.items():
            self._memo[(source.key, rel)] = sym
        if self._db is not None and syms:
            try:
                with self._db:
                    self._db.executemany(
                        "INSERT OR REPLACE INTO sym3 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [(self.tool, source.key, rel, s.function, s.file, s.line, s.start, s.inlines_json())
                         for rel, s in syms.items()],
                    )
            except sqlite3.Error:
                self._db = None  # damaged or locked: go on from memory

    # -- lookups -------------------------------------------------------------

    def data_symbol(self, module_path: str, addr: int) -> DataSymbol | None:
        """The symbol (or section) of module_path's file that holds data
        address addr (its .data, or its .bss after the file's mappings); None
        when the module is unknown, its file is not certainly the one the
        process had (see source), or nothing of the file holds addr."""
        modules = [m for m in self.modules if m.path == module_path and m.start <= addr]
        if not modules:
            return None
        module = modules[-1]
        source = self.source(module)
        if source is None:
            return None
        table = self._datatabs.get(source.path)
        if table is None:
            table = self._datatabs[source.path] = _DataTable(source.path)
        found = table.lookup(addr - module.load_bias)
        if found is None:
            return None
        name, offset, section = found
        return DataSymbol(name, offset, section, module.path)

    def module_at(self, pc: int) -> Module | None:
        """The module whose mappings span pc, or None."""
        i = bisect.bisect_right(self._starts, pc) - 1
        if i >= 0 and pc in self.modules[i]:
            return self.modules[i]
        return None

    def _lookup(self, source: _Source, rels: list[int]) -> dict[int, _Sym]:
        """One subprocess for all of one module's addresses (two for a
        stripped module with a debug file, under llvm-symbolizer: see below)."""
        path = source.path
        if self.tool == "llvm-symbolizer" and source.code != path:
            # The module's file first: llvm-symbolizer reads the same debug
            # file's DWARF (found in the same directories) and names
            # functions as the file exports them ("printf", where the debug
            # file's symbol table says "_IO_printf" at that address); the
            # debug file itself then names what that left unnamed (_start,
            # code without DWARF that is not exported).
            got = _llvm_symbolizer(self._exe, source.code, rels, self.debug_dirs)
            unnamed = [rel for rel in rels if rel not in got or not got[rel].function]
            if unnamed:
                more = _llvm_symbolizer(self._exe, path, unnamed, self.debug_dirs)
                got.update({rel: sym for rel, sym in more.items() if sym.function or rel not in got})
        elif self.tool == "llvm-symbolizer":
            got = _llvm_symbolizer(self._exe, path, rels, self.debug_dirs)
        else:
            got = _addr2line(self._exe, path, rels)
            if any(s.function for s in got.values()):
                table = self._symtabs.get(path)
                if table is None:
                    table = self._symtabs[path] = _SymbolTable(path)
                got = {a: _Sym(s.function, s.file, s.line, table.start_of(a) if s.function else None,
                               s.inlines)
                       for a, s in got.items()}
        # Only what the tool answered: a failed or timed-out run is not cached
        # (the frames get module+offset now and another try next time).
        return {rel: got[rel] for rel in rels if rel in got}

    def symbolize(self, pcs: Sequence[tuple[int, int]]) -> list[SymbolFrame]:
        """One SymbolFrame per (pc, kind), in order; see the module docstring."""
        frames: list[SymbolFrame | None] = [None] * len(pcs)
        todo: dict[Module, dict[int, list[int]]] = {}  # module -> rel -> indexes
        for i, (pc, kind) in enumerate(pcs):
            if kind == FRAME_CALL:
                look = pc - 1
            elif kind in (FRAME_ENTRY, FRAME_SIGNAL):
                look = pc
            elif kind == TAG_FRAME_LOST:
                frames[i] = SymbolFrame(pc, LOST_FRAMES, None, None, None)
                continue
            else:
                raise ValueError(f"unknown frame kind {kind} for pc {pc:#x}")
            module = self.module_at(look)
            if module is None:
                frames[i] = SymbolFrame(pc, None, None, None, None)
                continue
            todo.setdefault(module, {}).setdefault(look - module.load_bias, []).append(i)

        for module, by_rel in todo.items():
            source = self.source(module)
            if source is None:
                syms: dict[int, _Sym] = {}
            else:
                syms = self._cached(source, by_rel)
                wanted = sorted(rel for rel in by_rel if rel not in syms)
                if wanted:
                    fresh = self._lookup(source, wanted)
                    self._store(source, fresh)
                    syms.update(fresh)
            for rel, indexes in by_rel.items():
                sym = syms.get(rel, _NOTHING)
                for i in indexes:
                    pc = pcs[i][0]
                    mod_off = pc - module.load_bias
                    frames[i] = SymbolFrame(
                        pc, sym.function, sym.file, sym.line, module.path,
                        offset=mod_off - sym.start if sym.function and sym.start is not None else None,
                        module_offset=mod_off,
                        inlined_calls=tuple(Frame(pc, f, p, n, module.path, inlined=True)
                                            for f, p, n in sym.inlines),
                    )
        return frames  # type: ignore[return-value]  # every slot was filled

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> Symbolizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- libtag stacks ---------------------------------------------------------------


def merge_entry_frames(frames: Sequence[Frame], kinds: Sequence[int]) -> list[Frame]:
    """Drop the ENTRY frames that repeat the CALL frame just inside them.

    A libtag stack, innermost first, is [CALL pc in the function that called
    malloc, ENTRY of the innermost instrumented function, CALL sites of its
    callers ...].  When that ENTRY names the function the CALL frame is in -
    the physical function or one inlined there (-finstrument-functions calls
    the hooks for inlined functions too) - they are one frame and the ENTRY
    goes.  When they differ (malloc was called from uninstrumented code -
    operator new, strdup - called from the instrumented function), both
    stay: the ENTRY frame is the instrumented caller.  An ENTRY with no CALL
    just inside it, or with an unknown function on either side, stays.  (A
    SIGNAL frame - an exact pc, where a thread's unwound stack ends and its
    shadow stack goes on - counts as a CALL here.)

    An ENTRY frame that stays keeps its function and file but no line: its
    address is the function's first instruction, whose line is the
    function's opening line, never the line being executed in it (which
    the stack does not record).  Nothing else is ever dropped.
    """
    if len(frames) != len(kinds):
        raise ValueError(f"{len(frames)} frames but {len(kinds)} kinds")
    out: list[Frame] = []
    for i, (frame, kind) in enumerate(zip(frames, kinds)):
        if (kind == FRAME_ENTRY and i > 0 and kinds[i - 1] in (FRAME_CALL, FRAME_SIGNAL)
                and frame.function is not None):
            inside = frames[i - 1]
            names = {(f.function, f.module) for f in (inside, *getattr(inside, "inlined_calls", ()))}
            if (frame.function, frame.module) in names:
                continue
        if kind == FRAME_ENTRY and frame.line is not None:
            frame = replace(frame, line=None)
        out.append(frame)
    return out


def expand_inlines(frames: Sequence[Frame]) -> list[Frame]:
    """Each frame preceded by the calls inlined at its address (a
    SymbolFrame's ``inlined_calls``), innermost first, as gdb's bt shows
    them: the inlined functions (``inlined=True``), then the physical one."""
    out: list[Frame] = []
    for frame in frames:
        out.extend(getattr(frame, "inlined_calls", ()))
        out.append(frame)
    return out
