"""The ``report`` page: one self-contained HTML file about one or more cores.

    builder = ReportBuilder(...)
    builder.add(dump) ...                       # each core
    doc = builder.finish()                      # ReportDoc (answers/documents.py)
    html = render_page(doc)                     # str: the whole page, its data to_json(doc)
    write_page(path, html)                      # 0600, tmp + rename

What the page shows, and where each part comes from:

- the live heap (bytes and blocks) of every snapshot as a curve over time,
  each point labelled with the snapshot's reason;
- an allocation hierarchy (an icicle flame graph, click to zoom) of the live
  bytes of the newest snapshot, by allocation stack;
- the anomaly or crash of every core that has one, with all its stacks
  (detecting / faulting, and the block's allocation and free stacks), once
  per anomaly: the same anomaly recorded in later cores of the process is
  one card that says "seen in N cores";
- cores of more than one process: a warning naming each process, and one
  curve per process;
- the leak groups of the newest snapshot;
- the newest snapshot's live blocks by C++ class (inspect's ``types``: by
  the vtable pointer in a block's first word), with libtag and without;
- the C and C++ runtimes' own blocks (stdio buffers, libstdc++'s emergency
  pool, the loader's TLS: forensics.answers.runtime) folded into one node of
  the hierarchy and one line above the table, unless --runtime;
- a sortable, filterable table of the newest snapshot's allocation stacks,
  each with where it allocated: its first frame outside the allocation
  wrappers (WRAPPERS, and the report's --wrapper patterns), and its peak
  live bytes and temporary allocations when libtag kept per-stack counters
  (control.stack_stats; "not recorded" otherwise), and its first
  REPORT_STACK_BLOCKS blocks by address (start, size, thread, age), the way
  from a stack to `whoowns`.

Beyond those few blocks a stack, nothing in the page is per block: the heap
is aggregated by allocation stack first (Heap.by_stack is one numpy pass),
at most STACK_LIMIT stacks are symbolised, and the hierarchy is the trie of
their frames, outermost first.  So a core with a million blocks gives the
same few hundred KB page as one with a thousand.

How the page is drawn, and why strings from a core cannot run in it:
forensics.output.html.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from forensics._np import np

from forensics.answers.crash import crash_doc
from forensics.answers.inspect import blocks_of_stacks, inspect_doc, live_types, top_stacks
from forensics.answers.documents import (BlockDoc, CrashDoc, FrameDoc, InspectDoc, LeakGroupDoc, ReportDoc,
                                         ReportEvent, ReportEventStack, ReportFrame, ReportLeak, ReportPoint,
                                         ReportProcess, ReportSizeClass, ReportStackRow, ReportTree,
                                         RuntimeSummary, TopStack, WithoutLibtag)
from forensics.answers.leaks import leaks_doc
from forensics.answers.runtime import glob_regex
from forensics.answers.shapes import finding_doc, frame_label, frames_doc
from forensics.errors import ForensicsError, InputError
from forensics.heaps import heap_of

DATA_VERSION = 3  # 3: block_list, each stack's first blocks
RUNTIME_LABEL = "(the C and C++ runtimes)"  # the hierarchy's node of their folded stacks
STACK_LIMIT = 2000  # allocation stacks symbolised and drawn; the rest are one "other" node
REPORT_STACK_BLOCKS = 10  # blocks listed under each stack of the table (for whoowns)
STATS_LIMIT = 200  # stacks with no live block listed for their peak or temporaries
SIZE_LIMIT = 2000  # without libtag: size classes listed (most bytes first)
CORRUPTION_LIMIT = 50  # without libtag: heap inconsistencies of one core shown as events
TYPES_LIMIT = 200  # C++ classes listed (most bytes first)

# Allocation wrappers: functions that allocate for their caller, so "allocated
# at" is the first frame of a stack that is none of these (docs/guide.md,
# "Report").  Shell-style patterns (* ? [ ]) on the demangled function name;
# forensics report --wrapper PATTERN adds to them.
WRAPPERS = (
    # the C library: the allocator itself, and what allocates for its caller
    "malloc", "calloc", "realloc", "reallocarray", "memalign", "aligned_alloc",
    "posix_memalign", "valloc", "pvalloc", "__libc_malloc", "__libc_calloc",
    "__libc_realloc", "__libc_memalign", "strdup", "strndup", "__strdup", "__strndup",
    "wcsdup", "asprintf", "vasprintf", "__asprintf*", "__vasprintf*", "getline", "getdelim",
    "open_memstream", "scandir",
    # C++: operator new and the standard allocators
    "operator new*", "std::allocator<*>::allocate*", "std::__new_allocator<*>::allocate*",
    "__gnu_cxx::new_allocator<*>::allocate*", "std::allocator_traits<*>::allocate*",
    # the usual xmalloc family (GNU, GLib)
    "xmalloc", "xcalloc", "xrealloc", "xzalloc", "xstrdup", "xstrndup", "xmemdup*",
    "g_malloc", "g_malloc0", "g_realloc", "g_try_malloc*", "g_strdup", "g_strndup", "g_memdup*",
)


class Wrappers:
    """Which frames are allocation wrappers (WRAPPERS plus the user's)."""

    def __init__(self, extra: Sequence[str] = ()) -> None:
        self.patterns = list(WRAPPERS) + [p for p in extra if p]
        self._rx = glob_regex(self.patterns)

    def site(self, stack: Sequence[FrameDoc]) -> int:
        """Index of the first frame (innermost first) that is not a wrapper;
        the last frame when all are (0 for an empty stack)."""
        for i, f in enumerate(stack):
            name = f.function
            if not name or not self._rx.match(name):
                return i
        return max(0, len(stack) - 1)


# ------------------------------------------------------------------ data --


CatalogTime = Callable[[str], "float | None"]  # absolute core path -> the catalog's time


def snapshot_time(dump: Any, catalog_time: CatalogTime | None = None) -> tuple[float | None, str]:
    """(seconds since the epoch when the core was taken, where that came from).

    libtag's control block has the wall clock at start-up and the milliseconds
    since then at the snapshot (or at the crash / anomaly, for cores written
    without a snapshot time); without those (and for every core without
    libtag), catalog_time's answer for the core, then the core file's mtime."""
    if dump.control is not None:
        c = dump.control.fields
        ms = int(c.snapshot_time_ms) or int(c.crash.time) or int(c.anomaly.time)
        start_ns = int(c.start_realtime_ns)
        if start_ns:
            return start_ns / 1e9 + ms / 1e3, "control block"
    path = dump.core.path if dump.core is not None else None
    if path:
        when = catalog_time(os.path.abspath(path)) if catalog_time is not None else None
        if when:
            return float(when), "catalog"
        try:
            return os.stat(path).st_mtime, "core file mtime"
        except OSError:
            pass
    return None, "unknown"


class _Frames:
    """The page's frame table: each distinct frame once, referred to by index."""

    def __init__(self) -> None:
        self.rows: list[ReportFrame] = []
        self._ids: dict[tuple, int] = {}

    def id(self, f: FrameDoc) -> int:
        key = (f.address, f.function, f.file, f.line, f.module)
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self.rows)
            # label: the frame's name as inspect prints it (module+0xOFFSET
            # when it has no function), so the page never builds one itself
            self.rows.append(ReportFrame(address=f.address, function=f.function, file=f.file, line=f.line,
                                         module=f.module, module_offset=f.module_offset,
                                         label=frame_label(f)))
        return i

    def ids(self, frames: Iterable[FrameDoc]) -> list[int]:
        return [self.id(f) for f in frames]


def _node_key(f: FrameDoc) -> tuple:
    """Frames that are one node of the hierarchy: the same function (of the same
    module), as flame graphs merge them; an unnamed frame is its own place in
    its module (module+0xOFFSET: the same in every process of the build).
    The node keeps every distinct call site it merged (its "sites")."""
    if f.function:
        return (f.function, f.module)
    return (None, f.module_offset or f.address, f.module)


def build_tree(stacks: Sequence[TopStack], frames: _Frames, *, total_bytes: int,
               total_blocks: int, runtime: RuntimeSummary | None = None) -> tuple[ReportTree, list[int]]:
    """The trie of the stacks' frames, outermost frame first under one root.

    stacks: their frames innermost first, blocks and bytes.  Returns
    the tree as parallel arrays (node 0 is the root; parent -1; frame -1 for
    nodes that are not a frame; "sites": the frames of a node that merged more
    than one call site) and each stack's leaf node.  Live bytes not in
    these stacks become extra children of the root: the C and C++ runtimes'
    own (runtime: their totals, when they are folded) and the stacks beyond
    the limit.
    """
    parent, frame, nbytes, nblocks, label = [-1], [-1], [0], [0], {}
    sites: dict[int, list[int]] = {}
    child: dict[tuple[int, tuple], int] = {}
    leaves = []
    for s in stacks:
        node = 0
        nbytes[0] += s.bytes
        nblocks[0] += s.blocks
        for f in reversed(s.stack):
            key = (node, _node_key(f))
            fid = frames.id(f)
            nxt = child.get(key)
            if nxt is None:
                nxt = child[key] = len(parent)
                parent.append(node)
                frame.append(fid)
                nbytes.append(0)
                nblocks.append(0)
                sites[nxt] = [fid]
            elif fid not in sites[nxt]:
                sites[nxt].append(fid)
            node = nxt
            nbytes[node] += s.bytes
            nblocks[node] += s.blocks
        if node == 0:  # a block with no stack recorded
            key = (0, ("(no stack recorded)",))
            node = child.get(key)
            if node is None:
                node = child[key] = len(parent)
                parent.append(0)
                frame.append(-1)
                nbytes.append(0)
                nblocks.append(0)
                label[str(node)] = "(no stack recorded)"
            nbytes[node] += s.bytes
            nblocks[node] += s.blocks
        leaves.append(node)
    if runtime is not None and runtime.stacks:
        node = len(parent)
        parent.append(0)
        frame.append(-1)
        nbytes.append(runtime.bytes)
        nblocks.append(runtime.blocks)
        label[str(node)] = RUNTIME_LABEL
        nbytes[0] += runtime.bytes
        nblocks[0] += runtime.blocks
    rest_bytes, rest_blocks = total_bytes - nbytes[0], total_blocks - nblocks[0]
    if rest_bytes > 0 or rest_blocks > 0:
        node = len(parent)
        parent.append(0)
        frame.append(-1)
        nbytes.append(rest_bytes)
        nblocks.append(rest_blocks)
        label[str(node)] = "(the smaller stacks)"
        nbytes[0] += rest_bytes
        nblocks[0] += rest_blocks
    many = {str(n): ids for n, ids in sites.items() if len(ids) > 1}
    return (ReportTree(parent=parent, frame=frame, bytes=nbytes, blocks=nblocks, label=label, sites=many),
            leaves)


def _event_stack(title: str, stack: Sequence[FrameDoc], frames: _Frames) -> ReportEventStack:
    return ReportEventStack(title=title, frames=frames.ids(stack))


Facts = list[tuple[str, str | None]]  # an event's (name, value) pairs


def _block_facts(block: BlockDoc) -> Facts:
    out: Facts = [("block", f"{block.start} ({block.size} bytes, {block.state})")]
    if block.offset:
        out.append(("offset", str(block.offset)))
    return out


def _add_block(b: BlockDoc | None, facts: Facts, stacks: list[ReportEventStack], frames: _Frames) -> None:
    """An event's block, if it has one: its facts and both of its stacks."""
    if b is None:
        return
    facts += _block_facts(b)
    stacks.append(_event_stack(f"allocated by thread {b.thread}", b.alloc_stack, frames))
    if b.state == "freed":
        stacks.append(_event_stack(f"freed by thread {b.free_thread}", b.free_stack or [], frames))


def events_of(doc: InspectDoc | None, crash: CrashDoc | None, core: str, frames: _Frames,
              process: tuple = ()) -> list[ReportEvent]:
    """The anomalies of one inspect document (doc; None: a core without
    libtag's records) and its crash, as the page's event cards; a crash in
    glibc's malloc family says what it means for the heap (its ``malloc``).
    Each has a key: the same anomaly or crash seen in another core of the
    same process (process: its identity) has the same key."""
    out = []
    for a in doc.anomalies if doc is not None else ():
        facts: Facts = [("address", a.address), ("thread", str(a.thread)), ("time", a.time)]
        stacks = ([] if a.detected_by == "reader" else
                  [_event_stack(f"detected in thread {a.thread}", a.stack, frames)])
        _add_block(a.block, facts, stacks, frames)
        out.append(ReportEvent(kind=a.kind, title=f"{a.kind} of {a.address}", facts=facts, stacks=stacks,
                               cores=[core], key=(*process, "anomaly", a.kind, a.address, a.thread, a.time_ms)))
    c = crash
    if c is not None:
        owner = c.address_owner
        facts = [("signal", c.signal), ("what", c.summary), ("thread", str(c.thread))]
        if c.address is not None:
            facts += [("address", c.address),
                      ("address is", " ".join(x for x in ((owner.owner, owner.region, owner.note)
                                                          if owner is not None else ()) if x))]
        stacks = [_event_stack(f"crashed in thread {c.thread}", c.stack, frames)]
        _add_block(owner.block if owner is not None else None, facts, stacks, frames)
        _add_block(c.cause.block if c.cause is not None else None, facts, stacks, frames)
        m = c.malloc
        if m is not None:
            facts.append(("heap", m.summary))
            if m.chunk is not None:
                facts.append(("chunk", f"{m.chunk.start} ({m.chunk.size} bytes, {m.chunk.state})"))
        out.append(ReportEvent(kind="crash", title=c.summary, facts=facts, stacks=stacks, cores=[core],
                               key=(*process, "crash", c.signal, c.address, c.thread)))
    return out


def _leak(g: LeakGroupDoc, frames: _Frames, wrappers: Wrappers) -> ReportLeak:
    """A leak group as the page lists it: its scalar fields (its kind,
    counts, times, type; each left out where it is null), as inspect --leaks
    prints them, and its stack as the page's frame ids."""
    return ReportLeak(kind=g.kind, blocks=g.blocks, bytes=g.bytes, stack_id=g.stack_id,
                      usable_size=g.usable_size, oldest_alloc_ms=g.oldest_alloc_ms,
                      newest_alloc_ms=g.newest_alloc_ms, type=g.type, indirect_blocks=g.indirect_blocks,
                      indirect_bytes=g.indirect_bytes, cycle_leaders=g.cycle_leaders,
                      frames=frames.ids(g.stack), site=wrappers.site(g.stack))


def _leaks(dump: Any, frames: _Frames, warnings: list[str], wrappers: Wrappers) -> list[ReportLeak] | None:
    """The leak groups, or None (and a warning) when the leak scan failed."""
    try:
        groups = leaks_doc(dump)
    except ForensicsError as e:
        warnings.append(f"leak scan failed: {e.message}")
        return None
    return [_leak(g, frames, wrappers) for g in groups]


def snapshot_point(dump: Any, catalog_time: CatalogTime | None = None, *,
                   crash: CrashDoc | None = None, index: int) -> ReportPoint:
    """One point of the curve: a core's time, reason and live/freed totals
    (a heap without tags: its blocks in use and free in a tcache or a bin,
    by usable size, as inspect counts them; no start time, no snapshot
    sequence, the reason from its crash).  index: its place among the cores
    given; its process is not known yet (-1: ReportBuilder.finish)."""
    t, source = snapshot_time(dump, catalog_time)
    totals = heap_of(dump).totals()
    control = dump.control
    return ReportPoint(
        start_ns=int(control.fields.start_realtime_ns) if control is not None else 0,
        core=os.path.abspath(dump.core.path) if dump.core is not None else dump.mem.name,
        pid=dump.pid,
        exe=dump.exe,
        reason=control.reason if control is not None else "crash" if crash is not None else "on-demand",
        seq=int(control.fields.snapshot_seq) if control is not None else 0,
        time=t,
        time_source=source,
        live_bytes=totals.live_bytes,
        live_blocks=totals.live_blocks,
        freed_bytes=totals.freed_bytes,
        freed_blocks=totals.freed_blocks,
        index=index,
        process=-1,
    )


def heap_events(dump: Any, doc: InspectDoc | None, crash: CrashDoc | None, core: str, frames: _Frames,
                process: tuple = ()) -> list[ReportEvent]:
    """A core's event cards: its anomaly and crash (events_of) and each
    inconsistency found in the heap's records (at most CORRUPTION_LIMIT),
    which have no stacks."""
    out = events_of(doc, crash, core, frames, process)
    for f in heap_of(dump).findings[:CORRUPTION_LIMIT]:
        j = finding_doc(f)
        facts: Facts = [("what", j.message), ("chunk", str(j.chunk)), ("block", str(j.user)),
                        ("arena", str(j.arena))]
        if j.value is not None:
            facts.append(("value", j.value))
        out.append(ReportEvent(kind="corruption", title=f"heap corruption ({j.kind}) at {j.chunk}",
                               facts=facts, stacks=[], cores=[core],
                               key=(*process, "corruption", j.kind, j.chunk, j.value)))
    return out


def size_classes(dump: Any) -> tuple[list[ReportSizeClass], int]:
    """The blocks in use of a heap without stacks by usable size (each exact
    size its own class), most bytes first: (at most SIZE_LIMIT rows, how
    many sizes there are)."""
    _, sizes, _ = heap_of(dump).blocks()
    uniq, counts = np.unique(sizes.astype(np.int64), return_counts=True)
    rows = [ReportSizeClass(usable_size=int(s), chunks=int(n), bytes=int(s) * int(n))
            for s, n in zip(uniq.tolist(), counts.tolist())]
    rows.sort(key=lambda r: (-r.bytes, r.usable_size))
    return rows[:SIZE_LIMIT], len(rows)


class ReportBuilder:
    """Feed it the cores one at a time (add), then take the page's data (finish).

    The newest core (by snapshot time; the later given on a tie) makes the
    hierarchy and the table: add() says when the caller must keep a core
    open for finish()."""

    def __init__(self, *, stack_limit: int = STACK_LIMIT, catalog_time: CatalogTime | None = None,
                 wrappers: Sequence[str] = (), runtime: bool = False,
                 runtime_functions: Sequence[str] = ()) -> None:
        self.stack_limit = stack_limit
        self.runtime = runtime
        self.runtime_functions = list(runtime_functions)
        self.catalog_time = catalog_time
        self.wrappers = Wrappers(wrappers)
        self._events: dict[tuple, int] = {}  # an event's key -> its place in events
        self.frames = _Frames()
        self.points: list[ReportPoint] = []
        self.events: list[ReportEvent] = []
        self.warnings: list[str] = []
        self._newest: tuple[float, int, Any] | None = None
        self._kind: tuple[bool, str] | None = None  # (libtag, a core of that kind)

    def add(self, dump: Any) -> bool:
        """Take what the page needs from dump.  True if dump is the newest so
        far: the caller keeps it open until finish() (or a newer one).
        Cores with libtag and without are not mixed (an InputError)."""
        name = dump.core.path if dump.core is not None else dump.mem.name
        tagged = heap_of(dump).tagged
        if self._kind is None:
            self._kind = (tagged, name)
        elif self._kind[0] != tagged:
            plain, other = (name, self._kind[1]) if self._kind[0] else (self._kind[1], name)
            raise InputError(f"report: {plain} is a core without libtag and {other} is not: "
                             f"give cores of one kind")
        if not tagged and (self.wrappers.patterns != list(WRAPPERS) or self.runtime
                           or self.runtime_functions):
            raise InputError("report: --wrapper, --runtime and --runtime-function read "
                             "allocation stacks, and cores without libtag have none")
        # the anomaly and the crash: libtag's records, else the kernel's signal
        control = dump.control
        doc, crash, events = None, None, True
        if control is None:
            crash = crash_doc(dump)
        elif control.anomaly is not None or control.crash is not None:
            doc = inspect_doc(dump, top=0)
            crash = doc.crash
        else:
            events = False
        point = snapshot_point(dump, self.catalog_time, crash=crash, index=len(self.points))
        self.points.append(point)
        if events:
            self._add_events(heap_events(dump, doc, crash, point.core, self.frames,
                                         (point.pid, point.start_ns)), point.core)
        self._warn(point.core, dump)
        return self._take_newest(point, dump)

    def _add_events(self, events: Iterable[ReportEvent], core: str) -> None:
        """Each event once: one seen in an earlier core (the same key) names
        this core too."""
        for ev in events:
            i = self._events.get(ev.key)
            if i is None:
                self._events[ev.key] = len(self.events)
                self.events.append(ev)
            else:
                seen = self.events[i]
                self.events[i] = dataclasses.replace(seen, cores=[*seen.cores, core])

    def _take_newest(self, point: ReportPoint, dump: Any) -> bool:
        key = (point.time if point.time is not None else float("-inf"), point.index)
        if self._newest is None or key >= self._newest[:2]:
            self._newest = (key[0], key[1], dump)
            return True
        return False

    def _warn(self, core: str, dump: Any) -> None:
        for w in dump.warnings:
            line = f"{core}: {w}"
            if line not in self.warnings:
                self.warnings.append(line)

    def finish(self) -> ReportDoc:
        """The page's data, from every core added; the newest must still be open."""
        if self._newest is None:
            raise InputError("report needs at least one core")
        _, primary, dump = self._newest
        try:
            by_heap = self._by_stack(dump) if heap_of(dump).tagged else self._by_size(dump)
            leaks = _leaks(dump, self.frames, self.warnings, self.wrappers)
            types = live_types(dump, heap_of(dump), top=TYPES_LIMIT)
            self._warn(self.points[primary].core, dump)  # its stacks may add some
        finally:
            self._newest = None
        order, processes, title = self._order()
        return ReportDoc(
            version=DATA_VERSION,
            title=title,
            processes=processes,
            generated=_generated(),
            snapshots=order,
            primary=_place(order, primary),
            frames=self.frames.rows,
            types=types,
            events=self.events,
            leaks=leaks,
            warnings=self.warnings,
            **by_heap,
        )

    def _by_stack(self, dump: Any) -> dict[str, Any]:
        """The page's fields that a libtag heap answers by allocation stack:
        the hierarchy and the stack table."""
        totals = dump.heap.totals
        listed, runtime_totals = top_stacks(dump, runtime=self.runtime,
                                            runtime_functions=self.runtime_functions)
        shown = listed[:self.stack_limit]
        dump.prefetch([sid for sid, _, _, _ in shown])
        stacks = [TopStack(stack=frames_doc(dump.stack(sid)), blocks=n, bytes=b, runtime=rt)
                  for sid, n, b, rt in shown]
        runtime = RuntimeSummary(**runtime_totals)
        tree, leaves = build_tree(stacks, self.frames, total_bytes=totals.live_bytes,
                                  total_blocks=totals.live_blocks,
                                  runtime=None if self.runtime else runtime)
        table = self._table(dump, stacks, leaves, [sid for sid, _, _, _ in shown])
        return dict(stack_stats=table.stats, wrappers=self.wrappers.patterns, runtime=runtime,
                    tree=tree, stacks=table.rows, distinct_stacks=len(listed))

    def _by_size(self, dump: Any) -> dict[str, Any]:
        """The page's fields for a heap without stacks (docs/json.md,
        "forensics report", without libtag): the heap by size class in place
        of the hierarchy and the stack table (leaks go by size too)."""
        sizes, distinct = size_classes(dump)
        return dict(libtag=False, without_libtag=WithoutLibtag.of(heap_of(dump).without),
                    stack_stats=False, wrappers=[], runtime=None, tree=None, stacks=[],
                    distinct_stacks=0, size_classes=sizes, distinct_sizes=distinct)

    def _order(self) -> tuple[list[ReportPoint], list[ReportProcess], str]:
        """(the points in time order, each with its process; the processes;
        the page's title)."""
        order = sorted(self.points, key=lambda p: (p.time is None, p.time or 0, p.index))
        order, processes = _processes(order)
        names = [f"{os.path.basename(p.exe or '?')} (pid {p.pid})" for p in processes]
        if len(names) > 3:
            names = names[:3] + [f"{len(names) - 3} more"]
        return order, processes, "forensics report: " + ", ".join(names)

    def _table(self, dump: Any, stacks: Sequence[TopStack], leaves: Sequence[int],
               sids: Sequence[int]) -> _Table:
        """The table's rows: the stacks shown (their leaves in the tree), then,
        when libtag kept per-stack counters, the stacks with no live block
        that peaked or churned the most; each with its counters and its first
        REPORT_STACK_BLOCKS blocks (for whoowns; a stack with no live block
        has none)."""
        stats = dump.control.stack_stats()
        # (stack id, frame ids, "allocated at", bytes, blocks, leaf, runtime)
        rows: list[tuple[int, list[int], int, int, int, int, bool | None]] = [
            (sid, self.frames.ids(s.stack), self.wrappers.site(s.stack), s.bytes, s.blocks, leaf, s.runtime)
            for s, leaf, sid in zip(stacks, leaves, sids)]
        if stats is not None:
            extra = _stats_only(stats, set(sids))
            dump.prefetch(extra)
            for sid in extra:
                stack = frames_doc(dump.stack(sid))
                rows.append((sid, self.frames.ids(stack), self.wrappers.site(stack), 0, 0, -1, None))
        firsts = blocks_of_stacks(dump, [row[0] for row in rows], REPORT_STACK_BLOCKS)
        out = []
        for sid, ids, site, nbytes, nblocks, node, runtime in rows:
            peak, temps, allocs = _counters(stats, sid)
            out.append(ReportStackRow(frames=ids, site=site, bytes=nbytes, blocks=nblocks, node=node,
                                      runtime=runtime, peak_bytes=peak, temporaries=temps, allocs=allocs,
                                      block_list=firsts[sid], stats=stats is not None))
        return _Table(rows=out, stats=stats is not None)


class _Table(NamedTuple):
    rows: list[ReportStackRow]
    stats: bool  # libtag kept per-stack counters


def _counters(stats: Any, sid: int) -> tuple[int | None, int | None, int | None]:
    """A stack's (peak live bytes, temporaries, allocations) from libtag's
    per-stack counters; None for each where there are none for it."""
    s = stats[sid] if stats is not None and sid < len(stats) else None
    if s is None:
        return None, None, None
    return int(s["peak_bytes"]), int(s["temporaries"]), int(s["allocs"])


def _stats_only(stats: Any, have: set[int]) -> list[int]:
    """The stacks with no live block (none of have) that peaked or churned
    the most: at most STATS_LIMIT by each counter, 2 * STATS_LIMIT in all."""
    extra: list[int] = []
    for key in ("peak_bytes", "temporaries"):
        order = np.argsort(-stats[key].astype(np.int64), kind="stable")
        for sid in order[:STATS_LIMIT + len(have)].tolist():
            if sid and stats[key][sid] and sid not in have and sid not in extra:
                extra.append(sid)
    return extra[:2 * STATS_LIMIT]


def _generated() -> str:
    """When the page was made: UTC, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _place(order: Sequence[ReportPoint], index: int) -> int:
    """Where the point of the index-th core given is in order."""
    return next(i for i, p in enumerate(order) if p.index == index)


def _processes(points: list[ReportPoint]) -> tuple[list[ReportPoint], list[ReportProcess]]:
    """The processes the cores are of, in the order of their first core, and
    the points, each with its process (an index into them)."""
    first: dict[tuple, int] = {}
    of: list[ReportPoint] = []  # each process's first point
    count: list[int] = []
    out = []
    for p in points:
        key = (p.pid, p.start_ns)
        i = first.get(key)
        if i is None:
            i = first[key] = len(of)
            of.append(p)
            count.append(0)
        count[i] += 1
        out.append(dataclasses.replace(p, process=i))
    return out, [ReportProcess(pid=p.pid, exe=p.exe, cores=n) for p, n in zip(of, count)]
