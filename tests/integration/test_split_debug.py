"""Stacks named in stripped binaries, from their separate debug files.

tests/victims/split_debug.c is built -O2 -g with a GNU build-id and split as
distributions split their packages: ``objcopy --only-keep-debug`` makes the
debug file, ``strip --strip-all`` the binary that runs (no .symtab, no DWARF).
The victim keeps one 72-byte block allocated in allocate_in_leaf <- middle <-
main in the global `held`, prints its address and its functions' entry
addresses, and takes an on-demand snapshot.  forensics must then:

- find the debug file by build-id (``DIR/.build-id/xx/rest.debug``, the
  layout of Debian's -dbgsym packages) in a --debug-dir, and name every frame
  and the global from it in inspect, whoowns and the report's data;
- find it by the binary's ``.gnu_debuglink`` beside the binary or in
  ``.debug/`` beside it, and refuse one whose CRC-32 is not the link's;
- without any debug file, call each frame ``split_debug+0xOFFSET``, the
  offset as ``nm`` of the unstripped build sees it, in inspect's text and in
  the report alike (never an absolute address, never an empty name).

The tests never write to /usr/lib/debug: the debug files are in temporary
directories.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.core import elf
import forensics_test_support as S
from forensics_test_browser import CHROMIUM, assert_clean, chromium, dom

HELD_SIZE = 72  # split_debug.c
FUNCS = ["allocate_in_leaf", "middle", "main", "_start"]  # the victim's frames of the block, innermost first
NAMED = ["allocate_in_leaf", "middle", "main"]  # the ones split_debug.c defines (and its lines name)


def build_id(path: Path) -> str:
    with open(path, "rb") as f:
        bid = elf.file_build_id(f)
    assert bid is not None, f"expected {path} to have a GNU build-id"
    return bid.hex()


def has_section(path: Path, name: str) -> bool:
    out = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return re.search(rf"\s{re.escape(name)}\s", out) is not None


def nm_ranges(exe: Path) -> dict[str, tuple[int, int]]:
    """{function: [start, end)} of exe's function symbols, as nm sees them."""
    out = subprocess.run(["nm", "-S", str(exe)], capture_output=True, text=True, check=True).stdout
    ranges = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "Tt":
            ranges[parts[3]] = (int(parts[0], 16), int(parts[0], 16) + int(parts[1], 16))
    return ranges


def split(built: Path, exe: Path, debug: Path, *, link: bool = False) -> Path:
    """exe: a stripped copy of built (with a .gnu_debuglink to debug's name
    when link), debug: its debug file; returns the unstripped copy."""
    exe.parent.mkdir(parents=True, exist_ok=True)
    debug.parent.mkdir(parents=True, exist_ok=True)
    full = exe.parent / (exe.name + ".full")
    shutil.copy2(built, full)
    shutil.copy2(built, exe)
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", str(exe)], check=True)
    if link:
        subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(exe)], check=True)
    assert not has_section(exe, ".symtab") and not has_section(exe, ".debug_info"), (
        f"expected {exe} stripped of .symtab and DWARF")
    return full


def snapshot(run_victim, exe: Path, snaps: Path) -> tuple[dict, Path]:
    snaps.mkdir(mode=0o700)
    done = run_victim(exe, snap_dir=snaps)
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    facts = {}
    for line in done.stdout.splitlines():
        key, *rest = line.split()
        if key == "fn":  # fn NAME ADDR
            key, rest = f"fn {rest[0]}", rest[1:]
        facts[key] = rest
    return facts, S.wait_core(snaps, int(facts["pid"][0]))


def cli_json(run_cli, state: Path, *args) -> dict:
    done = run_cli(*args, "--json", env={"XDG_STATE_HOME": str(state)})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


def held_stack(doc: dict) -> list[dict]:
    """inspect's top stack of the one 72-byte block."""
    stacks = [s["stack"] for s in doc["top_stacks"] if (s["bytes"], s["blocks"]) == (HELD_SIZE, 1)]
    assert len(stacks) == 1, f"expected one stack of one {HELD_SIZE}-byte block: {doc['top_stacks']}"
    return stacks[0]


def report_data(run_cli, state: Path, core: Path, page: Path, *extra) -> dict:
    page.parent.mkdir()
    done = run_cli("report", core, "-o", page, *extra, env={"XDG_STATE_HOME": str(state)})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    m = re.search(r'<script type="application/json" id="fx-data">(.*?)</script>', page.read_text(), re.S)
    assert m is not None, "expected the page's data script"
    return json.loads(m.group(1))


def report_held_frames(data: dict) -> list[dict]:
    rows = [r for r in data["stacks"] if (r["bytes"], r["blocks"]) == (HELD_SIZE, 1)]
    assert len(rows) == 1, f"expected one stack row of one {HELD_SIZE}-byte block: {data['stacks']}"
    return [data["frames"][i] for i in rows[0]["frames"]]


def ours(frames: list[dict], exe: Path) -> list[dict]:
    return [f for f in frames if f["module"] == str(exe)]


# ------------------------------------------------------------- build-id --


def test_a_stripped_binary_is_named_from_its_build_id_debug_file(build_victim, run_victim, run_cli,
                                                                 tmp_path):
    # GIVEN split_debug built -O2 -g with a build-id, split as a -dbgsym
    # package is: the stripped binary runs, its debug file is in a debug
    # directory at .build-id/xx/rest.debug (and nowhere else)
    built = build_victim("split_debug", instrument=False, extra_flags=["-O2", "-Wl,--build-id"])
    exe = tmp_path / "bin" / "split_debug"
    scratch = tmp_path / "scratch" / "split_debug.debug"
    split(built, exe, scratch)
    bid = build_id(exe)
    assert build_id(scratch) == bid
    debug = tmp_path / "debug"
    (debug / ".build-id" / bid[:2]).mkdir(parents=True)
    scratch.rename(debug / ".build-id" / bid[:2] / f"{bid[2:]}.debug")
    facts, core = snapshot(run_victim, exe, tmp_path / "snaps")
    live, held = int(facts["live"][0], 16), int(facts["held"][0], 16)
    state = tmp_path / "state"

    # WHEN inspect reads the core with --debug-dir pointing there
    doc = cli_json(run_cli, state, "inspect", core, "--debug-dir", debug)
    # THEN the block's stack names the victim's functions, with its source
    # file and lines, and nothing is warned about the binary
    stack = ours(held_stack(doc), exe)
    assert [f["function"] for f in stack] == FUNCS, stack
    assert [Path(f["file"]).name for f in stack[:3]] == ["split_debug.c"] * 3, stack
    assert all(isinstance(f["line"], int) for f in stack[:3]), stack
    assert not [w for w in doc["warnings"] if str(exe) in w], doc["warnings"]

    # WHEN whoowns asks for the held block
    who = cli_json(run_cli, state, "whoowns", hex(live), "--core", core, "--debug-dir", debug)
    # THEN its allocation stack is named the same, and the global holding it
    # is named from the debug file's symbol table
    assert [f["function"] for f in ours(who["block"]["alloc_stack"], exe)] == FUNCS, who["block"]
    globals_ = [r for r in who["referrers"] if r["in"] == "global"]
    assert [(r["address"], r["module"], r["symbol"]) for r in globals_] == [
        (hex(held), str(exe), "held")], who["referrers"]

    # WHEN the report is made of the core with the same flag
    data = report_data(run_cli, state, core, tmp_path / "out" / "report.html", "--debug-dir", debug)
    # THEN the page's frames of that stack carry the same names
    frames = ours(report_held_frames(data), exe)
    assert [(f["function"], f["label"]) for f in frames] == [(n, n) for n in FUNCS], frames

    # WHEN inspect runs again without the flag (the symbol cache holds the named answers)
    doc = cli_json(run_cli, state, "inspect", core)
    # THEN no name comes from the cache: the stripped binary's frames are unnamed
    assert [f["function"] for f in ours(held_stack(doc), exe)] == [None] * 4, held_stack(doc)


# ---------------------------------------------------------- debuglink --


@pytest.mark.parametrize("where", ["beside", ".debug"])
def test_a_stripped_binary_is_named_from_its_gnu_debuglink(build_victim, run_victim, run_cli, tmp_path,
                                                           where):
    # GIVEN split_debug stripped with a .gnu_debuglink to split_debug.debug,
    # the debug file beside the binary or in .debug/ beside it (no build-id
    # directory, no --debug-dir)
    built = build_victim("split_debug", instrument=False, extra_flags=["-O2", "-Wl,--build-id"])
    exe = tmp_path / "bin" / "split_debug"
    debug = exe.parent / ("" if where == "beside" else ".debug") / "split_debug.debug"
    split(built, exe, debug, link=True)
    assert has_section(exe, ".gnu_debuglink")
    facts, core = snapshot(run_victim, exe, tmp_path / "snaps")
    live = int(facts["live"][0], 16)
    state = tmp_path / "state"

    # WHEN inspect and whoowns read the core
    doc = cli_json(run_cli, state, "inspect", core)
    who = cli_json(run_cli, state, "whoowns", hex(live), "--core", core)
    # THEN the frames are named from the linked debug file
    assert [f["function"] for f in ours(held_stack(doc), exe)] == FUNCS, held_stack(doc)
    assert [f["function"] for f in ours(who["block"]["alloc_stack"], exe)] == FUNCS, who["block"]
    # ... and the global holding the block, from its symbol table
    assert [r["symbol"] for r in who["referrers"] if r["in"] == "global"] == ["held"], who["referrers"]

    # WHEN the debug file changes (its CRC-32 is no longer the link's)
    with open(debug, "ab") as f:
        f.write(b"\0")
    doc = cli_json(run_cli, state, "inspect", core)
    # THEN it names nothing: the frames keep module+0xOFFSET
    stack = ours(held_stack(doc), exe)
    assert [f["function"] for f in stack] == [None] * 4, stack


# ------------------------------------------------------- no debug file --


def test_a_stripped_binary_without_debug_file_prints_module_offsets(build_victim, run_victim, run_cli,
                                                                    tmp_path):
    # GIVEN split_debug stripped, with no debug file anywhere
    built = build_victim("split_debug", instrument=False, extra_flags=["-O2", "-Wl,--build-id"])
    exe = tmp_path / "bin" / "split_debug"
    full = split(built, exe, tmp_path / "scratch" / "split_debug.debug")
    (tmp_path / "scratch" / "split_debug.debug").unlink()
    facts, core = snapshot(run_victim, exe, tmp_path / "snaps")
    ranges = nm_ranges(full)
    # the load bias: where the victim saw allocate_in_leaf minus where nm does
    bias = int(facts["fn allocate_in_leaf"][0], 16) - ranges["allocate_in_leaf"][0]
    assert int(facts["fn middle"][0], 16) - ranges["middle"][0] == bias
    state = tmp_path / "state"

    # WHEN inspect --json reads the core
    doc = cli_json(run_cli, state, "inspect", core)
    stack = ours(held_stack(doc), exe)
    # THEN each of the binary's frames has no function and its module_offset
    # is its address less the load bias, inside the function nm names there
    assert [f["function"] for f in stack] == [None] * 4, stack
    offsets = [int(f["address"], 16) - bias for f in stack]
    assert [f["module_offset"] for f in stack] == [hex(o) for o in offsets], stack
    for name, off in zip(FUNCS, offsets):
        lo, hi = ranges[name]
        assert lo < off <= hi, f"expected {off:#x} in {name} [{lo:#x}, {hi:#x}]"
    labels = [f"split_debug+{o:#x}" for o in offsets]

    # WHEN inspect prints for a person
    human = run_cli("inspect", core, env={"XDG_STATE_HOME": str(state), "COLUMNS": "400"})
    assert human.returncode == 0, human.stderr
    # THEN each frame is split_debug+0xOFFSET, after its address
    for f, label in zip(stack, labels):
        assert f"{f['address']}  {label} in {exe}" in human.stdout, human.stdout

    # WHEN the report is made of the core
    data = report_data(run_cli, state, core, tmp_path / "out" / "report.html")
    # THEN the page's frames carry the same labels and offsets, no absolute address
    frames = ours(report_held_frames(data), exe)
    assert [(f["function"], f["label"], f["module_offset"]) for f in frames] == [
        (None, label, hex(o)) for label, o in zip(labels, offsets)], frames
    if CHROMIUM is None:
        return  # (the drawn page needs chromium; .ci/run installs it)
    # ... and the page, as drawn, names the stack's frames by those labels
    html, err = chromium(tmp_path / "out" / "report.html", tmp_path / "profile")
    page = dom(html)
    assert_clean(page, err)
    row = next(r for r in page.one("table", id="fx-table").one("tbody").find_all("tr")
               if r.attrs["data-bytes"] == str(HELD_SIZE))
    for f, label in zip(stack, labels):
        assert f"{label} {f['address']}" in row.text(), row.text()
    assert f"split_debug+{stack[0]['address']}" not in row.text(), row.text()
