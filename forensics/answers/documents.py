"""The documents the verbs answer with, as types: what ``output/`` renders
and what ``--json`` prints (docs/json.md is their contract).

    doc = trend_doc(...)          # an answer builds a TrendDoc
    text.show_trend(doc)          # output/ reads its attributes
    to_json(doc)                  # the one way to the documented JSON

Each document and each shape inside one is a frozen dataclass whose fields
are docs/json.md's fields, in the order ``--json`` prints them, spelled as
there (tests/unit/test_documents.py holds the two against each other, both
ways).  Why dataclasses and not TypedDicts: the renderers read attributes
the type checker and a test can see, a misspelt field is an error where the
document is built (not a missing key where it is printed), and the JSON is
made in one place, ``to_json``, instead of by every builder.

Two kinds of field say more than a name and a type:

- ``renamed("in")``: the JSON key is not a Python name;
- ``omitted()``: docs/json.md says the key is left out where it does not
  apply ("only with --blocks N", "definite groups only"): the field is None
  then, and ``to_json`` leaves the key out.  Every other None is ``null``.
  ``omitted(unless="glibc")``: a key that is null where the document's
  ``glibc`` is true and left out where it is false (the crash's ``malloc``:
  null for a crash of a glibc heap that has nothing to do with malloc, no
  key with libtag);
- ``hidden()``: a fact of the document that is no JSON key (what
  ``omitted(unless=...)`` asks).

The document types are keyword-only: a field's place is its place in the
JSON, so a field left out (``omitted()``, with its default) may come before
one that is always there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# ------------------------------------------------------------- to_json --

_JSON_KEY = "json_key"
_OMIT_NONE = "omit_if_none"
_HIDDEN = "hidden"


def renamed(key: str, **kw: Any) -> Any:
    """A field whose JSON key is KEY (a Python keyword: ``in``)."""
    return field(metadata={_JSON_KEY: key}, **kw)


def omitted(unless: str | None = None) -> Any:
    """A field docs/json.md leaves out where it does not apply: None here,
    no key in the JSON - unless the document's attribute *unless* is true:
    then None is null."""
    return field(default=None, metadata={_OMIT_NONE: unless or True})


def hidden(default: Any) -> Any:
    """A fact of the document that ``to_json`` does not print."""
    return field(default=default, repr=False, metadata={_HIDDEN: True})


_PLAN: dict[type, tuple[tuple[str, str, bool | str], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, str, bool | str], ...]:
    """(attribute, JSON key, when it is left out) of each field that is a
    JSON key, in order: False never, True when None, "attr" when None and
    the document's attr is false."""
    plan = _PLAN.get(cls)
    if plan is None:
        plan = _PLAN[cls] = tuple((f.name, f.metadata.get(_JSON_KEY, f.name), f.metadata.get(_OMIT_NONE, False))
                                  for f in dataclasses.fields(cls) if not f.metadata.get(_HIDDEN))
    return plan


def to_json(value: Any) -> Any:
    """A document (a dataclass of this module, or a list or dict of them) as
    plain JSON data: each dataclass an object with its fields in order,
    under their JSON keys; None is null; a list or tuple an array."""
    cls = type(value)
    if dataclasses.is_dataclass(cls):
        out = {}
        for attr, key, omit in _plan(cls):
            v = getattr(value, attr)
            if v is None and omit and (omit is True or not getattr(value, omit)):
                continue
            out[key] = to_json(v)
        return out
    if cls is list or cls is tuple:
        return [to_json(v) for v in value]
    if cls is dict:
        return {k: to_json(v) for k, v in value.items()}
    return value


def document_types() -> list[type]:
    """Every document type of this module (for the test against docs/json.md)."""
    return [v for v in globals().values() if isinstance(v, type) and dataclasses.is_dataclass(v)]


_MISSING = dataclasses.MISSING
_INIT: dict[type, tuple[tuple[str, Any], ...]] = {}


def _init_plan(cls: type) -> tuple[tuple[str, Any], ...]:
    """(field, default or _MISSING) of each of cls's fields, in order."""
    plan = _INIT.get(cls)
    if plan is None:
        plan = _INIT[cls] = tuple((f.name, f.default) for f in dataclasses.fields(cls))
    return plan


class _Doc:
    """What every document type shares, written once here: the keyword-only
    constructor, being frozen, and equality, hash and repr by fields.  The
    dataclass decorator would generate (exec) five or six methods for each
    of the 67 types: ~50 ms of every command's start-up."""

    __slots__ = ()

    def __init__(self, /, **kw: Any) -> None:  # "self" is a field too (SenderDoc)
        cls = self.__class__
        for name, default in _INIT.get(cls) or _init_plan(cls):
            if name in kw:
                value = kw.pop(name)
            elif default is _MISSING:
                raise TypeError(f"{cls.__qualname__}() missing required keyword argument: {name!r}")
            else:
                value = default
            object.__setattr__(self, name, value)
        if kw:
            raise TypeError(f"{cls.__qualname__}() got an unexpected keyword argument {next(iter(kw))!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __getstate__(self) -> tuple:  # copy and pickle: fields in order
        return tuple(getattr(self, name) for name, _ in _init_plan(self.__class__))

    def __setstate__(self, state: tuple) -> None:
        for (name, _), value in zip(_init_plan(self.__class__), state):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.compare)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.__class__, self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
        return f"{self.__class__.__qualname__}({inner})"


# slots, fields and their order from the decorator; the rest from _Doc
# (kw_only=True keeps dataclasses' own checks of the field order)
_frozen = dataclass(init=False, slots=True, kw_only=True, eq=False, repr=False)

# ------------------------------------------------------- shared shapes --


@_frozen
class FrameDoc(_Doc):
    """docs/json.md, "frame"."""
    address: str | None
    function: str | None
    file: str | None
    line: int | None
    module: str | None
    inlined: bool
    libtag: bool
    module_offset: str | None


@_frozen
class BlockDoc(_Doc):
    """docs/json.md, "block": one tagged heap block."""
    start: str
    size: int
    offset: int
    state: str
    thread: int
    alloc_stack: list[FrameDoc]
    free_stack: list[FrameDoc] | None
    free_thread: int | None
    alloc_kind: str
    alloc_time: str | None
    free_time: str | None
    age_s: float | None
    guarded: bool


@_frozen
class ChunkDoc(_Doc):
    """docs/json.md, "Without libtag", a chunk: one of glibc's."""
    start: str
    user: str
    size: int
    usable: int
    offset: int
    state: str
    bin: str | None
    bin_index: int | None
    tcache_thread: int | None
    arena: str | None
    arena_kind: str | None
    arena_threads: list[int]
    size_field: str | None


@_frozen
class SnapshotRef(_Doc):
    """docs/json.md, "snapshot (in diff and trend)"."""
    core: str
    pid: int
    snapshot_seq: int
    time_ms: int
    reason: str
    live_blocks: int
    live_bytes: int


@_frozen
class WithoutLibtag(_Doc):
    """docs/json.md, "Without libtag": what a heap without tags cannot say."""
    unknown: list[str]
    hint: str
    summary: str

    @classmethod
    def of(cls, heap_without: dict | None) -> "WithoutLibtag | None":
        """From a heap source's ``without`` (forensics.heaps)."""
        return None if heap_without is None else cls(**heap_without)


@_frozen
class Counts(_Doc):
    """``blocks`` and ``bytes`` (of a side of a diff entry, of a leak kind)."""
    blocks: int
    bytes: int


# --------------------------------------------------------------- trend --


@_frozen
class TrendStack(_Doc):
    """One allocation stack across the snapshots (trend's ``stacks``)."""
    stack: list[FrameDoc]
    stack_id: int
    blocks: list[int]
    bytes: list[int]
    monotonic: bool
    growth_bytes: int
    growth_blocks: int


@_frozen
class TrendDoc(_Doc):
    """docs/json.md, "forensics trend"."""
    snapshots: list[SnapshotRef]
    same_process: bool
    stacks: list[TrendStack]
    monotonic_stacks: int
    stacks_total: int


# ---------------------------------------------------------------- diff --


@_frozen
class DiffEntry(_Doc):
    """docs/json.md, diff's "entry": one allocation stack's change."""
    stack: list[FrameDoc]
    blocks: int
    bytes: int
    stack_id: int
    old: Counts
    new: Counts
    survived: int
    added: int
    added_bytes: int
    gone: int
    gone_bytes: int
    same_size_share: float
    common_size: int | None
    addresses: list[str]


@_frozen
class DiffDoc(_Doc):
    """docs/json.md, "forensics diff" (two cores with libtag)."""
    old: SnapshotRef
    new: SnapshotRef
    same_process: bool
    growth: list[DiffEntry]
    no_growth: list[DiffEntry]
    new_blocks: int
    gone_blocks: int
    survived_blocks: int
    new_bytes: int
    gone_bytes: int
    warnings: list[str]


@_frozen
class SizeDiffSide(_Doc):
    """A core of a diff without libtag: its chunks in use."""
    core: str
    pid: int
    chunks: int
    bytes: int


@_frozen
class SizeClassChange(_Doc):
    """One usable size's change (a size diff's ``size_classes``)."""
    usable_size: int
    old_chunks: int
    new_chunks: int
    old_bytes: int
    new_bytes: int
    chunks: int
    bytes: int
    kept: int
    added: int
    gone: int


@_frozen
class SizeDiffDoc(_Doc):
    """docs/json.md, "Without libtag", diff: by chunk size."""
    libtag: bool
    without_libtag: WithoutLibtag
    old: SizeDiffSide
    new: SizeDiffSide
    same_process: bool
    new_chunks: int
    gone_chunks: int
    kept_chunks: int
    size_classes: list[SizeClassChange]
    warnings: list[str]


# --------------------------------------------------------------- leaks --


@_frozen
class LeakAge(_Doc):
    """A leak group's ``age_ms``: the oldest and newest block's age."""
    oldest: int
    newest: int


@_frozen
class LeakGroupDoc(_Doc):
    """docs/json.md, "A leak group"."""
    kind: str
    blocks: int
    bytes: int
    stack: list[FrameDoc]
    stack_id: int | None
    usable_size: int | None
    oldest_alloc_ms: int | None
    newest_alloc_ms: int | None
    age_ms: LeakAge | None
    examples: list[str]
    type: str | None
    indirect_blocks: int | None = omitted()  # definite groups only
    indirect_bytes: int | None = omitted()
    cycle_leaders: int | None = omitted()


@_frozen
class LeakTotals(_Doc):
    """A leak check's ``totals``: each kind's blocks and bytes."""
    definite: Counts
    indirect: Counts
    possible: Counts


@_frozen
class SuppressedPattern(_Doc):
    """A suppression that matched, and what it left out."""
    pattern: str
    blocks: int
    bytes: int


@_frozen
class Suppressed(_Doc):
    """A leak check's ``suppressed``."""
    blocks: int
    bytes: int
    patterns: list[SuppressedPattern]


@_frozen
class LeakCheckDoc(_Doc):
    """docs/json.md, "forensics run --leaks", a process."""
    pid: int
    exe: str | None
    core: str
    reason: str
    leaks: list[LeakGroupDoc]
    totals: LeakTotals
    suppressed: Suppressed
    leaked: bool
    warnings: list[str]


@_frozen
class LeakRunDoc(_Doc):
    """docs/json.md, "forensics run --leaks --json FILE"."""
    command: list[str]
    exit_status: int
    status: int
    leaked: bool
    processes: list[LeakCheckDoc]
    unchecked: list[int]


# ------------------------------------------- snapshot, attach, list --


@_frozen
class SnapshotDoc(_Doc):
    """docs/json.md, "forensics snapshot": one snapshot taken."""
    pid: int
    core: str
    reason: str
    pause_ms: float
    core_bytes: int
    disk_bytes: int | None
    dir: str
    seq: int
    exe: str | None
    time: float | None
    threads_stopped: int | None
    handed_over: bool
    method: str
    reap_ms: float | None


@_frozen
class AttachDoc(_Doc):
    """docs/json.md, "forensics attach"."""
    pid: int
    tid: int
    library: str
    rebound: int
    held_ms: float


@_frozen
class CatalogEntryDoc(_Doc):
    """docs/json.md, "forensics list": one snapshot of the catalog, or one
    core systemd-coredump holds (``source``)."""
    id: int | None  # the catalog row; None for a coredump
    core: str | None  # None: systemd-coredump kept no file
    dir: str | None
    pid: int
    exe: str | None
    time: float | None
    reason: str
    pause_ms: float | None
    core_bytes: int | None
    summary: dict[str, Any]  # as libtag's snapshot info said it: keys sorted
    exists: bool
    disk_bytes: int | None
    source: str = "catalog"  # "catalog" | "systemd-coredump"
    kind: str = "snapshot"  # "snapshot" | "crash"
    signal: str | None = None  # a coredump's signal
    corefile: str | None = None  # coredumpctl's COREFILE ("present", "missing", ...)
    libtag: bool | None = None  # from the core's notes; None when they cannot be read
    compression: str | None = None  # "zstd" | "lz4" | "xz" | None


# ------------------------------------------------------------- inspect --


@_frozen
class ProcessRef(_Doc):
    """inspect's ``process``."""
    pid: int
    exe: str | None


@_frozen
class HeapTotals(_Doc):
    """inspect's ``heap``."""
    live_blocks: int
    live_bytes: int
    freed_blocks: int
    freed_bytes: int


@_frozen
class AnomalyDoc(_Doc):
    """docs/json.md, inspect's "An anomaly"."""
    kind: str
    address: str
    block: BlockDoc | None
    stack: list[FrameDoc]
    thread: int | None
    time: str | None
    time_ms: int | None
    offset: int | None
    written: str | None
    dealloc: str | None
    access: str | None
    pc: str | None
    detected_by: str


@_frozen
class SenderDoc(_Doc):
    """The crash's ``sender``: who sent the signal."""
    pid: int
    uid: int
    self: bool


@_frozen
class CauseDoc(_Doc):
    """The crash's ``cause``: what led to a fault whose address was decoded."""
    kind: str
    register: str | None
    value: str | None
    loaded_from: str | None
    load: str | None
    load_in: str | None
    block: BlockDoc | None


@_frozen
class AddressOwnerDoc(_Doc):
    """The crash's ``address_owner``: what the address is."""
    owner: str
    region: str | None
    note: str
    block: BlockDoc | None
    # glibc's chunk: null without libtag, no key with libtag (unless a chunk
    # from before libtag was attached holds the address)
    chunk: ChunkDoc | None = omitted(unless="chunks")
    chunks: bool = hidden(False)


@_frozen
class MallocDoc(_Doc):
    """The crash's ``malloc``: a crash in glibc's malloc family."""
    call: str | None
    glibc_message: str | None
    chunk: ChunkDoc | None
    summary: str


@_frozen
class CrashDoc(_Doc):
    """docs/json.md, inspect's "The crash"."""
    signal: str
    address: str | None
    address_source: str | None
    sender: SenderDoc | None
    instruction: str | None
    cause: CauseDoc | None
    summary: str
    thread: int
    time: str | None
    time_ms: int | None
    stack: list[FrameDoc]
    code: int
    code_name: str | None
    address_owner: AddressOwnerDoc | None
    malloc: MallocDoc | None = omitted(unless="glibc")  # a heap of glibc's only
    glibc: bool = hidden(False)


@_frozen
class TopStack(_Doc):
    """One of inspect's ``top_stacks``."""
    stack: list[FrameDoc]
    blocks: int
    bytes: int
    runtime: bool


@_frozen
class RuntimeSummary(_Doc):
    """inspect's ``runtime``: the C and C++ runtimes' own live blocks."""
    blocks: int
    bytes: int
    stacks: int
    shown: bool


@_frozen
class ThreadDoc(_Doc):
    """One of inspect's ``threads``."""
    tid: int
    sp: str | None
    stack: list[FrameDoc]


@_frozen
class Counters(_Doc):
    """inspect's ``counters``: libtag's, summed over the threads."""
    allocs: int
    frees: int
    alloc_bytes: int
    free_bytes: int
    threads: int
    anomalies: int
    stack_nodes: int
    stack_full: int
    shadow_overflows: int
    snapshot_seq: int
    latent_uaf: int
    damaged_leaked: int
    damaged_bytes: int
    guard_rate: int
    guard_slots_used: int
    guard_faults: int


@_frozen
class TypeCount(_Doc):
    """One row of inspect's (and the report's) ``types``."""
    type: str
    blocks: int
    bytes: int


@_frozen
class StackBlock(_Doc):
    """One block of inspect's ``stack_blocks`` (and of the report's ``block_list``)."""
    start: str
    size: int
    thread: int
    age_ms: int | None


@_frozen
class StackBlocksDoc(_Doc):
    """inspect's ``stack_blocks`` (--blocks N)."""
    rank: int
    stack: list[FrameDoc]
    count: int
    bytes: int
    blocks: list[StackBlock]


@_frozen
class SignatureDoc(_Doc):
    """docs/json.md, "signature"."""
    version: int
    kind: str
    frames: list[str]
    alloc_frames: list[str]
    text: str
    id: str


@_frozen
class ChunkCount(_Doc):
    """{state: this} of glibc's map."""
    chunks: int
    bytes: int


@_frozen
class HeapSpan(_Doc):
    """An arena's heap: the sbrk heap or one heap_info heap."""
    start: str
    end: str


@_frozen
class ArenaDoc(_Doc):
    """One of glibc's arenas (``glibc.arenas``)."""
    address: str
    kind: str
    threads: list[int]
    top: str | None
    top_size: int | None
    system_mem: int
    heaps: list[HeapSpan]
    chunks: dict[str, ChunkCount]


@_frozen
class TcacheDoc(_Doc):
    """A thread's tcache (``glibc.tcaches``)."""
    thread: int
    address: str


@_frozen
class SizeRow(_Doc):
    """One chunk size of ``glibc.top_sizes``."""
    size: int
    usable: int
    chunks: int
    bytes: int


@_frozen
class TopSizes(_Doc):
    """``glibc.top_sizes``."""
    by_bytes: list[SizeRow]
    by_count: list[SizeRow]


@_frozen
class FindingDoc(_Doc):
    """An inconsistency in glibc's heap (``glibc.corruption``)."""
    kind: str
    chunk: str | None
    user: str | None
    arena: str | None
    value: str | None
    message: str


@_frozen
class GlibcMap(_Doc):
    """docs/json.md, "Without libtag", ``glibc``: glibc's map of its heap."""
    libc: str
    build_id: str
    version: str | None
    layout_from: str
    arenas: list[ArenaDoc]
    chunks: dict[str, ChunkCount]
    tcaches: list[TcacheDoc]
    top_sizes: TopSizes
    corruption: list[FindingDoc]
    abort_message: str | None


@_frozen
class InspectDoc(_Doc):
    """docs/json.md, "forensics inspect"."""
    core: str
    process: ProcessRef
    reason: str
    payload: str
    libtag: bool
    crash: CrashDoc | None
    heap: HeapTotals
    anomalies: list[AnomalyDoc]
    top_stacks: list[TopStack]
    runtime: RuntimeSummary | None = omitted()  # with libtag only
    threads: list[ThreadDoc]
    counters: Counters | None
    glibc: GlibcMap | None = omitted()  # without libtag, or after an attach
    types: list[TypeCount]
    without_libtag: WithoutLibtag | None = omitted()
    signature: SignatureDoc | None
    warnings: list[str]  # the dump's own list: what reading later adds is printed too
    leaks: list[LeakGroupDoc] | None = omitted()  # --leaks
    stack_blocks: StackBlocksDoc | None = omitted()  # --blocks N


# ------------------------------------------------------------- whoowns --


@_frozen
class RegionDoc(_Doc):
    """whoowns' ``region``: the mapping holding the address."""
    name: str
    start: str | None
    end: str | None


@_frozen
class ReferrerDoc(_Doc):
    """One of whoowns' ``referrers``: a word pointing into the block."""
    address: str
    in_: str = renamed("in")
    block_start: str | None
    interior: bool
    thread: int | None
    module: str | None
    symbol: str | None


@_frozen
class RootDoc(_Doc):
    """A retention path's ``root``."""
    kind: str
    address: str | None
    thread: int | None
    register: str | None
    module: str | None
    symbol: str | None
    section: str | None
    function: str | None
    interior: bool


@_frozen
class PathLink(_Doc):
    """One block of a retention path."""
    address: str
    block_start: str
    size: int
    offset: int
    interior: bool


@_frozen
class RetainerDoc(_Doc):
    """One of whoowns' ``retainers``: a root and the blocks from it."""
    root: RootDoc
    path: list[PathLink]


@_frozen
class DataSymbolDoc(_Doc):
    """whoowns' ``symbol``: the global holding the address."""
    name: str | None
    offset: int
    section: str | None
    module: str


@_frozen
class UseAfterFreeDoc(_Doc):
    """whoowns' ``use_after_free``: a freed block written after it was freed."""
    address: str
    offset: int
    written: str | None


@_frozen
class NearDoc(_Doc):
    """whoowns' ``near``: the block the address is just past."""
    block: BlockDoc
    past_end: int


@_frozen
class WhoownsDoc(_Doc):
    """docs/json.md, "forensics whoowns"."""
    core: str
    address: str
    owner: str
    block: BlockDoc | None
    region: RegionDoc | None
    referrers: list[ReferrerDoc]
    referrer_count: int
    self_referrers: int
    retainers: list[RetainerDoc] | None
    retainer_count: int | None
    retainers_depth_limited: bool
    note: str
    symbol: DataSymbolDoc | None
    use_after_free: UseAfterFreeDoc | None
    libtag: bool
    chunk: ChunkDoc | None
    type: str | None
    without_libtag: WithoutLibtag | None = omitted()
    thread: int | None = omitted()  # owner "stack"
    near: NearDoc | None = omitted()
    warnings: list[str]


# -------------------------------------------------------------- report --
# The report page's data (docs/json.md, "forensics report"): not printed on
# stdout but carried in the page, which its own script draws; made JSON by
# to_json like every other document.


@_frozen
class ReportPoint(_Doc):
    """One of the report's ``snapshots``: a core, a point of the curve."""
    start_ns: int
    core: str
    pid: int
    exe: str | None
    reason: str
    seq: int
    time: float | None
    time_source: str
    live_bytes: int
    live_blocks: int
    freed_bytes: int
    freed_blocks: int
    index: int  # its place among the cores as given
    process: int  # its process: an index into ReportDoc.processes (-1 until finish() knows them)


@_frozen
class ReportProcess(_Doc):
    """One of the report's ``processes``."""
    pid: int
    exe: str | None
    cores: int


@_frozen
class ReportFrame(_Doc):
    """One of the report's ``frames``: a distinct frame, referred to by index."""
    address: str | None
    function: str | None
    file: str | None
    line: int | None
    module: str | None
    module_offset: str | None
    label: str


@_frozen
class ReportTree(_Doc):
    """The report's ``tree``: the hierarchy as parallel arrays, node 0 the root."""
    parent: list[int]
    frame: list[int]
    bytes: list[int]
    blocks: list[int]
    label: dict[str, str]  # {node: name} of the nodes that are no frame
    sites: dict[str, list[int]]  # {node: frames} of the nodes that merged call sites


@_frozen
class ReportStackRow(_Doc):
    """One of the report's ``stacks``: a row of the page's table."""
    frames: list[int]
    site: int
    bytes: int
    blocks: int
    node: int
    runtime: bool | None = omitted()  # no key on a row of a stack with no live block
    # libtag's per-stack counters: no keys where it kept none (stats false),
    # null for a stack it has none for
    peak_bytes: int | None = omitted(unless="stats")
    temporaries: int | None = omitted(unless="stats")
    allocs: int | None = omitted(unless="stats")
    block_list: list[StackBlock]
    stats: bool = hidden(False)


@_frozen
class ReportEventStack(_Doc):
    """One of a report event's ``stacks``."""
    title: str
    frames: list[int]


@_frozen
class ReportEvent(_Doc):
    """One of the report's ``events``: an anomaly, crash or heap inconsistency."""
    kind: str
    title: str
    facts: list[tuple[str, str | None]]  # (name, value), each a JSON array of two
    stacks: list[ReportEventStack]
    cores: list[str]
    # the same event in another core of the process has the same key
    key: tuple = hidden(())


@_frozen
class ReportLeak(_Doc):
    """One of the report's ``leaks``: a leak group's scalar fields (each left
    out where it is null), its stack as frame indexes, and where it allocated."""
    kind: str
    blocks: int
    bytes: int
    stack_id: int | None = omitted()
    usable_size: int | None = omitted()
    oldest_alloc_ms: int | None = omitted()
    newest_alloc_ms: int | None = omitted()
    type: str | None = omitted()
    indirect_blocks: int | None = omitted()  # definite groups only
    indirect_bytes: int | None = omitted()
    cycle_leaders: int | None = omitted()
    frames: list[int]
    site: int


@_frozen
class ReportSizeClass(_Doc):
    """One of the report's ``size_classes`` (without libtag)."""
    usable_size: int
    chunks: int
    bytes: int


@_frozen
class ReportDoc(_Doc):
    """docs/json.md, "forensics report": the page's data."""
    version: int
    libtag: bool | None = omitted()  # false without libtag; no key with libtag
    without_libtag: WithoutLibtag | None = omitted()
    title: str
    processes: list[ReportProcess]
    stack_stats: bool
    wrappers: list[str]
    runtime: RuntimeSummary | None
    generated: str
    snapshots: list[ReportPoint]
    primary: int
    frames: list[ReportFrame]
    tree: ReportTree | None
    stacks: list[ReportStackRow]
    distinct_stacks: int
    size_classes: list[ReportSizeClass] | None = omitted()  # without libtag only
    distinct_sizes: int | None = omitted()
    types: list[TypeCount]
    events: list[ReportEvent]
    leaks: list[ReportLeak] | None
    warnings: list[str]

    @property
    def tagged(self) -> bool:
        """Of cores with libtag (their data has no ``libtag`` key)."""
        return self.libtag is None
