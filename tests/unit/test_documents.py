"""docs/json.md and the document types say the same fields.

GIVEN docs/json.md (the contract for scripts) and forensics.answers.documents
(the types the answers build and ``--json`` prints through ``to_json``)
WHEN each type's fields (their JSON keys) are compared with the fields
docs/json.md lists for that document - a table's rows, or the fields an
object's description names in one cell or paragraph
THEN they are the same set: a documented field missing from the type fails,
and a field of the type that is not documented fails.
AND to_json keeps the fields' order and spellings, turns None into null,
and leaves out only the fields docs/json.md says are left out.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from forensics.answers import documents as D

ROOT = Path(__file__).resolve().parents[2]
JSON_MD = ROOT / "docs" / "json.md"

_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _doc() -> str:
    if not JSON_MD.is_file():
        pytest.skip(f"no source checkout at {ROOT}")
    return JSON_MD.read_text()


def _tables(md: str) -> list[tuple[str, str, list[list[str]]]]:
    """(heading, caption: the paragraph just before it, rows) of every
    field table, rows as their cells."""
    out, heading, caption, rows, para = [], "", "", None, False
    for line in md.splitlines():
        if line.startswith("| field |"):
            rows = []
            out.append((heading, caption, rows))
            continue
        if line.startswith("|") and rows is not None:
            if not line.startswith("|---"):
                rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
            continue
        if line.startswith("#"):
            heading = caption = line.lstrip("#").strip()
        elif line.strip():
            caption = line.strip() if rows is not None or not para else f"{caption} {line.strip()}"
        para = bool(line.strip()) and not line.startswith("#")
        rows = None
    return out


def _table(heading: str, caption: str | None = None) -> list[list[str]]:
    """The rows of the first table under the heading that starts so (whose
    caption starts with caption, when given)."""
    for h, c, rows in _tables(_doc()):
        if h.startswith(heading) and (caption is None or c.startswith(caption)):
            return rows
    raise AssertionError(f"docs/json.md has no field table under {heading!r} {caption or ''}")


def _names(text: str) -> list[str]:
    """The field names (backticked) of a description at its top level: not
    inside (), [] or {} - those describe the fields."""
    depth, out, i = 0, [], 0
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "`":
            end = text.index("`", i + 1)
            word = text[i + 1:end]
            if depth == 0 and _NAME.fullmatch(word):
                out.append(word)
            i = end
        i += 1
    return out


def _between(text: str, start: str | None, end: str | None) -> str:
    if start is not None:
        assert start in text, f"{start!r} is not in {text!r}"
        text = text[text.index(start) + len(start):]
    if end is not None:
        assert end in text, f"{end!r} is not in {text!r}"
        text = text[:text.index(end)]
    return text


def table_fields(heading: str, caption: str | None = None) -> set[str]:
    return {n for row in _table(heading, caption) for n in _names(row[0])}


def cell_fields(heading: str, caption: str | None, row: str, start: str | None = None,
                end: str | None = None) -> set[str]:
    """The fields named in the meaning of ROW of a table (between start and end)."""
    for cells in _table(heading, caption):
        if row in _names(cells[0]):
            return set(_names(_between(cells[-1], start, end)))
    raise AssertionError(f"no row {row!r} in the table under {heading!r}")


def paragraph_fields(first: str, start: str | None = None, end: str | None = None) -> set[str]:
    """The fields a paragraph that starts with FIRST names."""
    for para in re.split(r"\n\s*\n", _doc()):
        if para.lstrip().startswith(first):
            return set(_names(_between(" ".join(para.split()), start, end)))
    raise AssertionError(f"docs/json.md has no paragraph starting {first!r}")


TREND = "`forensics trend"
DIFF = "`forensics diff"
RUN_LEAKS = "`forensics run --leaks"
INSPECT = "`forensics inspect"
WHOOWNS = "`forensics whoowns"
WITHOUT = "Without libtag"
REPORT = "`forensics report"
REPORT_DATA = "The page's data"
MALLOC = "The crash's `malloc`"

# Each document type, and where docs/json.md lists its fields.
DOCUMENTED = {
    D.FrameDoc: lambda: table_fields("frame"),
    D.SnapshotRef: lambda: table_fields("snapshot (in diff and trend)"),
    D.WithoutLibtag: lambda: paragraph_fields("`without_libtag`:", start=":"),
    D.TrendDoc: lambda: table_fields(TREND),
    D.TrendStack: lambda: cell_fields(TREND, None, "stacks", start="grown:"),
    D.DiffDoc: lambda: table_fields(DIFF),
    D.DiffEntry: lambda: table_fields(DIFF, "An entry:"),
    D.Counts: lambda: cell_fields(DIFF, "An entry:", "old"),
    D.SizeDiffDoc: lambda: table_fields("Without libtag", "The diff of two cores without libtag"),
    D.SizeDiffSide: lambda: cell_fields("Without libtag", "The diff of two cores without libtag", "old"),
    D.SizeClassChange: lambda: cell_fields("Without libtag", "The diff of two cores without libtag",
                                           "size_classes", start="changed:", end="(in one process"),
    D.LeakGroupDoc: lambda: table_fields(INSPECT, "A leak group"),
    D.LeakAge: lambda: cell_fields(INSPECT, "A leak group", "age_ms", end=":"),
    D.LeakRunDoc: lambda: table_fields(RUN_LEAKS),
    D.LeakCheckDoc: lambda: table_fields(RUN_LEAKS, "A process:"),
    D.LeakTotals: lambda: cell_fields(RUN_LEAKS, "A process:", "totals", end=":"),
    D.Suppressed: lambda: cell_fields(RUN_LEAKS, "A process:", "suppressed"),
    D.SnapshotDoc: lambda: table_fields("`forensics snapshot PID --json`"),
    D.AttachDoc: lambda: table_fields("`forensics attach PID --json`"),
    D.CatalogEntryDoc: lambda: table_fields("`forensics list --json`"),
    D.SuppressedPattern: lambda: cell_fields(RUN_LEAKS, "A process:", "suppressed", start="`patterns`: [{",
                                             end="}]"),
    # the shared block, and glibc's chunk and map (json.md, "Without libtag")
    D.BlockDoc: lambda: table_fields("block"),
    D.ChunkDoc: lambda: table_fields(WITHOUT, "A chunk ("),
    D.GlibcMap: lambda: table_fields(WITHOUT, "`glibc`:"),
    D.ArenaDoc: lambda: cell_fields(WITHOUT, "`glibc`:", "arenas", start="list order:"),
    D.HeapSpan: lambda: cell_fields(WITHOUT, "`glibc`:", "arenas", start="`heaps` ([{", end="}]"),
    D.ChunkCount: lambda: cell_fields(WITHOUT, "`glibc`:", "chunks", start="{state: {", end="}}"),
    D.TcacheDoc: lambda: cell_fields(WITHOUT, "`glibc`:", "tcaches", start=":"),
    D.TopSizes: lambda: cell_fields(WITHOUT, "`glibc`:", "top_sizes", end=":"),
    D.SizeRow: lambda: cell_fields(WITHOUT, "`glibc`:", "top_sizes", start="[{", end="}]"),
    D.FindingDoc: lambda: cell_fields(WITHOUT, "`glibc`:", "corruption", start="found:"),
    D.MallocDoc: lambda: paragraph_fields(MALLOC, start="found):", end="The crash's `address_owner`"),
    # inspect
    D.InspectDoc: lambda: table_fields(INSPECT),
    D.ProcessRef: lambda: cell_fields(INSPECT, None, "process"),
    D.HeapTotals: lambda: cell_fields(INSPECT, None, "heap"),
    D.TopStack: lambda: cell_fields(INSPECT, None, "top_stacks", start=":"),
    D.RuntimeSummary: lambda: cell_fields(INSPECT, None, "runtime", start=":"),
    D.StackBlocksDoc: lambda: cell_fields(INSPECT, None, "stack_blocks", start=": the live"),
    D.StackBlock: lambda: cell_fields(INSPECT, None, "stack_blocks", start="by address:", end=": ms"),
    D.ThreadDoc: lambda: cell_fields(INSPECT, None, "threads", start="no libtag record:"),
    D.Counters: lambda: cell_fields(INSPECT, None, "counters"),
    D.TypeCount: lambda: cell_fields(INSPECT, None, "types", start="demangled):"),
    D.AnomalyDoc: lambda: table_fields(INSPECT, "An anomaly:"),
    # the crash's malloc is in "Without libtag" (only a glibc heap has it)
    D.CrashDoc: lambda: table_fields(INSPECT, "The crash:") | paragraph_fields(MALLOC, end=" (null"),
    D.SenderDoc: lambda: cell_fields(INSPECT, "The crash:", "sender", start="):"),
    D.CauseDoc: lambda: cell_fields(INSPECT, "The crash:", "cause", start="crash):"),
    D.AddressOwnerDoc: lambda: (cell_fields(INSPECT, "The crash:", "address_owner", start="is:")
                                | paragraph_fields(MALLOC, start="The crash's `address_owner` has")),
    D.SignatureDoc: lambda: table_fields("signature"),
    # whoowns
    D.WhoownsDoc: lambda: table_fields(WHOOWNS),
    D.RegionDoc: lambda: cell_fields(WHOOWNS, None, "region"),
    D.ReferrerDoc: lambda: cell_fields(WHOOWNS, None, "referrers", start="):"),
    D.RetainerDoc: lambda: cell_fields(WHOOWNS, None, "retainers", start="Each:", end="): `address`"),
    D.PathLink: lambda: cell_fields(WHOOWNS, None, "retainers", start="straight into it):", end=". The chains"),
    D.RootDoc: lambda: paragraph_fields("A retention path's `root`:", start=":", end="For example"),
    D.DataSymbolDoc: lambda: cell_fields(WHOOWNS, None, "symbol", start="`global`:"),
    D.UseAfterFreeDoc: lambda: cell_fields(WHOOWNS, None, "use_after_free", start=":"),
    D.NearDoc: lambda: cell_fields(WHOOWNS, None, "near", start=":"),
    # report: the page's data (fx-data)
    D.ReportDoc: lambda: table_fields(REPORT, REPORT_DATA),
    D.ReportProcess: lambda: cell_fields(REPORT, REPORT_DATA, "processes", start="in `snapshots`:"),
    D.ReportSizeClass: lambda: cell_fields(REPORT, REPORT_DATA, "size_classes", start="the table:"),
    D.ReportPoint: lambda: table_fields(REPORT, "Each of `snapshots`"),
    D.ReportFrame: lambda: table_fields(REPORT, "Each of `frames`"),
    D.ReportTree: lambda: table_fields(REPORT, "`tree`, the hierarchy"),
    D.ReportStackRow: lambda: table_fields(REPORT, "Each of `stacks`"),
    D.ReportEvent: lambda: table_fields(REPORT, "Each of `events`"),
    D.ReportEventStack: lambda: cell_fields(REPORT, "Each of `events`", "stacks", end="): the stack"),
    D.ReportLeak: lambda: table_fields(REPORT, "Each of `leaks`"),
}

# Shapes of inspect's that the report's data carries too, and where its
# section names their fields (each type is held against inspect's above).
SHARED_IN_REPORT = {
    "types": (D.TypeCount, lambda: cell_fields(REPORT, REPORT_DATA, "types", start="inspect's `types` (",
                                                end=";")),
    "block_list": (D.StackBlock, lambda: cell_fields(REPORT, "Each of `stacks`", "block_list",
                                                      start="gives them:")),
}


def _keys(cls: type) -> set[str]:
    return {key for _, key, _ in D._plan(cls)}


def test_every_document_type_is_held_against_json_md():
    assert set(D.document_types()) == set(DOCUMENTED), (
        "a document type docs/json.md is not compared with (add it to DOCUMENTED), or one that is gone")


@pytest.mark.parametrize("cls", list(DOCUMENTED), ids=lambda c: c.__name__)
def test_the_type_has_exactly_the_documented_fields(cls):
    documented = DOCUMENTED[cls]()
    have = _keys(cls)
    assert not documented - have, f"{cls.__name__} lacks fields docs/json.md lists: {sorted(documented - have)}"
    assert not have - documented, f"{cls.__name__} has fields docs/json.md does not list: {sorted(have - documented)}"


@pytest.mark.parametrize("field", list(SHARED_IN_REPORT))
def test_the_report_section_names_the_fields_of_the_shapes_it_shares_with_inspect(field):
    cls, documented = SHARED_IN_REPORT[field]
    assert documented() == _keys(cls)


def test_to_json_keeps_order_spelling_and_nulls_and_leaves_out_only_the_omitted():
    frame = D.FrameDoc(address="0x401000", function=None, file=None, line=None, module="/bin/x",
                       inlined=False, libtag=False, module_offset="0x1000")
    group = D.LeakGroupDoc(kind="indirect", blocks=1, bytes=8, stack=[frame], stack_id=3, usable_size=None,
                           oldest_alloc_ms=1, newest_alloc_ms=2, age_ms=None, examples=["0x10"], type=None)
    out = D.to_json(group)
    assert list(out) == ["kind", "blocks", "bytes", "stack", "stack_id", "usable_size", "oldest_alloc_ms",
                         "newest_alloc_ms", "age_ms", "examples", "type"]
    assert out["stack"] == [{"address": "0x401000", "function": None, "file": None, "line": None,
                             "module": "/bin/x", "inlined": False, "libtag": False, "module_offset": "0x1000"}]
    assert (out["age_ms"], out["type"]) == (None, None)
    definite = D.to_json(dataclasses.replace(group, kind="definite", indirect_blocks=0, indirect_bytes=0,
                                             cycle_leaders=0))
    assert list(definite)[-3:] == ["indirect_blocks", "indirect_bytes", "cycle_leaders"]


def test_documents_are_frozen():
    c = D.Counts(blocks=1, bytes=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.blocks = 3


def test_documents_are_built_by_keyword_with_their_defaults_and_nothing_else():
    # the one constructor every document type shares (documents._Doc)
    c = D.Counts(blocks=1, bytes=2)
    assert (c.blocks, c.bytes) == (1, 2)
    assert D.FrameDoc.__init__ is D.Counts.__init__
    with pytest.raises(TypeError, match=r"^Counts\(\) missing required keyword argument: 'bytes'$"):
        D.Counts(blocks=1)
    with pytest.raises(TypeError, match=r"^Counts\(\) got an unexpected keyword argument 'byte'$"):
        D.Counts(blocks=1, bytes=2, byte=3)
    with pytest.raises(TypeError):
        D.Counts(1, 2)  # keyword-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        del c.blocks
    assert D.SenderDoc(pid=7, uid=0, self=True).self is True  # a field named self
    # a field with a default: omitted() is None, hidden() its value
    assert D.LeakGroupDoc.__dataclass_fields__["indirect_blocks"].default is None


def test_documents_copy_and_pickle_field_by_field():
    import copy
    import pickle
    frame = D.FrameDoc(address="0x401000", function="main", file=None, line=3, module="/bin/x", inlined=False,
                       libtag=False, module_offset="0x1000")
    for twin in (copy.copy(frame), copy.deepcopy(frame), pickle.loads(pickle.dumps(frame))):
        assert twin == frame and twin is not frame
        assert (twin.function, twin.line) == ("main", 3)


def _report(**kw) -> D.ReportDoc:
    fields = dict(version=3, title="forensics report: x (pid 7)",
                  processes=[D.ReportProcess(pid=7, exe="/bin/x", cores=1)], stack_stats=True, wrappers=["malloc"],
                  runtime=None, generated="2026-01-01T00:00:00+00:00", snapshots=[], primary=0, frames=[],
                  tree=None, stacks=[], distinct_stacks=0, types=[], events=[], leaks=None, warnings=[])
    fields.update(kw)
    return D.ReportDoc(**fields)


def test_report_data_has_libtag_and_the_size_classes_only_without_libtag():
    # GIVEN the data of libtag cores, and of cores without libtag
    tagged = D.to_json(_report())
    plain = D.to_json(_report(libtag=False, without_libtag=D.WithoutLibtag(unknown=["allocation stacks"],
                                                                            hint="h", summary="s"),
                              stack_stats=False, wrappers=[],
                              size_classes=[D.ReportSizeClass(usable_size=24, chunks=2, bytes=48)],
                              distinct_sizes=1))
    # THEN the libtag data has no libtag, without_libtag, size_classes or distinct_sizes key
    assert list(tagged) == ["version", "title", "processes", "stack_stats", "wrappers", "runtime", "generated",
                            "snapshots", "primary", "frames", "tree", "stacks", "distinct_stacks", "types",
                            "events", "leaks", "warnings"]
    # AND the other has them where docs/json.md's table puts them, libtag false
    assert list(plain) == ["version", "libtag", "without_libtag", "title", "processes", "stack_stats",
                           "wrappers", "runtime", "generated", "snapshots", "primary", "frames", "tree",
                           "stacks", "distinct_stacks", "size_classes", "distinct_sizes", "types", "events",
                           "leaks", "warnings"]
    assert plain["libtag"] is False
    assert plain["size_classes"] == [{"usable_size": 24, "chunks": 2, "bytes": 48}]
    assert (_report().tagged, _report(libtag=False).tagged) == (True, False)


def test_report_stack_rows_have_the_counters_only_when_libtag_kept_them():
    block = D.StackBlock(start="0x1000", size=16, thread=7, age_ms=None)
    row = D.ReportStackRow(frames=[2, 1], site=1, bytes=16, blocks=1, node=3, runtime=False, block_list=[block])
    # GIVEN no per-stack counters: no peak_bytes, temporaries or allocs key
    assert D.to_json(row) == {"frames": [2, 1], "site": 1, "bytes": 16, "blocks": 1, "node": 3, "runtime": False,
                              "block_list": [{"start": "0x1000", "size": 16, "thread": 7, "age_ms": None}]}
    # GIVEN counters: the keys, null for a stack that has none
    counted = dataclasses.replace(row, peak_bytes=32, temporaries=None, allocs=2, stats=True)
    assert list(D.to_json(counted)) == ["frames", "site", "bytes", "blocks", "node", "runtime", "peak_bytes",
                                        "temporaries", "allocs", "block_list"]
    assert D.to_json(counted)["temporaries"] is None
    # AND the row of a stack with no live block has no runtime key
    assert "runtime" not in D.to_json(dataclasses.replace(counted, runtime=None, node=-1))


def test_report_events_keep_their_key_out_of_the_json_and_facts_are_pairs():
    ev = D.ReportEvent(kind="double-free", title="double-free of 0x10", facts=[("address", "0x10"), ("time", None)],
                       stacks=[D.ReportEventStack(title="detected in thread 7", frames=[0, 1])], cores=["/c/core"],
                       key=(7, 0, "anomaly", "double-free", "0x10", 7, 12))
    assert D.to_json(ev) == {"kind": "double-free", "title": "double-free of 0x10",
                             "facts": [["address", "0x10"], ["time", None]],
                             "stacks": [{"title": "detected in thread 7", "frames": [0, 1]}],
                             "cores": ["/c/core"]}
