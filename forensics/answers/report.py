"""The ``report`` page: one self-contained HTML file about one or more cores.

    data = report_data([snap1, snap2, ...])     # plain JSON-able dict
    html = render_page(data)                    # str: the whole page
    write_private(path, html)                   # 0600, tmp + rename

What the page shows, and where each part comes from:

- the live heap (bytes and blocks) of every snapshot as a curve over time,
  each point labelled with the snapshot's reason;
- an allocation hierarchy (an icicle flame graph, click to zoom) of the live
  bytes of the newest snapshot, by allocation stack;
- the anomaly or crash of every core that has one, with all its stacks
  (detecting / faulting, and the block's allocation and free stacks);
- the leak groups of the newest snapshot;
- a sortable, filterable table of the newest snapshot's allocation stacks.

Nothing in the page is per block: the heap is aggregated by allocation stack
first (Heap.by_stack is one numpy pass), at most STACK_LIMIT stacks are
symbolised, and the hierarchy is the trie of their frames, outermost first.
So a core with a million blocks gives the same few hundred KB page as one
with a thousand.

How the page is drawn, and why strings from a core cannot run in it:
forensics.output.html.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any, Callable, Iterable, Sequence

from forensics.answers.inspect import inspect_doc
from forensics.answers.leaks import leaks_json
from forensics.errors import ForensicsError, InputError

DATA_VERSION = 1
STACK_LIMIT = 2000  # allocation stacks symbolised and drawn; the rest are one "other" node


# ------------------------------------------------------------------ data --


CatalogTime = Callable[[str], "float | None"]  # absolute core path -> the catalog's time


def snapshot_time(dump: Any, catalog_time: CatalogTime | None = None) -> tuple[float | None, str]:
    """(seconds since the epoch when the core was taken, where that came from).

    libtag's control block has the wall clock at start-up and the milliseconds
    since then at the snapshot (or at the crash / anomaly, for cores written
    without a snapshot time); without those, catalog_time's answer for the
    core, then the core file's mtime."""
    c = dump.heap.control
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
        self.rows: list[dict] = []
        self._ids: dict[tuple, int] = {}

    def id(self, f: dict) -> int:
        key = (f.get("address"), f.get("function"), f.get("file"), f.get("line"), f.get("module"))
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self.rows)
            self.rows.append({"address": f.get("address"), "function": f.get("function"),
                              "file": f.get("file"), "line": f.get("line"),
                              "module": f.get("module")})
        return i

    def ids(self, frames: Iterable[dict]) -> list[int]:
        return [self.id(f) for f in frames]


def _node_key(f: dict) -> tuple:
    """Frames that are one node of the hierarchy: the same function (of the same
    module), as flame graphs merge them; an unnamed frame is its own address.
    The node keeps every distinct call site it merged (its "sites")."""
    if f.get("function"):
        return (f["function"], f.get("module"))
    return (None, f.get("address"), f.get("module"))


def build_tree(stacks: Sequence[dict], frames: _Frames, *, total_bytes: int,
               total_blocks: int) -> tuple[dict, list[int]]:
    """The trie of the stacks' frames, outermost frame first under one root.

    stacks: [{"stack": [frame] innermost first, "blocks", "bytes"}].  Returns
    the tree as parallel arrays (node 0 is the root; parent -1; frame -1 for
    nodes that are not a frame; "sites": the frames of a node that merged more
    than one call site) and each stack's leaf node.  Live bytes not in
    these stacks (stacks beyond the limit) become one extra child of the root.
    """
    parent, frame, nbytes, nblocks, label = [-1], [-1], [0], [0], {}
    sites: dict[int, list[int]] = {}
    child: dict[tuple[int, tuple], int] = {}
    leaves = []
    for s in stacks:
        node = 0
        nbytes[0] += s["bytes"]
        nblocks[0] += s["blocks"]
        for f in reversed(s["stack"]):
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
            nbytes[node] += s["bytes"]
            nblocks[node] += s["blocks"]
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
            nbytes[node] += s["bytes"]
            nblocks[node] += s["blocks"]
        leaves.append(node)
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
    return ({"parent": parent, "frame": frame, "bytes": nbytes, "blocks": nblocks,
             "label": label, "sites": many}, leaves)


def _stack_json(title: str, frames_json: list[dict], frames: _Frames) -> dict:
    return {"title": title, "frames": frames.ids(frames_json)}


def _block_facts(block: dict) -> list[list[str]]:
    out = [["block", f"{block['start']} ({block['size']} bytes, {block['state']})"]]
    if block.get("offset"):
        out.append(["offset", str(block["offset"])])
    return out


def _add_block(b: dict | None, facts: list, stacks: list, frames: _Frames) -> None:
    """An event's block, if it has one: its facts and both of its stacks."""
    if not b:
        return
    facts += _block_facts(b)
    stacks.append(_stack_json(f"allocated by thread {b['thread']}", b["alloc_stack"], frames))
    if b["state"] == "freed":
        stacks.append(_stack_json(f"freed by thread {b['free_thread']}", b["free_stack"] or [], frames))


def events_of(doc: dict, core: str, frames: _Frames) -> list[dict]:
    """The anomaly and the crash of one inspect document, as the page's event cards."""
    out = []
    for a in doc.get("anomalies") or []:
        facts = [["core", core], ["address", a["address"]], ["thread", str(a.get("thread"))]]
        stacks = ([] if a.get("detected_by") == "reader" else
                  [_stack_json(f"detected in thread {a.get('thread')}", a["stack"], frames)])
        _add_block(a.get("block"), facts, stacks, frames)
        out.append({"kind": a["kind"], "title": f"{a['kind']} of {a['address']}",
                    "facts": facts, "stacks": stacks})
    c = doc.get("crash")
    if c:
        owner = c.get("address_owner") or {}
        facts = [["core", core], ["signal", c["signal"]], ["what", c["summary"]],
                 ["thread", str(c["thread"])]]
        if c["address"] is not None:
            facts += [["address", c["address"]],
                      ["address is", " ".join(x for x in (owner.get("owner"), owner.get("region"),
                                                           owner.get("note")) if x)]]
        stacks = [_stack_json(f"crashed in thread {c['thread']}", c["stack"], frames)]
        _add_block(owner.get("block"), facts, stacks, frames)
        _add_block((c.get("cause") or {}).get("block"), facts, stacks, frames)
        out.append({"kind": "crash", "title": c["summary"], "facts": facts, "stacks": stacks})
    return out


def _leaks(dump: Any, frames: _Frames, warnings: list[str]) -> list[dict] | None:
    """The leak groups, or None (and a warning) when the leak scan failed."""
    try:
        groups = leaks_json(dump)
    except ForensicsError as e:
        warnings.append(f"leak scan failed: {e.message}")
        return None
    out = []
    for g in groups:
        row = {k: v for k, v in g.items() if k != "stack" and isinstance(v, (str, int, float))}
        row["frames"] = frames.ids(g.get("stack") or [])
        out.append(row)
    return out


def snapshot_point(dump: Any, catalog_time: CatalogTime | None = None) -> dict:
    """One point of the curve: a core's time, reason and live/freed totals."""
    t, source = snapshot_time(dump, catalog_time)
    totals = dump.heap.totals
    return {
        "core": os.path.abspath(dump.core.path) if dump.core is not None else dump.mem.name,
        "pid": dump.pid,
        "exe": dump.exe,
        "reason": dump.heap.reason,
        "seq": int(dump.heap.control.snapshot_seq),
        "time": t,
        "time_source": source,
        "live_bytes": totals.live_bytes,
        "live_blocks": totals.live_blocks,
        "freed_bytes": totals.freed_bytes,
        "freed_blocks": totals.freed_blocks,
    }


class ReportBuilder:
    """Feed it the cores one at a time (add), then take the page's data (finish).

    The newest core (by snapshot time; the later given on a tie) makes the
    hierarchy and the table: add() says when the caller must keep a core
    open for finish()."""

    def __init__(self, *, stack_limit: int = STACK_LIMIT, catalog_time: CatalogTime | None = None) -> None:
        self.stack_limit = stack_limit
        self.catalog_time = catalog_time
        self.frames = _Frames()
        self.points: list[dict] = []
        self.events: list[dict] = []
        self.warnings: list[str] = []
        self._newest: tuple[float, int, Any] | None = None

    def add(self, dump: Any) -> bool:
        """Take what the page needs from dump.  True if dump is the newest so
        far: the caller keeps it open until finish() (or a newer one)."""
        point = snapshot_point(dump, self.catalog_time)
        point["index"] = len(self.points)
        self.points.append(point)
        heap = dump.heap
        if heap.anomaly is not None or heap.crash is not None:
            doc = inspect_doc(dump, top=0)
            self.events += events_of(doc, point["core"], self.frames)
        self._warn(point["core"], dump)
        key = (point["time"] if point["time"] is not None else float("-inf"), point["index"])
        if self._newest is None or key >= self._newest[:2]:
            self._newest = (key[0], key[1], dump)
            return True
        return False

    def _warn(self, core: str, dump: Any) -> None:
        for w in dump.warnings:
            line = f"{core}: {w}"
            if line not in self.warnings:
                self.warnings.append(line)

    def finish(self) -> dict:
        """The page's data, from every core added; the newest must still be open."""
        if self._newest is None:
            raise InputError("report needs at least one core")
        _, primary, dump = self._newest
        try:
            doc = inspect_doc(dump, top=self.stack_limit)
            heap = doc["heap"]
            stacks = doc["top_stacks"]
            tree, leaves = build_tree(stacks, self.frames, total_bytes=heap["live_bytes"],
                                      total_blocks=heap["live_blocks"])
            table = [{"frames": self.frames.ids(s["stack"]), "bytes": s["bytes"],
                      "blocks": s["blocks"], "node": leaf}
                     for s, leaf in zip(stacks, leaves)]
            distinct = len(dump.heap.by_stack("live"))
            leaks = _leaks(dump, self.frames, self.warnings)
            self._warn(self.points[primary]["core"], dump)  # its stacks may add some
        finally:
            self._newest = None
        order = sorted(self.points, key=lambda p: (p["time"] is None, p["time"] or 0, p["index"]))
        first = self.points[primary]
        exe = first["exe"] or "?"
        return {
            "version": DATA_VERSION,
            "title": f"forensics report: {os.path.basename(exe)} (pid {first['pid']})",
            "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "snapshots": order,
            "primary": order.index(first),
            "frames": self.frames.rows,
            "tree": tree,
            "stacks": table,
            "distinct_stacks": distinct,
            "events": self.events,
            "leaks": leaks,
            "warnings": self.warnings,
        }
