"""A dump: the memory of a libtag process opened for answering questions -
a core file, or a live process stopped under gdb - with libtag's control
block and what hangs off it, its heap index, its threads, pointer edges and
symbolised stacks, each built once and cached.

"Dump" is the opened memory; a "snapshot" is the core libtag takes of a
running process (libtag/src/snapshot/snapshot.c, ``forensics snapshot``), which is
one of the files a Dump opens.

    with Dump.open(path) as dump:
        dump.control.reason                          # libtag's records (reader/control.py)
        block = dump.heap.block_at(addr)             # the block index (reader/heap.py)
        frames = dump.stack(block.alloc_stack)       # symbolised, merged

Every verb that reads a core goes through this, so caching (the heap index and
pointer edges beside the core, symbols under the state directory) and the
mapping from a stack id to frames happen in one place.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from functools import cached_property
from typing import Callable

from forensics._np import np

from forensics.arch import AARCH64, HOST
from forensics.core import Core, elf
from forensics.files import state_dir
from forensics.reader import abi, cachefile
from forensics.reader.complete import complete as add_thread_notes
from forensics.reader.control import Control, truncation
from forensics.reader.glibc_layout import CHUNK_HDR, GlibcError, find_layout
from forensics.reader.glibc_walk import GlibcHeap
from forensics.reader.heap import Heap
from forensics.reader.linkmap import link_map_mappings
from forensics.reader.memory import CoreMemory, Memory, Region, clip_regions
from forensics.reader.model import Frame, RawFrame, Thread
from forensics.reader.pointers import Edges, build_edges
from forensics.reader.symbols import (SymbolOptions, Symbolizer, expand_inlines, merge_entry_frames,
                                      modules_from_mappings, open_regular)
from forensics.reader.threadptr import thread_pointers
from forensics.reader.types import BlockTypes
from forensics.reader.unwind import Unwinder

Progress = Callable[[int, int], None]

# bumped when the edge cache's meaning changes
_EDGES_VERSION = 3  # 2: forensics.reader.cachefile format; 3: keyed like the heap index


class Dump:
    """A libtag memory (a core, or a live process) with everything the answers need."""

    def __init__(self, mem: Memory, *, core=None, cache_base: str | None = None,
                 progress: Progress | None = None, symbols=None, found=None) -> None:
        """found: what abi.find_control(mem) gave, when the caller has
        looked already (Dump.open); None: look here."""
        self.mem = mem
        self.core = core
        self.cache_base = cache_base
        self.symbol_options = symbols  # a symbols.SymbolOptions, None: the defaults
        self._progress = progress
        self.control = Control(mem, found, arch=self.arch)
        self.heap = Heap(self.control, progress=progress,
                         cache_path=f"{cache_base}.fxidx" if cache_base else None)
        self._frames: dict[int, list[Frame]] = {}
        self._thread_steps: dict[int, list] = {}
        self._thread_frames: dict[int, list[Frame]] = {}

    libtag = True  # a PlainDump is the memory of a process without libtag

    @cached_property
    def types(self):
        """The C++ classes of its blocks, by vtable (reader/types.py)."""

        return BlockTypes(self)


    def _walk_glibc(self, *, skip=(), counted_mmaps: bool = False):
        """glibc's heap in this memory (reader/glibc_walk.py): its arenas
        and chunks; a GlibcError (one line) for a libc it cannot read.
        skip: [start, end) ranges that hold no chunk of glibc's own mmap;
        counted_mmaps: look for those only when glibc counts some."""
        opts = self.symbol_options
        fs = {t.tid: (t.regs or {}).get(self.arch.tp, 0) for t in self.threads}
        stacks = [(t.stack_region.start, t.stack_region.end) for t in self.threads
                  if t.stack_region is not None]
        layout = find_layout(self.symbolizer.modules, debug_dirs=opts.debug_dirs if opts else (),
                             cache_dir=state_dir() / "glibc")
        return GlibcHeap(self.mem, layout, threads=fs, stacks=[*stacks, *skip],
                         counted_mmaps=counted_mmaps)

    @cached_property
    def glibc(self):
        """glibc's heap beside libtag's: in a process libtag was attached to
        (forensics attach), the blocks glibc handed out before; None when
        glibc holds no chunk in use (a process started under libtag, whose
        every block is libtag's) or its heap cannot be read.  libtag's own
        heap region holds no glibc chunk and is not scanned for one."""
        try:
            heap = self._walk_glibc(skip=self.control.heap_ranges(), counted_mmaps=True)
        except GlibcError:
            return None
        return heap if heap.in_use().any() else None

    @cached_property
    def glibc_blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """(user pointers, usable sizes) of the chunks in use in glibc's
        heap, sorted: the blocks a PlainDump answers for, and in a libtag
        process the ones from before an attach (empty without)."""
        heap = self.glibc
        if heap is None:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        sel = heap.in_use()
        return heap.start[sel] + np.uint64(CHUNK_HDR), heap.usable(sel).astype(np.uint64)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, progress: Progress | None = None,
             symbols=None, plain: bool = False, complete: bool = False, note=None) -> "Dump":
        """The Dump of the core at path: the core is opened and parsed once,
        and its control block found once, for every answer.  plain: a core
        without libtag's control block opens as a PlainDump (glibc's heap
        instead of tags) instead of raising abi.NoLibtagError.  complete:
        first give a kernel-written snapshot core every thread's registers
        (forensics.reader.complete, with this parse and this control block;
        note() says why not when it cannot) - the explicit step the command
        line takes; gdb's commands leave the core gdb has open as it is."""

        core = Core(path)
        try:
            if not core.mappings:
                _adopt_link_map(core, symbols)
            mem = CoreMemory(core)
            try:
                found = abi.find_control(mem)
            except abi.NoLibtagError as exc:
                found = exc
            if complete and not isinstance(found, abi.NoLibtagError):
                if add_thread_notes(core, found, note=note):
                    core.reparse()  # the new notes: every thread's registers
                    mem = CoreMemory(core)
            try:
                return cls(mem, core=core, cache_base=os.fspath(path), progress=progress,
                           symbols=symbols, found=found)
            except abi.NoLibtagError as exc:
                if not plain:
                    raise
                loaded = next((m.path for m in core.mappings if m.path and _named_libtag(m.path)), None)
                if loaded:
                    # libtag's blocks are in its own heap, not glibc's: a
                    # libtag process whose control block is gone is a
                    # damaged core, not one to read as glibc's
                    raise abi.NoLibtagError(exc.message.replace(
                        "the process did not run under libtag",
                        f"the process had {loaded} loaded, so the core is damaged or cut short"
                    )) from None
                return PlainDump(mem, core=core, symbols=symbols, why=exc.message)
        except BaseException:
            core.close()
            raise

    def close(self) -> None:
        if "unwinder" in self.__dict__:
            self.unwinder.close()
        if self.core is not None:
            self.core.close()

    def __enter__(self) -> "Dump":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ process --

    @property
    def pid(self) -> int:
        return self.control.pid

    @cached_property
    def taken_ms(self) -> int | None:
        """When this memory was taken, in libtag's ms since its start: the
        snapshot's or the crash's time; for a live process the instant it was
        first read here (one Dump is one stop of the process, so its answers
        agree); None for a core libtag did not take (gcore)."""
        taken = self.control.taken_ms
        if taken is None and self.core is None:
            coarse = getattr(time, "CLOCK_MONOTONIC_COARSE", 6)  # 6: <linux/time.h>, libtag's clock
            taken = (time.clock_gettime_ns(coarse) - int(self.control.fields.start_mono_ns)) // 1_000_000
        return taken

    @property
    def exe(self) -> str | None:
        return self.core.exe if self.core is not None else getattr(self.mem, "exe", None)

    # ------------------------------------------------------------ symbols --

    @cached_property
    def symbolizer(self):
        if self.core is not None:
            mappings = self.core.mappings
        else:  # a live memory (LiveMemory, the gdb adapter's) offers its maps
            mappings = self.mem.maps()
        opts = self.symbol_options or SymbolOptions()
        # the build-ids and headers the process had come from its own memory
        modules = modules_from_mappings(mappings, read=self.mem.read, sysroot=opts.sysroot)
        here = self.core.files_here if self.core is not None else {}
        if here:
            biases = self.core.biases_here
            modules = [_found_file(m, here.get(m.path), biases.get(m.path)) for m in modules]
        kw = {"debug_dirs": opts.debug_dirs, "sysroot": opts.sysroot}
        try:
            return Symbolizer(modules, cache_dir=state_dir() / "symbols", **kw)
        except OSError:
            return Symbolizer(modules, **kw)

    def use_symbols(self, symbols) -> None:
        """Symbolise from now on with other SymbolOptions (the gdb commands
        keep one Dump across commands that may give other flags)."""
        if symbols != self.symbol_options:
            self.symbol_options = symbols
            self.__dict__.pop("symbolizer", None)
            self._frames.clear()

    @property
    def warnings(self) -> list[str]:
        """What could not be read or trusted: libtag's records' and the heap
        index's (one list), then the symboliser's (a module whose file is not
        the one the process ran) for the frames symbolised so far."""
        sym = self.__dict__.get("symbolizer")
        return list(self.control.warnings) + (list(sym.warnings) if sym is not None else [])

    def symbolize(self, raw: list[RawFrame]) -> list[Frame]:
        """Frames for raw (pc, kind) pairs, innermost first: ENTRY frames that
        repeat the CALL frame inside them are merged, each physical frame is
        preceded by the calls inlined there (``inlined``), and libtag's own
        frames are marked (``libtag``); nothing is dropped."""

        if not raw:
            return []
        frames = self.symbolizer.symbolize(raw)
        frames = expand_inlines(merge_entry_frames(frames, [k for _, k in raw]))
        return [self._vdso_frame(f) if f.module is None else
                replace(f, libtag=True) if self._is_libtag(f) else f for f in frames]

    def _vdso_frame(self, frame: Frame) -> Frame:
        """A frame in the kernel's vDSO, named from its symbols (no file
        holds it: the image is read from the memory)."""
        base = self.vdso_base
        if base is None or frame.address < base:
            return frame
        found = self.unwinder.vdso_symbol(frame.address)
        return replace(frame, function=found[0], module="[vdso]") if found else frame

    @cached_property
    def libtag_module(self) -> str | None:
        """The path of libtag's shared object: the module whose data holds
        the control block.  None when that is the program itself (libtag.a
        linked in: its data is the program's, and the scans clip libtag's
        tables out by address).  The one rule for "is this libtag's": its
        frames are marked, its data is no referrer and no root."""
        # the control block is in libtag's .data or .bss: the nearest file
        # mapping at or below it is libtag's (the debug build's .bss is split
        # in parts, not all of them in a core, so "the mapping right after
        # the module" does not find every part)
        ctl = self.control.addr
        module = None
        for r in self.mem.regions():
            if r.start > ctl:
                break
            if r.path and not r.path.startswith("["):
                module = r.path
        if module is None or (self.exe and os.path.realpath(module) == os.path.realpath(self.exe)):
            return None
        return module

    def _is_libtag(self, frame: Frame) -> bool:
        """libtag's own code: its shared object, or (libtag.a linked into
        the program) a function compiled from libtag's sources."""
        if frame.module is not None and frame.module == self.libtag_module:
            return True
        return frame.file is not None and "/libtag/src/" in frame.file.replace("\\", "/")

    def stack(self, stack_id: int | None) -> list[Frame]:
        """The symbolised frames of a stack table id (0 / None: no frames)."""
        if not stack_id:
            return []
        if stack_id not in self._frames:
            self._frames[stack_id] = self.symbolize(self.control.raw_stack(stack_id))
        return self._frames[stack_id]

    def prefetch(self, stack_ids) -> None:
        """Symbolise many stacks in one batch (one tool run per module)."""
        todo = [s for s in dict.fromkeys(stack_ids) if s and s not in self._frames]
        if not todo:
            return
        raws = [self.control.raw_stack(s) for s in todo]
        flat = [f for r in raws for f in r]
        if flat:
            self.symbolizer.symbolize(flat)  # fills the symbolizer's cache
        for s, r in zip(todo, raws):
            self._frames[s] = self.symbolize(r)

    # ------------------------------------------------------------ threads --

    @cached_property
    def threads(self) -> list[Thread]:
        """Every thread of the process, with its registers: those libtag knew
        that had not exited (with their records), then the others the core's
        notes (or the live process) have - a thread that never allocated has
        no libtag record.  Registers: a live process's now (live_registers),
        else those libtag saved for the snapshot, else the core's own notes
        (saved_registers_first says which of the two)."""
        live = self.live_registers()
        core = self.core_registers
        out = []
        for t in self.control.threads:
            if t.exited:
                continue
            saved = t.saved_regs
            if saved and self.arch.tp not in saved and self.arch.tp in core.get(t.tid, {}):
                # aarch64's record has no tpidr_el0: the thread's own, which
                # no snapshot changes, from the core
                saved = {**saved, self.arch.tp: core[t.tid][self.arch.tp]}
            regs = saved if self.saved_registers_first and saved else core.get(t.tid, saved)
            regs = live.get(t.tid, regs)
            sp = regs.get(self.arch.sp) if regs else None
            out.append(replace(t, regs=regs, sp=sp or None, stack_region=self._stack_region(t, sp)))
        known = {t.tid for t in self.control.threads}
        for tid, regs in {**core, **live}.items():
            if tid not in known:
                sp = regs.get(self.arch.sp)
                out.append(Thread(tid, regs=regs, sp=sp or None, stack_region=self._region_at(sp)))
        return out

    @property
    def saved_registers_first(self) -> bool:
        """Whose registers are the program's: a snapshot's (on demand, at an
        anomaly, at exit) are those libtag saved for every thread at one
        instant before the fork - the core's own note of the snapshotting
        thread is the fork child's, deep in libtag; a crash core is the
        process itself, and a core libtag did not take (gcore) may be newer
        than an earlier snapshot's registers: there the core's notes are."""
        return self.control.reason not in ("crash", "none")

    def crash_registers(self, tid: int) -> dict[str, int] | None:
        """The faulting thread's registers at a crash's fault: libtag saved
        them from the signal context into its record; else the core's own
        note for the thread."""
        t = self.control.thread(tid)
        if t is not None and t.saved_regs and t.saved_regs.get(self.arch.pc):
            return t.saved_regs
        return self.core_registers.get(tid)

    def _region_at(self, addr: int | None) -> Region | None:
        return next((r for r in self.mem.regions() if addr in r), None) if addr else None

    def thread(self, tid: int) -> Thread | None:
        return next((t for t in self.threads if t.tid == tid), None)

    @cached_property
    def unwinder(self):
        arch = self.arch
        regions = self.mem.regions()
        mask = arch.pointer_mask(regions[-1].end - 1) if regions else arch.pointer_mask(0)
        return Unwinder(self.mem, self.symbolizer.modules, vdso=self.vdso_base, arch=arch, ptr_mask=mask)

    @property
    def arch(self):
        """The machine (forensics.arch): a core's, else this host's (a live
        process is read here)."""

        return self.core.arch if self.core is not None else HOST

    @cached_property
    def vdso_base(self) -> int | None:
        """Where the kernel's vDSO is mapped: AT_SYSINFO_EHDR in a core's
        auxiliary vector, [vdso] in a live process's maps."""
        if self.core is not None:
            return self.core.auxv.sysinfo_ehdr or None
        maps = getattr(self.mem, "maps", None)
        try:
            return next((m.start for m in maps() if m.path == "[vdso]"), None) if maps else None
        except Exception:
            return None

    def thread_raw(self, t: Thread) -> list[RawFrame]:
        """Thread t's stack as (pc, kind), innermost first: unwound with CFI
        from its registers; where that walk ends before the outermost frame,
        the shadow stack's frames beyond it follow; with no registers, the
        shadow stack alone."""
        steps = self.thread_steps(t)
        if not steps:
            return list(t.shadow)
        raw = [(s.pc, s.kind) for s in steps]
        last = steps[-1]
        top = last.sp + 1 if last.sp is not None else last.cfa
        if top is None:
            return raw
        # The shadow stack's CALL frames whose function's frame is the walk's
        # last or beyond it: the callers the walk did not reach.  Each entry's
        # key is the end of the slot that holds its return address (x86_64:
        # the CFA; aarch64: where the prologue saved x30, in the frame below
        # the CFA), above the function's stack pointer.  A slot that no
        # longer holds the site (stripped of a PAC signature) is a frame a
        # longjmp left (libtag pops those only at the thread's next enter).
        # The first one is preceded by the ENTRY of the function it returns
        # from: the frame between, unless it is the walk's last (symbolize
        # merges an ENTRY into the frame inside it of the same function).
        mask = self.unwinder.ptr_mask
        for (pc, kind), sp, fn in zip(t.shadow[1:], t.shadow_sp, t.shadow_fn):
            key = sp & ~1
            if key < top:
                continue
            if not sp & 1 and ((w := self.unwinder.word(key - 8)) is None or w & mask != pc):
                continue
            if len(raw) == len(steps):
                raw.append((fn, abi.TAG_FRAME_ENTRY))
            raw.append((pc, kind))
        return raw

    def thread_steps(self, t: Thread) -> list:
        """Thread t's frames unwound with CFI from its registers (the
        unwinder's steps: pc, kind, sp, cfa), innermost first; [] without
        registers.  Cached: the stack and whoowns' frame of a stack word
        come from this one walk."""
        if t.tid not in self._thread_steps:
            steps = []
            if t.regs and t.regs.get(self.arch.pc):
                bounds = (t.stack_region.start, t.stack_region.end) if t.stack_region is not None else None
                steps = self.unwinder.unwind(t.regs, stack=bounds)
            self._thread_steps[t.tid] = steps
        return self._thread_steps[t.tid]

    def thread_frames(self, t: Thread) -> list[Frame]:
        """Thread t's symbolised stack (thread_raw), cached."""
        if t.tid not in self._thread_frames:
            self._thread_frames[t.tid] = self.symbolize(self.thread_raw(t))
        return self._thread_frames[t.tid]

    @cached_property
    def core_registers(self) -> dict[int, dict[str, int]]:
        """{tid: registers} from the core's NT_PRSTATUS notes ({} without a
        core).  The kernel's core of a snapshot child names the child, whose
        one thread is the snapshotting thread: it is filed under that tid."""
        out: dict[int, dict[str, int]] = {}
        if self.core is not None:
            snap_tid = int(self.control.fields.snapshot_tid)
            for t in self.core.threads:
                tid = t.tid
                if tid == self.core.pid and snap_tid and not self.control.thread(tid):
                    tid = snap_tid
                out.setdefault(tid, dict(t.regs))
        return _with_thread_pointers(self, out)

    def _stack_region(self, t: Thread, sp: int | None) -> Region | None:
        """The mapping that holds thread t's stack: the one sp is in, else
        the one just below the top of its stack libtag recorded."""
        probe = sp if sp else (t.stack_hi - 1 if t.stack_hi else None)
        if probe is None:
            return None
        return next((r for r in self.mem.regions() if probe in r), None)

    def live_registers(self) -> dict[int, dict[str, int]]:
        """{tid: registers} read now from a live process; a core has none
        (the gdb adapter's dump of a live process has them)."""
        return {}

    def thread_of_stack(self, addr: int) -> Thread | None:
        for t in self.threads:
            if t.stack_region is not None and addr in t.stack_region:
                return t
        return None

    # ------------------------------------------------------------ pointers --

    @cached_property
    def targets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(starts, sizes, live, tagged) of every block the answers read,
        sorted by start: libtag's tagged blocks (live, freed or damaged),
        and glibc's chunks in use (``glibc_blocks``, live and untagged) in
        a process libtag was attached to.  The pointer edges' targets and
        the leak scan's blocks are its indexes."""
        idx = self.heap.index
        live = idx["state"] == abi.TAG_STATE_LIVE
        gs, gu = self.glibc_blocks
        if not len(gs):
            return idx["start"], idx["size"], live, np.ones(len(live), bool)
        starts = np.concatenate([idx["start"].astype(np.uint64), gs])
        order = np.argsort(starts, kind="stable")
        sizes = np.concatenate([idx["size"].astype(np.uint64), gu])
        tagged = np.concatenate([np.ones(len(live), bool), np.zeros(len(gs), bool)])
        live = np.concatenate([live, np.ones(len(gs), bool)])
        return starts[order], sizes[order], live[order], tagged[order]

    @cached_property
    def edges(self) -> Edges:
        """Every aligned word in the program's writable memory that points into
        a block (``targets``); cached beside the core like the heap index."""

        path = f"{self.cache_base}.fxptr" if self.cache_base else None
        key = getattr(self.mem, "cache_key", None)
        starts, sizes, _, _ = self.targets
        if path and key:
            key = (*key, self.control.addr, self.control.secret, len(self.heap), len(starts))
            cached = _load_edges(path, key) if self.heap.from_cache else None
            if cached is not None:
                return cached
        regions = clip_regions([r for r in self.mem.regions() if r.writable],
                               self.control.own_ranges())
        edges = build_edges(regions, starts, sizes, progress=self._progress)
        if path and key:
            _save_edges(path, key, edges)
        return edges


class PlainDump(Dump):
    """The core of a process that never ran libtag: its memory, modules,
    threads and stacks as for any Dump, and glibc's own heap
    (reader/glibc_layout.py, reader/glibc_walk.py) in place of tagged blocks - so no allocation or
    free stacks, times or threads.  ``control`` and ``heap`` are None;
    ``glibc`` reads the heap (a GlibcError for a libc it cannot read)."""

    libtag = False

    def __init__(self, mem: Memory, *, core, symbols=None, why: str = "") -> None:
        self.mem = mem
        self.core = core
        self.cache_base = None
        self.symbol_options = symbols
        self._progress = None
        self.control = None
        self.heap = None
        self.no_libtag = why  # what the libtag reader said ("no libtag control block in ...")
        self._frames = {}
        self._thread_steps = {}
        self._thread_frames = {}

    @property
    def pid(self) -> int:
        return int(self.core.pid or 0) if self.core is not None else 0

    @property
    def taken_ms(self) -> int | None:
        return None

    @cached_property
    def glibc(self):
        """glibc's heap (reader/glibc_walk.py); a GlibcError that says both
        why libtag's reader and glibc's cannot answer."""
        try:
            return self._walk_glibc()
        except GlibcError as exc:
            raise GlibcError(f"{self.no_libtag}; glibc's heap cannot be read either: {exc.message}"
                             ) from None

    @property
    def warnings(self) -> list[str]:
        heap = self.__dict__.get("glibc")
        sym = self.__dict__.get("symbolizer")
        cut = truncation(self.mem)
        return ([f"{cut}: chunks there are not read"] if cut else []) + (
            list(heap.warnings) if heap is not None else []) + (
            list(sym.warnings) if sym is not None else [])

    libtag_module = None  # no libtag

    @cached_property
    def threads(self) -> list[Thread]:
        """Every thread in the core's notes, the one that took the signal first."""
        out = []
        for tid, regs in self.core_registers.items():
            sp = regs.get(self.arch.sp)
            out.append(Thread(tid, regs=regs, sp=sp or None, stack_region=self._region_at(sp)))
        return out

    @cached_property
    def core_registers(self) -> dict[int, dict[str, int]]:
        out: dict[int, dict[str, int]] = {}
        for t in self.core.threads if self.core is not None else ():
            out.setdefault(t.tid, dict(t.regs))
        return _with_thread_pointers(self, out)

    @cached_property
    def targets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(starts, sizes, live, tagged) of the chunks the program holds
        (``glibc_blocks``): every one live, none tagged."""
        starts, sizes = self.glibc_blocks
        return starts, sizes, np.ones(len(starts), bool), np.zeros(len(starts), bool)

    @cached_property
    def edges(self) -> Edges:
        """Every aligned word of writable memory that points into a block
        (``glibc_blocks``: targets are its indexes)."""
        starts, sizes = self.glibc_blocks
        regions = [r for r in self.mem.regions() if r.writable]
        return build_edges(regions, starts, sizes, progress=self._progress)


def _load_edges(path: str, key) -> Edges | None:
    # keyed like the heap index it refers to: block numbers are its indexes
    data = cachefile.load(path, [_EDGES_VERSION, *key])
    if data is None:
        return None
    try:
        edges = Edges.from_arrays(data)
    except KeyError:
        return None
    # arrays of unequal lengths or unsorted targets (a scribbled cache) would
    # give wrong referrers: rebuild instead
    n = len(edges.source)
    if (edges.source.ndim, edges.target.ndim, edges.interior.ndim) != (1, 1, 1) \
            or (len(edges.target), len(edges.interior)) != (n, n) \
            or (n > 1 and bool(np.any(edges.target[1:] < edges.target[:-1]))):
        return None
    return edges


def _save_edges(path: str, key, edges: Edges) -> None:
    cachefile.save(path, [_EDGES_VERSION, *key], edges.to_arrays())


def _with_thread_pointers(dump: Dump, regs: dict[int, dict[str, int]]) -> dict[int, dict[str, int]]:
    """An aarch64 core's registers with the thread pointers a core without
    NT_ARM_TLS (qemu-user's) lacks, found from glibc's thread descriptors
    (reader/threadptr.py)."""

    if dump.core is None or dump.arch is not AARCH64 or not regs \
            or any(AARCH64.tp in r for r in regs.values()):
        return regs

    for tid, tp in thread_pointers(dump.mem, list(regs)).items():
        regs[tid][AARCH64.tp] = tp
    return regs


def _adopt_link_map(core, symbols) -> None:
    """A core without NT_FILE (qemu-user's): its modules from the loader's
    list (reader/linkmap.py), files looked for under --sysroot."""

    found = link_map_mappings(core, getattr(symbols, "sysroot", None))
    if found is not None and found.mappings:
        core.adopt_mappings(found.mappings, found.files, found.biases)


def _found_file(module, local: str | None, bias: int | None):
    """A module found through the loader's list, with the file found for
    it and the loader's load bias; the build-id is the file's when the
    memory does not show it (the core has no first page of the file)."""
    if bias is not None:
        module = replace(module, load_bias=bias)
    if local is None:
        return module
    bid = module.build_id
    if bid is None:
        f = open_regular(local)
        if f is not None:
            with f:
                bid = elf.file_build_id(f)
    return replace(module, file=local, build_id=bid)


def _named_libtag(path: str) -> bool:
    """Is the file at path named libtag (libtag.so, whatever its version
    suffix)?  Only for a core whose control block is gone: with one,
    Dump.libtag_module says which module is libtag's."""
    return os.path.basename(path).split(".")[0] == "libtag"
