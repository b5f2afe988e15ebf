"""The ``tag`` commands inside gdb: the verbs, with memory and registers read
through gdb.

Loaded by ``forensics/gdb/forensics_gdb.py`` (the file a user ``source``s),
which puts this package on gdb's ``sys.path`` and calls :func:`register`::

    tag whoowns [--json] EXPR   the verb whoowns: block, state, threads, stacks, referrers
    tag block [--json] EXPR     the tagged block holding EXPR (no referrer scan)
    tag inspect [--json] [--leaks] [--top N]
                                the verb inspect: heap, anomaly or crash, top stacks
    tag leaks [--json]          blocks nothing reachable points to

EXPR is any gdb expression (``0x55..``, ``ptr``, ``$rdi``, ``s->name + 4``).

Everything but reading memory and registers is the command line's own: the
arguments are parsed by the verbs' ``add_arguments`` (their gdb form) over
``gdb.string_to_argv``, the answers and their output are the verbs'
``answer``, failures are worded by forensics.cli.main.failure (``-v`` shows
the traceback), and a live process's maps and region loading are
forensics.reader.live's.  What gdb adds:

- gdb has a core open (``core-file CORE``, ``gdb EXE CORE``): the core file is
  opened with ``Dump.open`` exactly as the command line does, so both answer
  from the same bytes with the same index cache beside the core - and say the
  same thing.
- gdb runs or is attached to a live process: :class:`GdbMemory` reads its
  memory with ``Inferior.read_memory`` and the threads' stack pointers from
  gdb's registers; the process is stopped while gdb shows its prompt, so the
  heap read is consistent.  Its dump is kept until the process runs again.

Every failure becomes a ``gdb.GdbError`` with one line (gdb prints it as
``tag whoowns: ...`` and a batch run exits non-zero).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import traceback
from typing import Callable, NoReturn

import gdb  # gdb's embedded module: this file is only imported inside gdb

from forensics.arch import AARCH64, X86_64
from forensics.cli import _args
from forensics.cli import inspect as inspect_verb
from forensics.cli import whoowns as whoowns_verb
from forensics.cli._args import symbol_options
from forensics.cli.main import failure, verbose_parent
from forensics.core.errors import UnmappedError
from forensics.errors import ForensicsError, UsageError
from forensics.reader.dump import Dump
from forensics.reader.live import MapsLine, load_region, maps_of, maps_regions
from forensics.reader.memory import Region

# ------------------------------------------------------------------ memory --


class GdbMemory:
    """forensics.reader.memory.Memory of gdb's selected (live, stopped, native) inferior."""

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

    def maps(self) -> list[MapsLine]:
        return maps_of(self.pid)

    def regions(self) -> list[Region]:
        if self._regions is None:
            self._regions = maps_regions(self.maps(), lambda start, end: load_region(start, end, self._read_into))
        return self._regions

    def _read_into(self, view: memoryview, addr: int) -> int:
        try:
            view[:] = self.inferior.read_memory(addr, len(view)).tobytes()
        except gdb.MemoryError:
            return 0
        return len(view)

    def thread_regs(self) -> dict[int, dict[str, int]]:
        """{kernel tid: registers (rip, rsp, rbp and the other callee-saved
        ones, enough to unwind)} of every thread gdb knows, now."""
        out: dict[int, dict[str, int]] = {}
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
                    frame = gdb.newest_frame()
                    out[int(lwp)] = {name: int(frame.read_register(name)) & 0xFFFFFFFFFFFFFFFF
                                     for name in _unwind_regs(frame)}
                except gdb.error:
                    continue
        finally:
            try:
                orig_thread.switch()
                orig_frame.select()
            except gdb.error:
                pass
        return out


_UNWIND_REGS = ("rip", "rsp", "rbp", "rbx", "r12", "r13", "r14", "r15")


def _unwind_regs(frame) -> tuple[str, ...]:
    """The registers to read for an unwind, by the machine gdb debugs
    (aarch64: pc, sp and the callee-saved x19-x30)."""
    try:
        name = frame.architecture().name()
    except (gdb.error, AttributeError):
        name = ""
    if name.startswith("aarch64"):
        return (AARCH64.pc, AARCH64.sp, *(AARCH64.dwarf_names[i] for i in AARCH64.callee_saved), "x30")
    return _UNWIND_REGS


class GdbDump(Dump):
    """A Dump of a live inferior: the threads' registers are gdb's now (a
    core has them in its notes; libtag's saved ones are older)."""

    def live_registers(self) -> dict[int, dict[str, int]]:
        return self.mem.thread_regs()

    @property
    def arch(self):
        """The machine of the inferior, as gdb has it ("aarch64",
        "i386:x86-64"): a native process is the machine gdb runs on, which
        Dump's default (forensics.arch.HOST) does not follow."""
        try:
            name = self.mem.inferior.architecture().name()
        except (gdb.error, AttributeError):
            return super().arch
        return AARCH64 if name.startswith("aarch64") else X86_64


# ------------------------------------------------------------------- dumps --

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


def current_dump(args: argparse.Namespace | None = None) -> Dump:
    """The Dump of what gdb is looking at (kept while it cannot change),
    symbolising as args' --debug-dir and --sysroot say."""

    dump = _open_dump()
    dump.use_symbols(symbol_options(args) if args is not None else None)
    return dump


def _open_dump() -> Dump:
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
    dump = Dump.open(path) if kind == "core" else GdbDump(GdbMemory(inferior))
    _dump, _dump_key = dump, key
    return dump


# --------------------------------------------------------------- commands --


def _address(words: list[str]) -> int:
    """An address from a gdb expression: 0x.., decimal, a pointer, $reg, ..."""
    expr = " ".join(words)
    if not expr.strip():
        raise UsageError("an address is needed: an expression such as 0x55d0c0a012a0, ptr or $rdi")
    try:
        value = gdb.parse_and_eval(expr)
        if value.type.strip_typedefs().code == gdb.TYPE_CODE_ARRAY:
            value = value.address
        return int(value) & 0xFFFFFFFFFFFFFFFF
    except gdb.error as exc:
        raise UsageError(f"not an address: {expr}: {exc}") from None


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are ForensicsErrors (gdb must not exit)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


class _TagCommand(gdb.Command):
    """Parses the arguments with ``add_arguments`` and runs ``run(args)``;
    every failure becomes a one-line gdb.GdbError."""

    name = ""
    add_arguments: Callable[[argparse.ArgumentParser], None]

    def __init__(self) -> None:
        super().__init__(self.name, gdb.COMMAND_DATA)
        self.parser = _Parser(prog=self.name, add_help=False, parents=[verbose_parent()])
        type(self).add_arguments(self.parser)

    def invoke(self, arg: str, from_tty: bool) -> None:
        self.dont_repeat()
        verbose = False
        try:
            args = self._parse(gdb.string_to_argv(arg))
            verbose = getattr(args, "verbose", False)
            self.run(args)
        except gdb.GdbError:
            raise
        except gdb.error as exc:  # gdb's own failures are expected ones, as ForensicsErrors are
            self._fail(ForensicsError(str(exc)), verbose)
        except (Exception, KeyboardInterrupt) as exc:
            self._fail(exc, verbose)

    def _fail(self, exc: BaseException, verbose: bool) -> NoReturn:
        line, _, _ = failure(exc, rerun=f"run '{self.name} -v ...'")
        if verbose and not isinstance(exc, KeyboardInterrupt):
            traceback.print_exception(exc)
        raise gdb.GdbError(f"{self.name}: {line}") from None

    def _parse(self, argv: list[str]) -> argparse.Namespace:
        args, rest = self.parser.parse_known_args(argv)
        if rest:
            if rest[0].startswith("-"):
                known = " ".join(
                    a.option_strings[-1] + (f" {a.metavar}" if a.nargs != 0 and a.metavar else "")
                    for a in self.parser._actions
                    if a.option_strings and a.dest != "verbose")
                raise UsageError(f"unknown option {rest[0]} (options: {known})")
            raise UsageError(f"unexpected argument: {' '.join(rest)} "
                             f"(usage: {self.parser.format_usage().strip()[len('usage: '):]})")
        return args

    def run(self, args: argparse.Namespace) -> None:
        raise NotImplementedError


class TagPrefix(gdb.Command):
    """Heap forensics of a libtag process or core: who owns an address, the heap, leaks.

The program must run with libtag (forensics run, or LD_PRELOAD=$(forensics lib-path)).
Works on a core (gdb EXE CORE) and on a live process (run, attach PID).
Same answers as the forensics command on the same core; -v on any of them
shows the traceback of a failure."""

    def __init__(self) -> None:
        super().__init__("tag", gdb.COMMAND_DATA, prefix=True)


class TagWhoowns(_TagCommand):
    """Who owns an address: its block, state, threads, stacks and referrers.

Usage: tag whoowns [--json] [--debug-dir DIR]... [--sysroot DIR] EXPR
EXPR is a gdb expression: 0x55d0c0a012a0, ptr, $rdi, s->name + 4.
When no tagged block holds it, says what it is: a thread's stack, a module's
globals, another mapping, or nothing mapped.  --json prints the same document
as forensics whoowns --json."""

    name = "tag whoowns"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        whoowns_verb.add_arguments(parser, gdb=True)

    def run(self, args: argparse.Namespace) -> None:
        args.address = _address(args.address)
        whoowns_verb.answer(current_dump(args), args)


class TagBlock(_TagCommand):
    """The tagged heap block holding an address: start, size, state, threads, stacks.

Usage: tag block [--json] [--debug-dir DIR]... [--sysroot DIR] EXPR
Like tag whoowns without the scan for referrers; an error when no tagged
block holds the address.  --json prints the block as forensics' JSON does."""

    name = "tag block"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        whoowns_verb.add_arguments(parser, gdb=True)

    def run(self, args: argparse.Namespace) -> None:
        from forensics.answers.owners import block_of  # deferred, start-up time: numpy, via the answers
        from forensics.answers.shapes import block_doc  # deferred, start-up time: numpy, via the answers
        from forensics.output import jsonout, text  # deferred, start-up time: rich

        addr = _address(args.address)
        dump = current_dump(args)
        block = block_of(dump, addr)
        doc = block_doc(block, dump, offset=addr - block.start)
        if args.json:
            jsonout.print_json(doc)
        else:
            text.show_block(doc)


class TagInspect(_TagCommand):
    """The heap, the anomaly or crash that caused the core, the top stacks, the threads.

Usage: tag inspect [--json] [--leaks] [--top N] [--debug-dir DIR]... [--sysroot DIR]
The same answer as forensics inspect CORE (on a live process: as it is now)."""

    name = "tag inspect"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        inspect_verb.add_arguments(parser, gdb=True)

    def run(self, args: argparse.Namespace) -> None:
        inspect_verb.answer(current_dump(args), args)


class TagLeaks(_TagCommand):
    """Leaked blocks: live blocks that nothing reachable from the roots points to.

Usage: tag leaks [--json]
The same answer as the leaks of forensics inspect --leaks CORE."""

    name = "tag leaks"
    add_arguments = staticmethod(_args.json_flag)

    def run(self, args: argparse.Namespace) -> None:
        from forensics.answers.leaks import leaks_doc  # deferred, start-up time: numpy, via the answers
        from forensics.output import jsonout, text  # deferred, start-up time: rich

        leaks = leaks_doc(current_dump())
        if args.json:
            jsonout.print_json({"leaks": leaks})
        else:
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


__all__ = ["GdbDump", "GdbMemory", "current_dump", "register"]
