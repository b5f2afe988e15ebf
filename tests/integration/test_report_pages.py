"""forensics report on cores that used to read badly, in a real headless
Chromium: snapshots close together in time, two processes mixed, one anomaly
held by several cores, allocations made through wrappers, and per-stack peaks
and temporary allocations.

tests/victims/report_more.c runs twice (a few seconds apart, so the six
snapshots form two tight clusters on one time axis).  Expected values come
from the victim (its pids, its functions) and from forensics inspect --json
on the same cores.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forensics_test_browser import CHROMIUM, assert_clean, chromium, dom

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
TIMEOUT = 180


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_STATE_HOME"] = str(work / "state")
    env.pop("PYTHONPATH", None)
    return env


def forensics(work: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forensics", *map(str, args)], env=_env(work), cwd=work,
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def artifacts_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("report-artifacts")


@pytest.fixture(scope="module")
def runs(build_victim, tmp_path_factory):
    """Two runs of report_more: [(pid, [core of seq 1, 2, 3])], and the work dir.
    The first run keeps libtag's per-stack counters (the default), the second
    runs with LIBTAG_STACK_STATS=0."""
    from forensics import libpath
    from forensics.snapshots import snapdir

    work = tmp_path_factory.mktemp("report-more")
    exe = build_victim("report_more")
    snaps = work / "snaps"
    out = []
    for i in range(2):
        if i:
            time.sleep(2.5)  # two clusters of snapshots on the time axis (layout only)
        env = _env(work)
        env.update(LD_PRELOAD=str(libpath.lib_path()), LIBTAG_DIR=str(snaps), LIBTAG_ON_ANOMALY="snapshot",
                   LIBTAG_LOG="off")
        if i:
            env["LIBTAG_STACK_STATS"] = "0"  # the second run keeps no per-stack counters
        r = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        pid = int(re.search(r"^pid=(\d+)$", r.stdout, re.M).group(1))
        assert "snapshot 1 rc=0\nsnapshot 3 rc=0\ndone\n" in r.stdout, r.stdout
        dirs = sorted(snapdir.list_dirs(snaps, pid=pid), key=lambda d: d.seq)
        assert [d.reason for d in dirs] == ["on-demand", "double-free", "on-demand"], dirs
        cores = [snapdir.find_core(snapdir.wait_complete(d, 60).path) for d in dirs]
        out.append((pid, cores))
    return work, exe, out


def page_of(work: Path, cores, name: str, *extra) -> Path:
    page = work / f"{name}.html"
    r = forensics(work, "report", *cores, "-o", page, *extra)
    assert r.returncode == 0, r.stderr
    return page


def boxes(curve) -> list[tuple[str, tuple[float, float, float, float]]]:
    out = []
    for t in curve.find_all("text"):
        if "fx-label" in t.classes() and t.attrs.get("data-hidden") != "1":
            x, y, w, h = map(float, t.attrs["data-bbox"].split())
            out.append((t.text(), (x, y, w, h)))
    return out


def intersect(a, b) -> bool:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    return ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah


def test_two_processes_crowded_labels_and_a_repeated_anomaly(runs, artifacts_dir):
    work, exe, procs = runs
    (pid1, cores1), (pid2, cores2) = procs
    page = page_of(work, cores1 + cores2, "two")
    html, err = chromium(page, work / "profile-two")
    doc = dom(html)
    assert_clean(doc, err)
    # THEN the title and a warning name both processes
    title = doc.one("h1").text()
    assert title == f"forensics report: {exe.name} (pid {pid1}), {exe.name} (pid {pid2})", title
    banner = doc.one(id="fx-processes")
    assert banner.attrs["data-count"] == "2"
    assert [li.attrs["data-pid"] for li in banner.find_all("li")] == [str(pid1), str(pid2)]
    assert "different processes" in banner.text()
    # AND each process has its own curve, the points say whose they are
    curve = doc.one("svg", id="fx-curve")
    assert curve.attrs["data-processes"] == "2"
    lines = [p for p in curve.find_all("polyline") if "bytes" in p.classes()]
    assert [len(p.attrs["points"].split()) for p in lines] == [3, 3]
    points = sorted(curve.find_all("circle", data_point=True), key=lambda n: int(n.attrs["data-point"]))
    assert [int(p.attrs["data-pid"]) for p in points] == [pid1] * 3 + [pid2] * 3
    # AND every reason and time label is shown, and no two of them overlap
    labels = boxes(curve)
    assert sorted(t for t, _ in labels if not t.startswith("+")) == sorted(
        ["on-demand", "double-free", "on-demand"] * 2), labels
    assert len(labels) == 12, labels
    overlaps = [(a[0], b[0]) for a, b in itertools.combinations(labels, 2) if intersect(a[1], b[1])]
    assert overlaps == [], overlaps
    # ... and the time labels are all different
    times = [t for t, _ in labels if t.startswith("+")]
    assert len(set(times)) == 6, times
    # AND each process's double free is one card, seen in its 2 later cores
    cards = doc.one(id="fx-events").find_all("article")
    assert [(c.attrs["data-kind"], c.attrs["data-seen"]) for c in cards] == [("double-free", "2")] * 2
    for card, cores in zip(cards, (cores1, cores2)):
        assert "seen in 2 cores" in card.text()
        for core in cores[1:]:
            assert str(core) in card.text()
        assert str(cores[0]) not in card.text()
    shot = artifacts_dir / "report-two-processes.png"
    chromium(page, work / "profile-two-shot", screenshot=shot)
    assert shot.stat().st_size > 10_000
    print(f"report screenshot: {shot}")


def _rows(doc) -> dict[str, dict]:
    """{the function a stack allocated in: its row's attributes} of the table."""
    rows = doc.one("table", id="fx-table").one("tbody").find_all("tr")
    return {r.attrs["data-site"]: r.attrs for r in rows}


def test_allocated_at_skips_the_wrappers(runs):
    work, _, procs = runs
    newest = procs[1][1][2]
    live = json.loads(forensics(work, "inspect", newest, "--json", "--top", "100").stdout)
    inner = {s["stack"][0]["function"]: s for s in live["top_stacks"]}
    # GIVEN the innermost frames are the wrappers themselves
    assert {"strdup", "xmalloc"} <= set(inner), sorted(inner)
    # WHEN the page is made without and with --wrapper dupstr
    plain = dom(chromium(page_of(work, [newest], "plain"), work / "profile-plain")[0])
    mine = dom(chromium(page_of(work, [newest], "mine", "--wrapper", "dupstr"), work / "profile-mine")[0])
    # THEN strdup (glibc) and xmalloc (a default pattern) are skipped ...
    rows = _rows(plain)
    assert {"dup_name", "make_label", "dupstr", "keep_more"} <= set(rows), sorted(rows)
    assert (int(rows["dup_name"]["data-blocks"]), int(rows["make_label"]["data-blocks"])) == (10, 10)
    # ... and the program's own dupstr only when named
    rows = _rows(mine)
    assert "dupstr" not in rows and int(rows["copy_text"]["data-blocks"]) == 10, sorted(rows)
    text = mine.one("table", id="fx-table").text()
    assert "copy_text (report_more.c:" in text


def test_peak_and_temporaries_say_not_recorded_without_counters(runs):
    work, _, procs = runs
    newest = procs[1][1][2]  # the run with LIBTAG_STACK_STATS=0
    from forensics_test_support import read_control_field

    assert read_control_field(newest, "stack_stats") == 0
    doc = dom(chromium(page_of(work, [newest], "nostats"), work / "profile-nostats")[0])
    note = doc.one(id="fx-stats-note")
    assert note.attrs["data-recorded"] == "0"
    assert "not recorded" in note.text()
    for attrs in _rows(doc).values():
        assert (attrs["data-peak"], attrs["data-temporaries"]) == ("", "")


def test_peak_and_temporaries_per_stack(runs):
    work, _, procs = runs
    newest = procs[0][1][2]  # the run with the default counters
    from forensics_test_support import read_control_field

    assert read_control_field(newest, "stack_stats") != 0
    doc = dom(chromium(page_of(work, [newest], "stats"), work / "profile-stats")[0])
    assert doc.one(id="fx-stats-note").attrs["data-recorded"] == "1"
    rows = _rows(doc)
    # churn_temp: 1000 blocks of 32 bytes, each freed before the next was made
    churn = rows["churn_temp"]
    assert (churn["data-blocks"], churn["data-peak"], churn["data-temporaries"]) == ("0", "32", "1000")
    # peak_burst: 10 x 1000 bytes held together, freed after 100 other blocks
    burst = rows["peak_burst"]
    assert (burst["data-blocks"], burst["data-peak"], burst["data-temporaries"]) == ("0", "10000", "0")
    # keep_more: 100 x 16 bytes, all still live
    keep = rows["keep_more"]
    assert (keep["data-blocks"], keep["data-peak"], keep["data-temporaries"]) == ("100", "1600", "0")
