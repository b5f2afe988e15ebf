"""forensics report (and trend) of cores of processes that never ran libtag.

GIVEN tests/victims/glibc_growth.c run without libtag with "leak", and
gcore's core of it at each of its two waits (30 blocks of 72 bytes; then 5
of them freed, 3 blocks of 200 bytes allocated and dropped, 10 blocks of
1000 bytes allocated), and the kernel's core of tests/victims/glibc_damage.c
(built -O2, no libtag) aborting in free() after an overflow into the next
chunk's size field
WHEN forensics report makes a page of them
THEN the page's data and the page drawn in headless Chromium hold the curve
of the chunks in use, the newest core's chunks by usable size (exactly what
the victim allocated), the leaks by size, the crash explained in malloc's
terms and the damaged chunk as an event, and say what is unknown without
libtag; a libtag core among them, --wrapper, and trend are refused in one
line.
AND of a snapshot of tests/victims/plain_objects.cc, without libtag (by
ptrace) and under libtag alike, the page's data and the page count the
live blocks by C++ class (exactly the victim's objects).

usable sizes are glibc's: a chunk of max(32, (n + 8 + 15) & ~15) bytes, of
which all but the 8-byte size field is the block's (16 bytes of header for
an mmapped chunk, rounded to pages).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
from pathlib import Path

import forensics_test_support as S
import pytest

from forensics_test_browser import CHROMIUM, assert_clean, chromium, dom

KERNEL_SKIP = S.kernel_core_skip_reason()
needs_gcore = pytest.mark.skipif(shutil.which("gcore") is None, reason="gcore (gdb) is not installed")
needs_kernel_core = pytest.mark.skipif(KERNEL_SKIP is not None, reason=KERNEL_SKIP or "")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


def usable(request: int) -> int:
    """malloc_usable_size(malloc(request)) on x86_64."""
    if request >= 128 * 1024:
        return ((request + 8 + 4095) & ~4095) - 16
    return max(32, (request + 8 + 15) & ~15) - 8


def page_data(page: Path) -> dict:
    found = re.search(r'<script type="application/json" id="fx-data">(.*?)</script>', page.read_text())
    assert found, f"no fx-data script in {page}"
    return json.loads(found.group(1))


def env_without_libtag() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


@pytest.fixture(scope="module")
def growth(build_victim, tmp_path_factory) -> tuple[Path, Path, int]:
    """gcore's two cores of glibc_growth leak: (at ready 1, at ready 2, pid)."""
    if shutil.which("gcore") is None:
        pytest.skip("gcore (gdb) is not installed")
    exe = build_victim("glibc_growth", instrument=False, extra_flags=["-O2"])
    return S.growth_cores(exe, tmp_path_factory.mktemp("glibc-report"), "leak")


def _raise_soft_core_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


@pytest.fixture(scope="module")
def crash(build_victim, tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """The kernel's core of glibc_damage overflow, and the pointers it printed."""
    if KERNEL_SKIP is not None:
        pytest.skip(KERNEL_SKIP)
    work = tmp_path_factory.mktemp("glibc-report-crash")
    exe = build_victim("glibc_damage", instrument=False, extra_flags=("-O2",))
    done = subprocess.run([str(exe), "overflow"], cwd=work, env=env_without_libtag(), capture_output=True,
                          text=True, timeout=60, preexec_fn=_raise_soft_core_limit, check=False)
    assert done.returncode == -6, f"expected SIGABRT (-6), got {done.returncode}: {done.stderr}"
    assert "free(): invalid next size (normal)" in done.stderr, done.stderr
    (core,) = [p for p in work.iterdir() if p.name.startswith("core")]
    printed = {}
    for line in done.stdout.splitlines():
        w = line.split()
        if w[0] == "chunk":
            printed[w[1]] = int(w[2], 16)
        elif w[0] in ("pid", "damaged"):
            printed[w[0]] = int(w[1], 0)
    return core, printed


def report(run_cli, tmp_path: Path, *args) -> tuple[subprocess.CompletedProcess, Path]:
    page = tmp_path / "page.html"
    done = run_cli("report", *args, "-o", page, env={"XDG_STATE_HOME": str(tmp_path / "state")},
                   timeout=300)
    return done, page


# ---------------------------------------------------------------- growth --


@needs_gcore
def test_report_of_two_plain_cores_is_by_chunk_size(growth, run_cli, tmp_path):
    first, second, pid = growth
    # WHEN a report is made of the two cores
    done, page = report(run_cli, tmp_path, first, second)
    # THEN it is written, and says it has sizes in place of stacks
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {page}: 2 snapshot(s), "), done.stdout
    assert done.stdout.rstrip().endswith("0 crash/corruption(s); without libtag: no stacks"), done.stdout
    data = page_data(page)
    assert (data["libtag"], data["tree"], data["stacks"], data["events"]) == (False, None, [], [])
    assert "allocation stacks" in data["without_libtag"]["unknown"], data["without_libtag"]
    # AND the curve has one point a core, of one process, in the order taken,
    # changed by exactly what the victim did between them
    old, new = data["snapshots"]
    assert ([p["core"] for p in data["snapshots"]], {p["pid"] for p in data["snapshots"]}) == (
        [str(first), str(second)], {pid})
    assert new["live_blocks"] - old["live_blocks"] == 10 + 3 - 5
    assert new["live_bytes"] - old["live_bytes"] == 10 * usable(1000) + 3 * usable(200) - 5 * usable(72)
    assert (new["freed_blocks"] - old["freed_blocks"], new["freed_bytes"] - old["freed_bytes"]) == (
        5, 5 * usable(72))
    # AND the newest core's sizes: the victim's own classes, exact
    by = {r["usable_size"]: (r["chunks"], r["bytes"]) for r in data["size_classes"]}
    assert (usable(72), usable(200), usable(1000)) == (72, 200, 1000)
    assert {s: by[s] for s in (72, 200, 1000)} == {72: (25, 1800), 200: (3, 600), 1000: (10, 10_000)}
    assert data["size_classes"][0]["usable_size"] == 1000, data["size_classes"][:2]
    assert data["distinct_sizes"] == len(data["size_classes"])
    # AND the leaks are the 3 dropped blocks of 200 bytes, by size
    assert [(g["kind"], g["blocks"], g["bytes"], g["usable_size"]) for g in data["leaks"]] == [
        ("definite", 3, 600, 200)]


@needs_gcore
@needs_chromium
def test_plain_page_renders_sizes_leaks_and_what_is_unknown(growth, run_cli, tmp_path):
    first, second, _ = growth
    done, page = report(run_cli, tmp_path, first, second)
    assert done.returncode == 0, done.stderr
    # WHEN the page is loaded in headless Chromium
    html, err = chromium(page, tmp_path / "profile")
    doc = dom(html)
    # THEN the script ran to the end with no error
    assert_clean(doc, err)
    # AND the curve has both cores, the sizes table the victim's classes, and
    # no hierarchy or stack table
    assert doc.one("svg", id="fx-curve").attrs["data-points"] == "2"
    rows = {int(r.attrs["data-size"]): (int(r.attrs["data-chunks"]), int(r.attrs["data-bytes"]))
            for r in doc.one("table", id="fx-sizes").one("tbody").find_all("tr")}
    assert {s: rows[s] for s in (72, 200, 1000)} == {72: (25, 1800), 200: (3, 600), 1000: (10, 10_000)}
    assert (doc.find_all(id="fx-flame"), doc.find_all(id="fx-table")) == ([], [])
    # AND no "Heap by C++ class" table: a C program's blocks have no class
    assert doc.find_all(id="fx-types-section") == []
    # AND the leak row is by size
    (leak,) = doc.one("table", id="fx-leaks").one("tbody").find_all("tr")
    assert (leak.attrs["data-kind"], leak.attrs["data-size"], leak.attrs["data-blocks"]) == (
        "definite", "200", "3")
    # AND the page says what is unknown without libtag and how to have it
    banner = doc.one(id="fx-without-libtag").text()
    assert "allocation stacks" in banner and "forensics run" in banner, banner


# ----------------------------------------------------------------- crash --


@needs_kernel_core
def test_report_of_a_crash_core_shows_the_crash_and_the_damaged_chunk(crash, run_cli, tmp_path):
    core, printed = crash
    b, a = printed["damaged"], printed["a"]
    # WHEN a report is made of the kernel's core
    done, page = report(run_cli, tmp_path, core)
    assert done.returncode == 0, done.stderr
    assert "2 crash/corruption(s)" in done.stdout, done.stdout
    data = page_data(page)
    (point,) = data["snapshots"]
    assert (point["pid"], point["reason"]) == (printed["pid"], "crash")
    # THEN the crash card says it is inside free(), glibc's message, the
    # damaged chunk b and the block a before it as the overrun
    crash_ev, damage = data["events"]
    facts = dict(crash_ev["facts"])
    assert (crash_ev["kind"], facts["signal"], facts["thread"]) == ("crash", "SIGABRT", str(printed["pid"]))
    assert facts["heap"].startswith("the crash is inside glibc's free(): \"free(): invalid next size (normal)\""), facts
    assert f"the block before it, {a:#x} (2008 usable bytes, in use)" in facts["heap"], facts["heap"]
    assert facts["chunk"] == f"{b - 16:#x} ({printed['c'] - b} bytes, damaged)", facts["chunk"]
    # AND the damaged size field is its own event, with what was written there
    facts = dict(damage["facts"])
    assert (damage["kind"], damage["stacks"], facts["chunk"], facts["block"], facts["value"]) == (
        "corruption", [], f"{b - 16:#x}", f"{b:#x}", "0x4141414141414141")
    # AND the sizes are the victim's blocks in use (b, damaged, is not one)
    by = {r["usable_size"]: r["chunks"] for r in data["size_classes"]}
    assert {s: by[s] for s in (usable(120), usable(2000), usable(100), usable(3000), usable(1 << 20))} == {
        120: 22, 2008: 1, 104: 1, 3000: 1, 1052656: 1}


@needs_kernel_core
@needs_chromium
def test_crash_page_renders_its_event_cards(crash, run_cli, tmp_path):
    core, _ = crash
    done, page = report(run_cli, tmp_path, core)
    assert done.returncode == 0, done.stderr
    html, err = chromium(page, tmp_path / "profile")
    doc = dom(html)
    assert_clean(doc, err)
    cards = doc.one(id="fx-events").find_all("article")
    assert [c.attrs["data-kind"] for c in cards] == ["crash", "corruption"]


# ---------------------------------------------------------- C++ classes --


@pytest.mark.parametrize("preload", [False, True], ids=["without-libtag", "libtag"])
def test_report_counts_the_live_blocks_by_cpp_class(preload, build_victim, run_cli, libtag_so, tmp_path):
    # GIVEN plain_objects (a Session, a leaked Connection, a net::Packet, a
    # struct without a vtable, two std::strings' characters), snapshotted
    exe = build_victim("plain_objects", cxx=True, instrument=False)
    env = env_without_libtag()
    if preload:
        env.update(LD_PRELOAD=str(libtag_so), LIBTAG_DIR=str(tmp_path / "snaps"))
    state = {"XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen([str(exe)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        while proc.stdout.readline().split()[:1] != ["ready"]:
            pass
        snap = run_cli("snapshot", str(proc.pid), "--dir", tmp_path / "snaps", "--json", env=state)
    finally:
        proc.communicate("", timeout=60)
    assert snap.returncode == 0, snap.stderr
    core = json.loads(snap.stdout)["core"]
    # WHEN report makes its page
    done, page = report(run_cli, tmp_path, core)
    assert done.returncode == 0, done.stderr
    # THEN its data counts each class's live blocks, most bytes first; the
    # strings' characters are 41 and 101 bytes under libtag, glibc's usable
    # sizes without it (56 and 104)
    types = page_data(page)["types"]
    assert {t["type"]: t["blocks"] for t in types} == {"Session": 1, "net::Packet": 1, "Connection": 1,
                                                        "std::string buffer": 2}, types
    assert {t["type"]: t["bytes"] for t in types}["std::string buffer"] == (142 if preload else 160)
    assert [t["bytes"] for t in types] == sorted((t["bytes"] for t in types), reverse=True)
    if CHROMIUM is None:
        return  # the data is checked; the page needs chromium (test_plain_page_renders_... skips)
    # AND the page draws them in its "Heap by C++ class" table
    html, err = chromium(page, tmp_path / "profile")
    doc = dom(html)
    assert_clean(doc, err)
    rows = doc.one("table", id="fx-types").one("tbody").find_all("tr")
    assert [(r.attrs["data-type"], int(r.attrs["data-blocks"])) for r in rows] == [
        (t["type"], t["blocks"]) for t in types]


# ------------------------------------------------------------- refusals --


@needs_gcore
def test_libtag_and_plain_cores_do_not_mix_and_stack_flags_are_refused(growth, run_cli, build_victim,
                                                                      run_victim, tmp_path):
    first, second, _ = growth
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    # GIVEN a libtag snapshot of another program
    snaps = tmp_path / "snaps"
    ran = run_victim(build_victim("truth"), "snapshot", snap_dir=snaps)
    assert ran.returncode == 0, ran.stderr
    tagged = S.wait_core(snaps, int(ran.stdout.split("pid ")[1].split()[0]))
    # WHEN it is given to report with a plain core
    done = run_cli("report", tagged, second, "-o", tmp_path / "x.html", env=env)
    # THEN one line says which is which
    assert (done.returncode, done.stderr.strip()) == (2, (
        f"forensics: error: report: {second} is a core without libtag and {tagged} is not: "
        f"give cores of one kind")), done.stderr
    # AND --wrapper (which names frames of stacks) is refused for plain cores
    done = run_cli("report", first, "--wrapper", "my_alloc", "-o", tmp_path / "x.html", env=env)
    assert (done.returncode, done.stderr.strip()) == (2, (
        "forensics: error: report: --wrapper, --runtime and --runtime-function read allocation "
        "stacks, and cores without libtag have none")), done.stderr
    assert not (tmp_path / "x.html").exists()
    # AND trend, which follows stacks, says why it cannot
    done = run_cli("trend", first, second, env=env)
    assert (done.returncode, done.stderr.strip()) == (2, (
        f"forensics: error: trend: {first} is a core without libtag: trend follows allocation "
        f"stacks, which only libtag records; diff (by chunk size) and report take such cores")), done.stderr
