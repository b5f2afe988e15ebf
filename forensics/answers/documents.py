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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# ------------------------------------------------------------- to_json --

_JSON_KEY = "json_key"
_OMIT_NONE = "omit_if_none"


def renamed(key: str, **kw: Any) -> Any:
    """A field whose JSON key is KEY (a Python keyword: ``in``)."""
    return field(metadata={_JSON_KEY: key}, **kw)


def omitted() -> Any:
    """A field docs/json.md leaves out where it does not apply: None here,
    no key in the JSON."""
    return field(default=None, metadata={_OMIT_NONE: True})


_PLAN: dict[type, tuple[tuple[str, str, bool], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, str, bool], ...]:
    """(attribute, JSON key, left out when None) of each field, in order."""
    plan = _PLAN.get(cls)
    if plan is None:
        plan = _PLAN[cls] = tuple((f.name, f.metadata.get(_JSON_KEY, f.name),
                                   bool(f.metadata.get(_OMIT_NONE))) for f in dataclasses.fields(cls))
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
            if v is None and omit:
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


_frozen = dataclass(frozen=True, slots=True)

# ------------------------------------------------------- shared shapes --


@_frozen
class FrameDoc:
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
class SnapshotRef:
    """docs/json.md, "snapshot (in diff and trend)"."""
    core: str
    pid: int
    snapshot_seq: int
    time_ms: int
    reason: str
    live_blocks: int
    live_bytes: int


@_frozen
class WithoutLibtag:
    """docs/json.md, "Without libtag": what a heap without tags cannot say."""
    unknown: list[str]
    hint: str
    summary: str

    @classmethod
    def of(cls, heap_without: dict | None) -> "WithoutLibtag | None":
        """From a heap source's ``without`` (forensics.heaps)."""
        return None if heap_without is None else cls(**heap_without)


@_frozen
class Counts:
    """``blocks`` and ``bytes`` (of a side of a diff entry, of a leak kind)."""
    blocks: int
    bytes: int


# --------------------------------------------------------------- trend --


@_frozen
class TrendStack:
    """One allocation stack across the snapshots (trend's ``stacks``)."""
    stack: list[FrameDoc]
    stack_id: int
    blocks: list[int]
    bytes: list[int]
    monotonic: bool
    growth_bytes: int
    growth_blocks: int


@_frozen
class TrendDoc:
    """docs/json.md, "forensics trend"."""
    snapshots: list[SnapshotRef]
    same_process: bool
    stacks: list[TrendStack]
    monotonic_stacks: int
    stacks_total: int


# ---------------------------------------------------------------- diff --


@_frozen
class DiffEntry:
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
class DiffDoc:
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
class SizeDiffSide:
    """A core of a diff without libtag: its chunks in use."""
    core: str
    pid: int
    chunks: int
    bytes: int


@_frozen
class SizeClassChange:
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
class SizeDiffDoc:
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
class LeakAge:
    """A leak group's ``age_ms``: the oldest and newest block's age."""
    oldest: int
    newest: int


@_frozen
class LeakGroupDoc:
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
class LeakTotals:
    """A leak check's ``totals``: each kind's blocks and bytes."""
    definite: Counts
    indirect: Counts
    possible: Counts


@_frozen
class SuppressedPattern:
    """A suppression that matched, and what it left out."""
    pattern: str
    blocks: int
    bytes: int


@_frozen
class Suppressed:
    """A leak check's ``suppressed``."""
    blocks: int
    bytes: int
    patterns: list[SuppressedPattern]


@_frozen
class LeakCheckDoc:
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
class LeakRunDoc:
    """docs/json.md, "forensics run --leaks --json FILE"."""
    command: list[str]
    exit_status: int
    status: int
    leaked: bool
    processes: list[LeakCheckDoc]
    unchecked: list[int]


# ------------------------------------------- snapshot, attach, list --


@_frozen
class SnapshotDoc:
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
class AttachDoc:
    """docs/json.md, "forensics attach"."""
    pid: int
    tid: int
    library: str
    rebound: int
    held_ms: float


@_frozen
class CatalogEntryDoc:
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
