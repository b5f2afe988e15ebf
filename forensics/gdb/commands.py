"""The ``tag`` commands inside gdb: a memory reader backed by gdb, and nothing else.

Loaded by ``forensics/gdb/forensics_gdb.py`` (the file a user ``source``s),
which puts this package on gdb's ``sys.path`` and calls :func:`register`::

    tag whoowns [--json] EXPR   the block, state, threads, stacks and referrers
    tag block [--json] EXPR     the tagged block holding EXPR (no referrer scan)
    tag inspect [--json] [--top N]
                                the heap, the anomaly or crash, the top stacks
    tag leaks [--json]          blocks nothing reachable points to

EXPR is any gdb expression (``0x55..``, ``ptr``, ``$rdi``, ``s->name + 4``).

Where the answers come from (STYLE: "the gdb scripts are a thin adapter that
gives heap.py a memory reader backed by gdb; no logic lives there"):

- gdb has a core open (``core-file CORE``, ``gdb EXE CORE``): the core file is
  opened with ``forensics.reader.dump.Dump.open`` exactly as the command line
  does, so both answer from the same bytes with the same index cache beside
  the core - and say the same thing.
- gdb runs or is attached to a live process: :class:`GdbMemory` implements
  ``forensics.reader.memory.Memory`` over ``Inferior.read_memory`` and ``info proc
  mappings``; the process is stopped while gdb shows its prompt, so the heap
  read is consistent.  Its dump is kept until the process runs again.

Every expected failure becomes a ``gdb.GdbError`` with one line (gdb prints it
as ``tag whoowns: ...`` and a batch run exits non-zero); set the environment
variable ``FORENSICS_GDB_DEBUG=1`` before starting gdb for Python tracebacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from functools import cached_property

import gdb  # gdb's embedded module: this file is only imported inside gdb
import numpy as np

from forensics.core.errors import UnmappedError
from forensics.errors import ForensicsError
from forensics.reader.dump import Dump, ThreadStack
from forensics.reader.memory import Region

_CHUNK = 1 << 20  # bytes per read_memory call when loading a region
_PAGE = 4096
_DEBUG = os.environ.get("FORENSICS_GDB_DEBUG") == "1"


# ------------------------------------------------------------------ memory --


class GdbMemory:
    """forensics.reader.memory.Memory of gdb's selected (live, stopped) inferior."""

    def __init__(self, inferior: gdb.Inferior) -> None:
        self.inferior = inferior
        self.pid = int(inferior.pid)
        self.name = f"process {self.pid} (gdb)"
        self.exe = inferior.progspace.filename
        self._regions: list[Region] | None = None

    @property
    def cache_key(self) -> None:
        return None  # a live process changes: never cache its index on disk

    def read(self, addr: int, n: int) -> bytes:
        if n < 0:
            raise ValueError(f"negative read size {n}")
        if n == 0:
            return b""
        try:
            return self.inferior.read_memory(addr, n).tobytes()
        except (gdb.MemoryError, OverflowError, ValueError):
            raise UnmappedError(addr, f"{addr:#x} is not readable in {self.name}") from None

    def regions(self) -> list[Region]:
        if self._regions is None:
            self._regions = _proc_mappings(self)
        return self._regions

    def load(self, start: int, end: int) -> np.ndarray:
        """[start, end) as a uint8 array; pages gdb cannot read stay zero."""
        buf = np.zeros(end - start, dtype=np.uint8)
        cur = start
        while cur < end:
            n = min(_CHUNK, end - cur)
            try:
                buf[cur - start:cur - start + n] = np.frombuffer(
                    self.inferior.read_memory(cur, n), dtype=np.uint8)
                cur += n
            except gdb.MemoryError:
                if n > _PAGE:  # retry this chunk a page at a time
                    for page in range(cur, cur + n, _PAGE):
                        m = min(_PAGE, end - page)
                        try:
                            buf[page - start:page - start + m] = np.frombuffer(
                                self.inferior.read_memory(page, m), dtype=np.uint8)
                        except gdb.MemoryError:
                            pass
                cur += n
        return buf

    def thread_sps(self) -> dict[int, int]:
        """{kernel tid: stack pointer} of every thread gdb knows, now."""
        out: dict[int, int] = {}
        try:
            orig_thread = gdb.selected_thread()
            orig_frame = gdb.selected_frame()
        except gdb.error:
            return out
        try:
            for t in self.inferior.threads():
                lwp = t.ptid[1] or t.ptid[0]
                try:
                    t.switch()
                    out[int(lwp)] = int(gdb.newest_frame().read_register("sp"))
                except gdb.error:
                    continue
        finally:
            try:
                orig_thread.switch()
                orig_frame.select()
            except gdb.error:
                pass
        return out


_MAP_LINE = re.compile(
    r"^\s*(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+\s+0x[0-9a-f]+\s+([rwxsp-]{4})\s*(.*)$")


def _proc_mappings(mem: GdbMemory) -> list[Region]:
    """The readable mappings, from ``info proc mappings`` (gdb >= 12 prints Perms)."""
    try:
        text = gdb.execute("info proc mappings", to_string=True)
    except gdb.error as exc:
        raise ForensicsError(f"gdb cannot list the mappings of {mem.name}: {exc}") from None
    out = []
    for line in text.splitlines():
        m = _MAP_LINE.match(line)
        if m is None:
            continue
        start, end, perms, path = int(m[1], 16), int(m[2], 16), m[3], m[4].strip() or None
        if not perms.startswith("r") or (path and path.startswith(("[vvar", "[vsyscall"))):
            continue
        out.append(Region(start, end, perms[1] == "w", path,
                          load=(lambda s=start, e=end: mem.load(s, e))))
    if not out:
        raise ForensicsError(f"gdb listed no readable mappings of {mem.name} "
                             f"(gdb 12 or newer is needed: 'info proc mappings' must show Perms)")
    out.sort(key=lambda r: r.start)
    return out


class GdbDump(Dump):
    """A Dump of a live inferior: the threads' stack pointers come from gdb's
    registers (a core gives them in its notes; libtag's saved ones are older)."""

    @cached_property
    def threads(self) -> list[ThreadStack]:
        sps = self.mem.thread_sps()
        regions = self.mem.regions()
        out = []
        for t in Dump.threads.func(self):
            sp = sps.get(t.tid, t.sp)
            region = next((r for r in regions if sp is not None and sp in r), t.stack_region)
            out.append(dataclasses.replace(t, sp=sp, stack_region=region))
        return out


# ---------------------------------------------------------------- sources --

_dump: Dump | None = None
_dump_key: tuple | None = None


def _forget(*_args: object) -> None:
    """The inferior ran, exited or changed: its dump is stale."""
    global _dump, _dump_key
    if _dump is not None:
        with contextlib.suppress(Exception):  # closing a stale dump must not fail a command
            _dump.close()
    _dump, _dump_key = None, None


def _core_path() -> str:
    """The core file gdb has open, from ``info target``."""
    text = gdb.execute("info target", to_string=True)
    m = re.search(r"Local core dump file:\s*`(.*)', file type", text)
    if m is None:
        raise ForensicsError("gdb has a core open but 'info target' does not name its file")
    return m[1]


def current_dump() -> Dump:
    """The Dump of what gdb is looking at (kept while it cannot change)."""
    global _dump, _dump_key
    inferior = gdb.selected_inferior()
    conn = inferior.connection
    kind = conn.type if conn is not None else None
    if kind == "core":
        path = os.path.abspath(_core_path())
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ForensicsError(f"cannot read the core gdb has open: {path}: {exc.strerror}") from None
        key = ("core", path, st.st_size, st.st_mtime_ns)
    elif kind == "native" and inferior.pid > 0:
        key = ("live", inferior.num, inferior.pid)
    elif inferior.pid > 0:
        raise ForensicsError(f"the tag commands read a core or a native process, not a "
                             f"{conn.description if conn else 'target'} (use gcore, then core-file)")
    else:
        raise ForensicsError("no process and no core: open a core (core-file CORE), "
                             "run the program, or attach PID")
    if _dump is not None and _dump_key == key:
        return _dump
    _forget()
    if kind == "core":
        dump = Dump.open(path)
    else:
        dump = GdbDump(GdbMemory(inferior))
    _dump, _dump_key = dump, key
    return dump


# --------------------------------------------------------------- commands --


def _address(expr: str) -> int:
    """An address from a gdb expression: 0x.., decimal, a pointer, $reg, ..."""
    if not expr.strip():
        raise ForensicsError("an address is needed: an expression such as 0x55d0c0a012a0, ptr or $rdi")
    try:
        value = gdb.parse_and_eval(expr)
        if value.type.strip_typedefs().code == gdb.TYPE_CODE_ARRAY:
            value = value.address
        return int(value) & 0xFFFFFFFFFFFFFFFF
    except gdb.error as exc:
        raise ForensicsError(f"not an address: {expr}: {exc}") from None


def _options(arg: str, flags: tuple[str, ...], valued: tuple[str, ...] = ()) -> tuple[dict, str]:
    """Leading --options of arg, and the rest of it (an expression, kept whole)."""
    opts: dict = {}
    rest = arg.strip()
    while rest.startswith("--"):
        word, _, after = rest.partition(" ")
        name, eq, value = word.partition("=")
        if name in flags and not eq:
            opts[name] = True
        elif name in valued:
            if not eq:
                value, _, after = after.strip().partition(" ")
            if not value:
                raise ForensicsError(f"{name} needs a value")
            opts[name] = value
        else:
            known = " ".join(flags + tuple(f"{v} N" for v in valued))
            raise ForensicsError(f"unknown option {word} (options: {known})")
        rest = after.strip()
    return opts, rest


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


class _TagCommand(gdb.Command):
    """Runs ``self.run(arg)``; turns every failure into a one-line gdb.GdbError."""

    name = ""

    def __init__(self) -> None:
        super().__init__(self.name, gdb.COMMAND_DATA)

    def invoke(self, arg: str, from_tty: bool) -> None:
        self.dont_repeat()
        try:
            self.run(arg)
        except gdb.GdbError:
            raise
        except ForensicsError as exc:
            raise gdb.GdbError(f"{self.name}: {_one_line(exc)}") from None
        except gdb.error as exc:
            raise gdb.GdbError(f"{self.name}: {_one_line(exc)}") from None
        except KeyboardInterrupt:
            raise gdb.GdbError(f"{self.name}: interrupted") from None
        except Exception as exc:  # never a traceback at the gdb prompt
            if _DEBUG:
                raise
            raise gdb.GdbError(f"{self.name}: internal error: {type(exc).__name__}: {_one_line(exc)} "
                               f"(FORENSICS_GDB_DEBUG=1 shows the traceback)") from None

    def run(self, arg: str) -> None:
        raise NotImplementedError


class TagPrefix(gdb.Command):
    """Heap forensics of a libtag process or core: who owns an address, the heap, leaks.

The program must run with libtag (forensics run, or LD_PRELOAD=$(forensics lib-path)).
Works on a core (gdb EXE CORE) and on a live process (run, attach PID).
Same answers as the forensics command on the same core."""

    def __init__(self) -> None:
        super().__init__("tag", gdb.COMMAND_DATA, prefix=True)


class TagWhoowns(_TagCommand):
    """Who owns an address: its block, state, threads, stacks and referrers.

Usage: tag whoowns [--json] EXPR
EXPR is a gdb expression: 0x55d0c0a012a0, ptr, $rdi, s->name + 4.
When no tagged block holds it, says what it is: a thread's stack, a module's
globals, another mapping, or nothing mapped.  --json prints the same document
as forensics whoowns --json."""

    name = "tag whoowns"

    def run(self, arg: str) -> None:
        from forensics.answers import owners
        from forensics.output import text

        opts, expr = _options(arg, ("--json",))
        addr = _address(expr)
        dump = current_dump()
        doc = owners.to_json(dump, owners.whoowns(dump, addr))
        if opts.get("--json"):
            text.print_json(doc)
        else:
            text.show_whoowns(doc)


class TagBlock(_TagCommand):
    """The tagged heap block holding an address: start, size, state, threads, stacks.

Usage: tag block [--json] EXPR
Like tag whoowns without the scan for referrers; an error when no tagged
block holds the address.  --json prints the block as forensics' JSON does."""

    name = "tag block"

    def run(self, arg: str) -> None:
        from forensics.answers import owners
        from forensics.answers.shapes import block_json
        from forensics.output import text

        opts, expr = _options(arg, ("--json",))
        addr = _address(expr)
        dump = current_dump()
        where = owners.classify(dump, addr)
        if where.block is None:
            what = where.region_name or where.owner
            note = where.note or (owners.near_note(where.near) if where.near else "")
            raise ForensicsError(f"{addr:#x} is in no tagged block: {what}" + (f", {note}" if note else ""))
        doc = block_json(where.block, dump.stack, offset=addr - where.block.start)
        if opts.get("--json"):
            text.print_json(doc)
            return
        con = text.out_console()
        con.print(f"[bold]block[/bold] {doc['start']}  {doc['size']} bytes  "
                  f"[bold]{doc['state']}[/bold]  offset {doc['offset']}")
        con.print(text.stack_tree(f"allocated by thread {doc['thread']}", doc["alloc_stack"]))
        if doc["state"] == "freed":
            con.print(text.stack_tree(f"freed by thread {doc['free_thread']}", doc["free_stack"] or []))


class TagInspect(_TagCommand):
    """The heap, the anomaly or crash that caused the core, the top stacks, the threads.

Usage: tag inspect [--json] [--top N]
The same answer as forensics inspect CORE (on a live process: as it is now)."""

    name = "tag inspect"

    def run(self, arg: str) -> None:
        from forensics.answers.inspect import inspect_doc
        from forensics.output import text

        opts, rest = _options(arg, ("--json",), ("--top",))
        if rest:
            raise ForensicsError(f"unexpected argument: {rest} (usage: tag inspect [--json] [--top N])")
        top = opts.get("--top", "10")
        if not top.isdigit() or int(top) < 1:
            raise ForensicsError(f"--top needs a positive number, not {top}")
        doc = inspect_doc(current_dump(), top=int(top))
        if opts.get("--json"):
            text.print_json(doc)
        else:
            text.show_inspect(doc)


class TagLeaks(_TagCommand):
    """Leaked blocks: live blocks that nothing reachable from the roots points to.

Usage: tag leaks [--json]
The same answer as the leaks of forensics inspect --leaks CORE."""

    name = "tag leaks"

    def run(self, arg: str) -> None:
        from forensics.output import text

        opts, rest = _options(arg, ("--json",))
        if rest:
            raise ForensicsError(f"unexpected argument: {rest} (usage: tag leaks [--json])")
        try:
            from forensics.answers.leaks import leaks_json
        except ImportError:
            raise ForensicsError("leaks needs forensics.answers.leaks (not installed)") from None
        leaks = leaks_json(current_dump())
        if opts.get("--json"):
            text.print_json({"leaks": leaks})
            return
        text.show_leaks(leaks)


_registered = False


def register() -> None:
    """Define the tag commands in gdb (once) and forget dumps that go stale."""
    global _registered
    if _registered:
        return
    TagPrefix()
    for cls in (TagWhoowns, TagBlock, TagInspect, TagLeaks):
        cls()
    gdb.events.cont.connect(_forget)
    gdb.events.exited.connect(_forget)
    gdb.events.new_objfile.connect(_forget)
    gdb.events.memory_changed.connect(_forget)
    _registered = True


__all__ = ["GdbMemory", "GdbDump", "current_dump", "register"]
