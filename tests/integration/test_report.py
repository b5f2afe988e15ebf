"""forensics report: one self-contained page, checked in a real headless Chromium.

report_tree (tests/victims/report_tree.c) builds a heap of a known shape
under the real libtag, takes two on-demand snapshots and then double-frees a
block (a third, anomaly snapshot).  `forensics report` turns the three cores
into a page; Chromium loads it from the file (no network: the page's CSP
allows none) and --dump-dom gives the DOM after the page's script ran.  The
script counts every error it sees (window.onerror, console.error) into
#fx-status[data-errors] and marks data-ready="1" when it finished, and it
applies URL-hash actions (#select=N, #sort=KEY, #filter=TEXT) as real click
and input events, so the dumped DOM shows what a user's click shows.

Expected values come from outside the page: `forensics inspect --json` on
the same cores (live totals, the top stacks and their frames, the leaks)
and the victim's own source (function names, block sizes and counts).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from forensics_test_browser import CHROMIUM, Node, assert_clean, chromium, dom  # noqa: E402

needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="chromium is not installed (.ci/run installs it)")
VICTIMS = Path(__file__).resolve().parent.parent / "victims"
TIMEOUT = 180


# ---------------------------------------------------------------- helpers --


def _env(state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_STATE_HOME"] = str(state)
    env.pop("PYTHONPATH", None)
    return env


def forensics(state: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forensics", *map(str, args)], env=_env(state),
                          cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)


def inspect_json(state: Path, core: Path, cwd: Path, *extra: str) -> dict:
    r = forensics(state, "inspect", "--json", "--top", "1000", *extra, core, cwd=cwd)
    assert r.returncode == 0, f"expected inspect to exit 0, got {r.returncode}: {r.stderr}"
    return json.loads(r.stdout)


def take_cores(exe: Path, workdir: Path, *args: str) -> list[Path]:
    """Run report_tree under libtag; its three cores, in snapshot order."""
    from forensics import libpath
    from forensics.snapshots import snapdir

    snaps = workdir / "snaps"
    env = _env(workdir / "state")
    env["LD_PRELOAD"] = f"{libpath.lib_path()} {env.get('LD_PRELOAD', '')}".strip()
    env["LIBTAG_DIR"] = str(snaps)
    env["LIBTAG_ON_ANOMALY"] = "snapshot"
    r = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"expected report_tree to exit 0, got {r.returncode}: {r.stderr}"
    assert r.stdout == "snapshot 1 rc=0\nsnapshot 2 rc=0\ndone\n", f"unexpected output {r.stdout!r}"
    dirs = sorted(snapdir.list_dirs(snaps), key=lambda d: d.seq)
    assert [d.reason for d in dirs] == ["on-demand", "on-demand", "double-free"], dirs
    cores = []
    for d in dirs:
        done = snapdir.wait_complete(d, 60)
        core = snapdir.find_core(done.path)
        assert core is not None, f"expected a core in {done.path}"
        cores.append(core)
    return cores


def build(source: Path, out: Path) -> Path:
    """Compile a victim as conftest's build_victim does (instrumented)."""
    cmd = ["gcc", "-g", "-O1", "-pthread", "-fno-omit-frame-pointer", "-finstrument-functions",
           "-o", str(out), str(source)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"building {source} failed: {r.stderr}"
    return out


def expected_tree(top_stacks: list[dict]) -> dict[tuple, int]:
    """The hierarchy from inspect's stacks: live bytes under each distinct path
    of function names from the outermost frame (unnamed frames by address);
    the root is the empty path."""
    paths: dict[tuple, int] = {}
    for s in top_stacks:
        names = [f["function"] or f["address"] for f in reversed(s["stack"])]
        for k in range(0, len(names) + 1):
            paths[tuple(names[:k])] = paths.get(tuple(names[:k]), 0) + s["bytes"]
    return paths


def expected_tree_nodes(top_stacks: list[dict]) -> int:
    return len(expected_tree(top_stacks))


def functions(ol: Node) -> list[str | None]:
    return [li.attrs.get("data-function") or None for li in ol.find_all("li")]


# --------------------------------------------------------------- fixtures --


@pytest.fixture(scope="module")
def case(build_victim, tmp_path_factory):
    """The three cores of report_tree, the page made of them, and inspect's view."""
    work = tmp_path_factory.mktemp("report")
    exe = build_victim("report_tree")
    cores = take_cores(exe, work)
    page = work / "out" / "report.html"
    page.parent.mkdir()
    r = forensics(work / "state", "report", *cores, "-o", page, cwd=work)
    inspects = [inspect_json(work / "state", c, work) for c in cores]
    newest = inspect_json(work / "state", cores[-1], work, "--leaks")
    return {"work": work, "cores": cores, "page": page, "run": r, "inspects": inspects,
            "newest": newest}


@pytest.fixture(scope="module")
def first_load(case):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed")
    html, err = chromium(case["page"], case["work"] / "profile-1")
    return dom(html), err


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("report-artifacts")
    return d


# ------------------------------------------------------------------ tests --


def test_report_writes_one_private_self_contained_file(case):
    # GIVEN three cores of report_tree
    # WHEN forensics report CORE CORE CORE -o out/report.html ran
    r, page = case["run"], case["page"]
    # THEN it exits 0 and says what it wrote
    assert r.returncode == 0, f"expected exit 0, got {r.returncode}: {r.stderr}"
    assert r.stdout.startswith(f"wrote {page}: 3 snapshot(s), "), f"unexpected stdout {r.stdout!r}"
    # AND the file is the owner's only (0600), and no temporary is left beside it
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    assert sorted(p.name for p in page.parent.iterdir()) == ["report.html"]
    # AND the page loads nothing: no src/href attributes, a CSP that allows no
    # network, and exactly two scripts (the JSON data and the inline code)
    text = page.read_text()
    assert re.findall(r"\s(?:src|href)\s*=", text) == []
    assert "default-src 'none'" in text
    assert len(re.findall(r"<script\b", text)) == 2
    # AND it is small: aggregated by stack, not per block
    assert len(text) < 200_000, f"expected a page under 200 kB, got {len(text)} bytes"


@needs_chromium
def test_page_renders_hierarchy_curve_events_and_table(case, first_load):
    doc, err = first_load
    inspects, newest = case["inspects"], case["newest"]
    # GIVEN the page loaded in headless Chromium
    # THEN the script ran to the end with no error
    assert_clean(doc, err)
    # AND the curve has one point per core, labelled with its reason, at each
    # core's live bytes and blocks as inspect reads them
    curve = doc.one("svg", id="fx-curve")
    assert curve.attrs["data-points"] == "3"
    points = sorted(curve.find_all("circle", data_point=True), key=lambda n: int(n.attrs["data-point"]))
    assert [p.attrs["data-reason"] for p in points] == ["on-demand", "on-demand", "double-free"]
    assert [int(p.attrs["data-bytes"]) for p in points] == [i["heap"]["live_bytes"] for i in inspects]
    assert [int(p.attrs["data-blocks"]) for p in points] == [i["heap"]["live_blocks"] for i in inspects]
    labels = [t.text() for t in curve.find_all("text") if "reason" in t.classes()]
    assert labels == ["on-demand", "on-demand", "double-free"]
    # AND the live heap grows as the victim allocates: 200 x 64 + 4 x 4096 +
    # the index array (200 pointers) before snapshot 1 ...
    assert inspects[0]["heap"]["live_bytes"] == 200 * 64 + 4 * 4096 + 200 * 8
    # ... then + 100 x 256, the cache array and 8 x 512 lost buffers
    grown = 100 * 256 + 100 * 8 + 8 * 512
    assert inspects[1]["heap"]["live_bytes"] == inspects[0]["heap"]["live_bytes"] + grown
    # AND the hierarchy (of the newest core) has one node per distinct
    # function path of inspect's stacks, every one drawn
    flame = doc.one("svg", id="fx-flame")
    nodes = expected_tree_nodes(newest["top_stacks"])
    assert flame.attrs["data-nodes"] == str(nodes)
    assert flame.attrs["data-drawn"] == str(nodes)
    drawn = flame.find_all("g", data_node=True)
    assert len(drawn) == nodes
    by_fn = {g.attrs["data-function"]: g for g in drawn if g.attrs.get("data-function")}
    assert int(by_fn["alloc_node"].attrs["data-bytes"]) == 200 * 64
    assert int(by_fn["alloc_node"].attrs["data-blocks"]) == 200
    assert int(by_fn["alloc_entry"].attrs["data-bytes"]) == 100 * 256
    assert int(by_fn["read_file"].attrs["data-bytes"]) == 4 * 4096
    root = next(g for g in drawn if g.attrs["data-node"] == "0")
    assert int(root.attrs["data-bytes"]) == newest["heap"]["live_bytes"]
    # AND the double free is shown with its three stacks
    events = doc.one(id="fx-events")
    assert events.attrs["data-count"] == "1"
    card = events.one("article")
    assert card.attrs["data-kind"] == "double-free"
    stacks = {s.attrs["data-title"].split(" by ")[0].split(" in ")[0]: functions(s.one("ol"))
              for s in card.find_all("div", **{"class": "stack"})}
    assert [f[0] for f in stacks.values()] == ["session_abort", "session_new", "session_end"]
    assert list(stacks) == ["detected", "allocated", "freed"]
    assert stacks["freed"][:2] == ["session_end", "main"]
    # AND the stack table lists every stack, most bytes first
    table = doc.one("table", id="fx-table")
    # (rows of stacks with no live block, listed for their peak or
    # temporaries when libtag keeps per-stack counters, are not live stacks)
    rows = [r for r in table.one("tbody").find_all("tr") if r.attrs["data-blocks"] != "0"]
    assert len(rows) == len(newest["top_stacks"])
    assert [int(r.attrs["data-bytes"]) for r in rows] == [s["bytes"] for s in newest["top_stacks"]]
    # AND a stack leads to its blocks: alloc_node's row lists the first 10 of
    # its 200 blocks, the ones `inspect --blocks` gives for that stack
    rank = next(i for i, s in enumerate(newest["top_stacks"], 1)
                if [f["function"] for f in s["stack"]][:1] == ["alloc_node"])
    listed = inspect_json(case["work"] / "state", case["cores"][-1], case["work"], "--blocks", str(rank))
    row = next(r for r in rows if r.attrs["data-site"] == "alloc_node")
    details = row.one("details", **{"class": "blocks"})
    assert details.one("summary").text() == "first 10 of 200 blocks"
    assert [li.attrs["data-start"] for li in details.find_all("li")] == [
        b["start"] for b in listed["stack_blocks"]["blocks"][:10]]
    assert {b["size"] for b in listed["stack_blocks"]["blocks"]} == {64}
    # AND the leak groups are those inspect --leaks finds in the same core
    leaks = newest.get("leaks")
    if leaks is None:  # this version has no leak scan: the page says so
        assert doc.one(id="fx-leaks").attrs["data-count"] == ""
    elif leaks:
        assert doc.one(id="fx-leaks").attrs["data-count"] == str(len(leaks))
        assert [r.attrs["data-kind"] for r in doc.one(id="fx-leaks").find_all("tr", data_kind=True)] == \
            [g["kind"] for g in leaks]
    else:
        assert doc.one(id="fx-leaks").attrs["data-count"] == "0"


@needs_chromium
def test_click_on_a_node_zooms_and_shows_its_stack(case, first_load, artifacts):
    doc, _ = first_load
    newest = case["newest"]
    # GIVEN the node of alloc_node in the hierarchy as first drawn
    g = next(g for g in doc.one("svg", id="fx-flame").find_all("g", data_node=True)
             if g.attrs.get("data-function") == "alloc_node")
    node = g.attrs["data-node"]
    # WHEN the page is loaded with #select=<that node> (a real click event on it)
    html, err = chromium(case["page"], case["work"] / "profile-2", fragment=f"#select={node}")
    after = dom(html)
    assert_clean(after, err)
    # THEN the stack panel shows that node's stack, innermost first: the same
    # functions inspect gives for the stack that allocated in alloc_node
    panel = after.one(id="fx-stack")
    assert panel.attrs["data-node"] == node
    assert panel.one("h3").text() == "alloc_node"
    want = next(s for s in newest["top_stacks"] if s["stack"][0]["function"] == "alloc_node")
    assert functions(panel.one("ol")) == [f["function"] for f in want["stack"]]
    assert functions(panel.one("ol"))[:3] == ["alloc_node", "build_index", "main"]
    assert "12.5 KiB (12,800 bytes) in 200 live blocks" in panel.text()
    # AND the hierarchy zoomed into it: its ancestors and itself are drawn
    flame = after.one("svg", id="fx-flame")
    assert flame.attrs["data-zoom"] == node
    assert flame.attrs["data-drawn"] == str(len(want["stack"]) + 1)
    selected = [x for x in flame.find_all("g", data_node=True) if "selected" in x.classes()]
    assert [x.attrs["data-node"] for x in selected] == [node]
    # AND a screenshot of that state is kept as the test's artifact
    shot = artifacts / "report-select-alloc_node.png"
    chromium(case["page"], case["work"] / "profile-3", fragment=f"#select={node}", screenshot=shot)
    assert shot.stat().st_size > 10_000, f"expected a real screenshot at {shot}"
    print(f"report screenshot: {shot}")


@needs_chromium
def test_table_sorts_and_filters(case):
    newest = case["newest"]
    # WHEN the blocks column header is clicked (#sort=blocks)
    html, err = chromium(case["page"], case["work"] / "profile-4", fragment="#sort=blocks")
    doc = dom(html)
    assert_clean(doc, err)
    # THEN the rows are in descending block count
    rows = doc.one("table", id="fx-table").one("tbody").find_all("tr")
    blocks = [int(r.attrs["data-blocks"]) for r in rows if r.attrs["data-blocks"] != "0"]
    assert blocks == sorted((s["blocks"] for s in newest["top_stacks"]), reverse=True)
    assert blocks[0] == 200  # alloc_node's 200 blocks
    assert doc.one("th", data_sort="blocks").attrs["aria-sort"] == "descending"
    # WHEN "read_file" is typed into the filter box
    html, err = chromium(case["page"], case["work"] / "profile-5", fragment="#filter=read_file")
    doc = dom(html)
    assert_clean(doc, err)
    # THEN only the stack through read_file is left
    rows = doc.one("table", id="fx-table").one("tbody").find_all("tr")
    assert [int(r.attrs["data-bytes"]) for r in rows] == [4 * 4096]
    # (of every row: the live stacks, and any listed for their peak or temporaries)
    total = len(newest["top_stacks"])
    count = re.fullmatch(r"1 of (\d+) stacks", doc.one(id="fx-count").text())
    assert count is not None and int(count.group(1)) >= total, doc.one(id="fx-count").text()


@needs_chromium
def test_a_hostile_source_path_stays_text(build_victim, tmp_path):
    # GIVEN report_tree compiled from a folder whose name is markup (file paths
    # may hold '<', '>' and quotes: C names cannot), so every frame's file is it
    payload_dir = tmp_path / "x</" / "script><img src=x onerror=document.body.dataset.pwned=1>"
    payload_dir.mkdir(parents=True)
    source = payload_dir / "report_tree.c"
    shutil.copy(VICTIMS / "report_tree.c", source)
    exe = build(source, tmp_path / "report_tree")
    cores = take_cores(exe, tmp_path)
    page = tmp_path / "evil.html"
    r = forensics(tmp_path / "state", "report", cores[1], "-o", page, cwd=tmp_path)
    assert r.returncode == 0, f"expected exit 0, got {r.returncode}: {r.stderr}"
    # THEN the raw page holds the path only \u-escaped inside its JSON
    text = page.read_text()
    assert "onerror=document" in text  # the payload is there ...
    assert "<img" not in text and "</script><img" not in text  # ... never as markup
    # WHEN the page is loaded with alloc_node's stack shown
    html, err = chromium(page, tmp_path / "profile-1")
    drawn = dom(html).one("svg", id="fx-flame").find_all("g", data_node=True)
    node = next(g.attrs["data-node"] for g in drawn if g.attrs.get("data-function") == "alloc_node")
    html, err = chromium(page, tmp_path / "profile-2", fragment=f"#select={node}")
    doc = dom(html)
    assert_clean(doc, err)
    # THEN the path is shown as text in the stack panel, no element was injected
    # and the payload's script never ran
    panel_text = doc.one(id="fx-stack").text()
    assert f"{payload_dir}/report_tree.c:" in panel_text
    assert doc.find_all("img") == []
    assert "data-pwned" not in html


@needs_chromium
def test_a_million_blocks_give_a_small_page_that_opens(build_victim, tmp_path, artifacts):
    # GIVEN report_tree at scale 3334: 200 x 3334 + 100 x 3334 blocks and the
    # rest, over a million live blocks in its second snapshot
    exe = build_victim("report_tree")
    cores = take_cores(exe, tmp_path, "3334")
    big = inspect_json(tmp_path / "state", cores[1], tmp_path)
    assert big["heap"]["live_blocks"] == 300 * 3334 + 8 + 4 + 2  # + lost buffers, config, 2 arrays
    # WHEN a report is made of it
    page = tmp_path / "big.html"
    r = forensics(tmp_path / "state", "report", cores[1], "-o", page, cwd=tmp_path)
    assert r.returncode == 0, f"expected exit 0, got {r.returncode}: {r.stderr}"
    # THEN the page is as small as for a thousand blocks (aggregated by stack)
    size = page.stat().st_size
    assert size < 200_000, f"expected a page under 200 kB, got {size} bytes"
    # AND it opens cleanly with the whole hierarchy drawn
    html, err = chromium(page, tmp_path / "profile")
    doc = dom(html)
    assert_clean(doc, err)
    nodes = expected_tree_nodes(big["top_stacks"])
    flame = doc.one("svg", id="fx-flame")
    assert flame.attrs["data-nodes"] == str(nodes)
    # AND every node at least half a pixel wide is drawn, no other: the 8 lost
    # buffers (4 kB of 112 MB) are too thin to see at this width
    width = int(flame.attrs["width"])
    tree = expected_tree(big["top_stacks"])
    wide = [p for p, b in tree.items() if b / tree[()] * width >= 0.5]
    assert len(wide) < nodes
    assert flame.attrs["data-drawn"] == str(len(wide))
    root = next(g for g in flame.find_all("g", data_node=True) if g.attrs["data-node"] == "0")
    assert int(root.attrs["data-blocks"]) == big["heap"]["live_blocks"]
    shot = artifacts / "report-million-blocks.png"
    chromium(page, tmp_path / "profile-shot", screenshot=shot)
    ms = doc.one(id="fx-status").attrs["data-render-ms"]
    print(f"report screenshot: {shot} ({size} bytes of HTML for {big['heap']['live_blocks']} "
          f"blocks, drawn in {ms} ms)")


def test_errors_are_one_line_and_leave_no_file(case, tmp_path):
    state = tmp_path / "state"
    # GIVEN a core that does not exist
    r = forensics(state, "report", tmp_path / "nope.core", "-o", tmp_path / "a.html", cwd=tmp_path)
    # THEN exit 2 with one line naming it, and no page
    assert r.returncode == 2
    assert r.stderr == f"forensics: error: no such core: {tmp_path / 'nope.core'}\n"
    assert not (tmp_path / "a.html").exists()
    # GIVEN an output folder that does not exist
    out = tmp_path / "missing" / "a.html"
    r = forensics(state, "report", case["cores"][0], "-o", out, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == f"forensics: error: cannot write the report: no such folder {out.parent}\n"
    # GIVEN an output that is a folder
    r = forensics(state, "report", case["cores"][0], "-o", tmp_path, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (f"forensics: error: cannot write the report: {tmp_path} is a directory; "
                        "give a file name\n")
    # GIVEN no -o at all
    r = forensics(state, "report", case["cores"][0], cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("forensics: error: the following arguments are required: -o/--output")
    assert len(r.stderr.splitlines()) == 1
    # GIVEN a file that is not a core
    junk = tmp_path / "junk"
    junk.write_bytes(b"not an ELF core\n" * 4)
    r = forensics(state, "report", junk, "-o", tmp_path / "b.html", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("forensics: error: ") and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "b.html").exists()
    # AND an existing page is replaced whole, still 0600
    page = tmp_path / "c.html"
    page.write_text("old")
    page.chmod(0o644)
    r = forensics(state, "report", case["cores"][0], "-o", page, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    assert page.read_text().startswith("<!DOCTYPE html>")
