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
module path, mtime, size and address, so a rebuilt file is never answered
from stale entries.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from forensics.core import elf
from forensics.errors import InputError
from forensics.reader.abi import TAG_FRAME_CALL as FRAME_CALL  # pc is a return address: look up pc - 1
from forensics.reader.abi import TAG_FRAME_ENTRY as FRAME_ENTRY  # pc is an instrumented entry: look up pc
from forensics.reader.abi import TAG_FRAME_SIGNAL as FRAME_SIGNAL  # pc a signal interrupted: look up pc
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
    been deleted or replaced at ``path``; it is never read.
    """

    path: str
    start: int
    end: int
    load_bias: int
    deleted: bool = False

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


def _load_segments(path: str) -> list[tuple[int, int, int]] | None:
    """(p_offset, p_vaddr, p_filesz) of each PT_LOAD of a 64-bit little-endian
    ELF file, or None if it is not one (or cannot be read)."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        phdrs = elf.file_program_headers(f)
    loads = [(p.p_offset, p.p_vaddr, p.p_filesz) for p in phdrs or () if p.p_type == elf.PT_LOAD]
    return loads or None


def _load_bias(path: str, first: MappingLike) -> int | None:
    """The load bias of `path` given its mapping with the lowest file offset.

    The loader maps each PT_LOAD at bias + page_down(p_vaddr), from file offset
    page_down(p_offset).  So the mapping of file offset `o`, inside some PT_LOAD,
    starts at bias + page_down(p_vaddr) + (o - page_down(p_offset)).  For a PIE
    or a shared library the first PT_LOAD has p_vaddr 0 and the bias is the
    start of the offset-0 mapping; for a non-PIE executable p_vaddr is
    e.g. 0x400000, where it was mapped, and the bias is 0.
    """
    loads = _load_segments(path)
    if loads is None:
        return None
    for p_offset, p_vaddr, p_filesz in loads:
        lo = p_offset & ~(_PAGE - 1)
        if lo <= first.offset < max(p_offset + p_filesz, lo + _PAGE):
            return first.start - ((p_vaddr & ~(_PAGE - 1)) + first.offset - lo)
    return None


def modules_from_mappings(mappings: Iterable[MappingLike]) -> list[Module]:
    """Group file mappings (Core.mappings, live.read_maps(pid)) into modules.

    Consecutive mappings of one path form one module; a path mapped again from
    file offset 0 starts a new one (the same file loaded twice).  The bias comes
    from the ELF program headers (see _load_bias); for a file that is missing,
    deleted or not ELF, it is ``start - offset`` of its first mapping, which is
    right for PIEs and shared libraries (first PT_LOAD at vaddr 0).
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
        bias = None if deleted else _load_bias(path, first)
        if bias is None:
            bias = first.start - first.offset
        modules.append(Module(path, group[0].start, max(m.end for m in group), bias, deleted))
    return modules


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


def _llvm_symbolizer(exe: str, path: str, addrs: Sequence[int]) -> dict[int, _Sym]:
    out = _tool_run(
        [exe, "--inlines", "--demangle", "--functions=linkage", "--output-style=JSON", f"--obj={path}"],
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
        levels = [(s.get("FunctionName") or None, s.get("FileName") or None, s.get("Line") or None)
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


class _SymbolTable:
    """Function symbols of one file (.symtab and .dynsym), for symbol starts."""

    def __init__(self, path: str) -> None:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
        from elftools.elf.sections import SymbolTableSection

        spans: dict[int, int] = {}
        f = open_regular(path)
        try:
            if f is None:
                raise OSError(f"{path} is not a regular file")
            with f:
                elf = ELFFile(f)
                for sec in elf.iter_sections():
                    if not isinstance(sec, SymbolTableSection):
                        continue
                    for sym in sec.iter_symbols():
                        if sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC") and sym["st_value"]:
                            v = sym["st_value"]
                            spans[v] = max(spans.get(v, 0), sym["st_size"])
        except (OSError, ELFError):
            pass
        self.starts = sorted(spans)
        self.sizes = [spans[s] for s in self.starts]

    def start_of(self, addr: int) -> int | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        if self.sizes[i] and addr >= self.starts[i] + self.sizes[i]:
            return None
        return self.starts[i]


# -- the symbolizer ------------------------------------------------------------


class Symbolizer:
    """Batched, cached (pc, kind) -> SymbolFrame for a fixed set of modules.

    ``tool``: "llvm-symbolizer" or "addr2line" (default: the first on PATH, in
    that order).  Raises InputError if neither is installed.
    """

    def __init__(self, modules: Iterable[Module], *, cache_dir: os.PathLike | str | None = None,
                 tool: str | None = None) -> None:
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
        self._memo: dict[tuple[str, int, int, int], _Sym] = {}
        self._idents: dict[str, tuple[str, int, int] | None] = {}
        self._symtabs: dict[str, _SymbolTable] = {}
        self._db: sqlite3.Connection | None = None
        if cache_dir is not None:
            self._db = self._open_cache(Path(cache_dir))

    # -- cache ---------------------------------------------------------------

    def _open_cache(self, cache_dir: Path) -> sqlite3.Connection | None:
        """The on-disk cache, or None (memory only) when it cannot be used: an
        unwritable state dir, a damaged or locked file must not stop an answer."""
        from forensics.errors import ForensicsError
        from forensics.files import create_private, ensure_private_dir

        try:
            ensure_private_dir(cache_dir)
            path = cache_dir / "symbols.sqlite"
            create_private(path)
            db = sqlite3.connect(path, timeout=1.0)
            # sym2: rows carry the inlined calls (JSON, innermost first)
            db.execute(
                "CREATE TABLE IF NOT EXISTS sym2 (tool TEXT, path TEXT, mtime_ns INTEGER, size INTEGER,"
                " addr INTEGER, function TEXT, file TEXT, line INTEGER, start INTEGER, inlines TEXT,"
                " PRIMARY KEY (tool, path, mtime_ns, size, addr))"
            )
            return db
        except (OSError, sqlite3.Error, ForensicsError):
            return None

    def _ident(self, module: Module) -> tuple[str, int, int] | None:
        """(path, mtime_ns, size) of a module file that can be read, else None."""
        if module.path not in self._idents:
            ident = None
            if not module.deleted:
                try:
                    st = os.stat(module.path)
                    if (stat.S_ISREG(st.st_mode) and os.access(module.path, os.R_OK)
                            and _load_segments(module.path) is not None):
                        ident = (module.path, st.st_mtime_ns, st.st_size)
                except OSError:
                    pass
            self._idents[module.path] = ident
        return self._idents[module.path]

    def _cached(self, ident: tuple[str, int, int], rels: Iterable[int]) -> dict[int, _Sym]:
        found = {}
        missing = []
        for rel in rels:
            sym = self._memo.get((*ident, rel))
            if sym is not None:
                found[rel] = sym
            else:
                missing.append(rel)
        if self._db is not None and missing:
            q = ("SELECT function, file, line, start, inlines FROM sym2"
                 " WHERE tool=? AND path=? AND mtime_ns=? AND size=? AND addr=?")
            try:
                for rel in missing:
                    row = self._db.execute(q, (self.tool, *ident, rel)).fetchone()
                    if row is not None:
                        found[rel] = self._memo[(*ident, rel)] = _sym_from_row(*row)
            except sqlite3.Error:
                self._db = None  # damaged or locked: go on from memory
        return found

    def _store(self, ident: tuple[str, int, int], syms: dict[int, _Sym]) -> None:
        for rel, sym in syms.items():
            self._memo[(*ident, rel)] = sym
        if self._db is not None and syms:
            try:
                with self._db:
                    self._db.executemany(
                        "INSERT OR REPLACE INTO sym2 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [(self.tool, *ident, rel, s.function, s.file, s.line, s.start, s.inlines_json())
                         for rel, s in syms.items()],
                    )
            except sqlite3.Error:
                self._db = None  # damaged or locked: go on from memory

    # -- lookups -------------------------------------------------------------

    def module_at(self, pc: int) -> Module | None:
        """The module whose mappings span pc, or None."""
        i = bisect.bisect_right(self._starts, pc) - 1
        if i >= 0 and pc in self.modules[i]:
            return self.modules[i]
        return None

    def _lookup(self, path: str, rels: list[int]) -> dict[int, _Sym]:
        """One subprocess for all of one module's addresses."""
        if self.tool == "llvm-symbolizer":
            got = _llvm_symbolizer(self._exe, path, rels)
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
            else:
                raise ValueError(f"unknown frame kind {kind} for pc {pc:#x}")
            module = self.module_at(look)
            if module is None:
                frames[i] = SymbolFrame(pc, None, None, None, None)
                continue
            todo.setdefault(module, {}).setdefault(look - module.load_bias, []).append(i)

        for module, by_rel in todo.items():
            ident = self._ident(module)
            if ident is None:
                syms: dict[int, _Sym] = {}
            else:
                syms = self._cached(ident, by_rel)
                wanted = sorted(rel for rel in by_rel if rel not in syms)
                if wanted:
                    fresh = self._lookup(module.path, wanted)
                    self._store(ident, fresh)
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
