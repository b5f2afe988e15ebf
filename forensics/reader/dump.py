"""A dump: the memory of a libtag process opened for answering questions -
a core file, or a live process stopped under gdb - with its heap index,
pointer edges and symbolised stacks, each built once and cached.

"Dump" is the opened memory; a "snapshot" is the core libtag takes of a
running process (libtag/src/snapshot.c, ``forensics snapshot``), which is
one of the files a Dump opens.

    with Dump.open(path) as dump:
        block = dump.heap.block_at(addr)
        frames = dump.stack(block.alloc_stack)       # symbolised, merged

Every verb that reads a core goes through this, so caching (the heap index and
pointer edges beside the core, symbols under the state directory) and the
mapping from a stack id to frames happen in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from forensics.reader.heap import Heap
from forensics.reader.memory import CoreMemory, Memory, Region, clip_regions
from forensics.reader.model import Frame, RawFrame, ThreadState
from forensics.reader.pointers import Edges, build_edges

Progress = Callable[[int, int], None]

# bumped when the edge cache's meaning changes
_EDGES_VERSION = 3  # 2: forensics.reader.cachefile format; 3: keyed like the heap index


@dataclass(frozen=True)
class ThreadStack:
    """One thread at the snapshot: its tid, stack pointer and bounds, frames."""

    tid: int
    sp: int | None
    stack_region: Region | None
    raw: list[RawFrame]


class Dump:
    """A libtag memory (a core, or a live process) with everything the answers need."""

    def __init__(self, mem: Memory, *, core=None, cache_base: str | None = None,
                 progress: Progress | None = None, symbols=None) -> None:
        self.mem = mem
        self.core = core
        self.cache_base = cache_base
        self.symbol_options = symbols  # a symbols.SymbolOptions, None: the defaults
        self._progress = progress
        self.heap = Heap(mem, progress=progress,
                         cache_path=f"{cache_base}.fxidx" if cache_base else None)
        self._frames: dict[int, list[Frame]] = {}

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, progress: Progress | None = None,
             symbols=None) -> "Dump":
        from forensics.core import Core

        core = Core(path)
        try:
            return cls(CoreMemory(core), core=core, cache_base=os.fspath(path), progress=progress,
                       symbols=symbols)
        except BaseException:
            core.close()
            raise

    def close(self) -> None:
        if self.core is not None:
            self.core.close()

    def __enter__(self) -> "Dump":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ process --

    @property
    def pid(self) -> int:
        return self.heap.pid

    @cached_property
    def taken_ms(self) -> int | None:
        """When this memory was taken, in libtag's ms since its start: the
        snapshot's or the crash's time; for a live process the instant it was
        first read here (one Dump is one stop of the process, so its answers
        agree); None for a core libtag did not take (gcore)."""
        taken = self.heap.taken_ms
        if taken is None and self.core is None:
            import time

            coarse = getattr(time, "CLOCK_MONOTONIC_COARSE", 6)  # 6: <linux/time.h>, libtag's clock
            taken = (time.clock_gettime_ns(coarse) - int(self.heap.control.start_mono_ns)) // 1_000_000
        return taken

    @property
    def exe(self) -> str | None:
        return self.core.exe if self.core is not None else getattr(self.mem, "exe", None)

    # ------------------------------------------------------------ symbols --

    @cached_property
    def symbolizer(self):
        from forensics.files import state_dir
        from forensics.reader.symbols import SymbolOptions, Symbolizer, modules_from_mappings

        if self.core is not None:
            mappings = self.core.mappings
        else:  # a live memory (LiveMemory, the gdb adapter's) offers its maps
            mappings = self.mem.maps()
        opts = self.symbol_options or SymbolOptions()
        # the build-ids and headers the process had come from its own memory
        modules = modules_from_mappings(mappings, read=self.mem.read, sysroot=opts.sysroot)
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
        """What could not be read or trusted: the heap's warnings, then the
        symboliser's (a module whose file is not the one the process ran)
        for the frames symbolised so far."""
        sym = self.__dict__.get("symbolizer")
        return list(self.heap.warnings) + (list(sym.warnings) if sym is not None else [])

    def symbolize(self, raw: list[RawFrame]) -> list[Frame]:
        """Frames for raw (pc, kind) pairs, innermost first; ENTRY frames that
        repeat the CALL frame inside them are merged, nothing else dropped."""
        from forensics.reader.symbols import merge_entry_frames

        if not raw:
            return []
        frames = self.symbolizer.symbolize(raw)
        return merge_entry_frames(frames, [k for _, k in raw])

    def stack(self, stack_id: int | None) -> list[Frame]:
        """The symbolised frames of a stack table id (0 / None: no frames)."""
        if not stack_id:
            return []
        if stack_id not in self._frames:
            self._frames[stack_id] = self.symbolize(self.heap.raw_stack(stack_id))
        return self._frames[stack_id]

    def prefetch(self, stack_ids) -> None:
        """Symbolise many stacks in one batch (one tool run per module)."""
        todo = [s for s in dict.fromkeys(stack_ids) if s and s not in self._frames]
        if not todo:
            return
        raws = [self.heap.raw_stack(s) for s in todo]
        flat = [f for r in raws for f in r]
        if flat:
            self.symbolizer.symbolize(flat)  # fills the symbolizer's cache
        for s, r in zip(todo, raws):
            self._frames[s] = self.symbolize(r)

    # ------------------------------------------------------------ threads --

    @cached_property
    def threads(self) -> list[ThreadStack]:
        """Every thread libtag knew that had not exited, with its stack pointer:
        a live process's registers now (live_stack_pointers), else from the
        core's own notes where the kernel recorded the thread, else from the
        registers libtag saved before the snapshot's fork."""
        live_sp = self.live_stack_pointers()
        core_sp = {tid: regs["rsp"] for tid, regs in self.core_registers.items()}
        # A snapshot's registers were saved by libtag for every thread at one
        # instant, before the fork; the core's own note of the snapshotting
        # thread is the fork child's, deeper inside libtag.  A crash core is
        # the process itself: there the core's notes are the truth.
        prefer_saved = self.heap.reason != "crash"
        out = []
        for t in self.heap.threads:
            if t.exited:
                continue
            saved = t.regs.get("rsp") if t.regs else None
            sp = saved if prefer_saved and saved else core_sp.get(t.tid, saved)
            sp = live_sp.get(t.tid, sp)
            out.append(ThreadStack(t.tid, sp, self.stack_region(t, sp), t.shadow))
        return out

    @cached_property
    def core_registers(self) -> dict[int, dict[str, int]]:
        """{tid: registers} from the core's NT_PRSTATUS notes ({} without a
        core).  The kernel's core of a snapshot child names the child, whose
        one thread is the snapshotting thread: it is filed under that tid."""
        out: dict[int, dict[str, int]] = {}
        if self.core is not None:
            snap_tid = int(self.heap.control.snapshot_tid)
            for t in self.core.threads:
                tid = t.tid
                if tid == self.core.pid and snap_tid and not self.heap.thread(tid):
                    tid = snap_tid
                out.setdefault(tid, dict(t.regs))
        return out

    def stack_region(self, t: ThreadState, sp: int | None) -> Region | None:
        """The mapping that holds thread t's stack: the one sp is in, else
        the one just below the top of its stack libtag recorded."""
        probe = sp if sp else (t.stack_hi - 1 if t.stack_hi else None)
        if probe is None:
            return None
        return next((r for r in self.mem.regions() if probe in r), None)

    def live_stack_pointers(self) -> dict[int, int]:
        """{tid: stack pointer} read now from a live process's registers; a
        core has none (the gdb adapter's dump of a live process has them)."""
        return {}

    def thread_of_stack(self, addr: int) -> ThreadStack | None:
        for t in self.threads:
            if t.stack_region is not None and addr in t.stack_region:
                return t
        return None

    # ------------------------------------------------------------ pointers --

    @cached_property
    def edges(self) -> Edges:
        """Every aligned word in the program's writable memory that points into
        a tagged block; cached beside the core like the heap index."""

        path = f"{self.cache_base}.fxptr" if self.cache_base else None
        key = getattr(self.mem, "cache_key", None)
        if path and key:
            key = (*key, self.heap.control_addr, self.heap.secret, len(self.heap))
            cached = _load_edges(path, key) if self.heap.from_cache else None
            if cached is not None:
                return cached
        idx = self.heap.index
        regions = clip_regions([r for r in self.mem.regions() if r.writable],
                               self.heap.own_ranges())
        edges = build_edges(regions, idx["start"], idx["size"], progress=self._progress)
        if path and key:
            _save_edges(path, key, edges)
        return edges


def _load_edges(path: str, key) -> Edges | None:
    import numpy as np

    from forensics.reader import cachefile

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
    from forensics.reader import cachefile

    cachefile.save(path, [_EDGES_VERSION, *key], edges.to_arrays())
