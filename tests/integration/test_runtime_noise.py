"""The C and C++ runtimes' own blocks are folded into one line: stdout's
buffer (glibc's _IO_file_doallocate) and libstdc++'s emergency exception
pool are counted as "runtime", and the program's own stacks are listed from
#1; --runtime lists the runtime's stacks, marked.

Victims: tests/victims/rt_noise.c (three 100-byte blocks of keep_small <-
main, then printf to stdout, a pipe here: glibc allocates a buffer of
stdout's st_blksize, which the victim prints) and
tests/victims/rt_noise_cxx.cc (three 48-byte objects of make_node <- main;
it writes with write(2), so libstdc++'s pool is its only runtime block).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import forensics_test_support as S
from forensics_test_browser import CHROMIUM, assert_clean, chromium, dom

OWN_BLOCKS, OWN_SIZE, NODE_SIZE = 3, 100, 48  # rt_noise.c, rt_noise_cxx.cc
# libstdc++'s emergency pool as gcc 12's eh_alloc.cc sizes it: 64 objects of
# 1024 bytes plus 64 dependent exceptions of 112 bytes
GCC12_POOL = 64 * 1024 + 64 * 112


def facts(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        key, *rest = line.split()
        out.setdefault(key, []).append(" ".join(rest))
    return out


def snapshot(run_victim, exe: Path, snaps: Path) -> tuple[dict, Path]:
    snaps.mkdir(mode=0o700)
    done = run_victim(exe, snap_dir=snaps)
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    f = facts(done.stdout)
    return f, S.wait_core(snaps, int(f["pid"][0]))


def cli(run_cli, state: Path, *args: str):
    r = run_cli(*args, env={"XDG_STATE_HOME": str(state)})
    assert r.returncode == 0, f"expected exit 0, got {r.returncode}: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def c_case(build_victim, run_victim, tmp_path_factory):
    work = tmp_path_factory.mktemp("rt-c")
    exe = Path(os.path.realpath(build_victim("rt_noise")))
    f, core = snapshot(run_victim, exe, work / "snaps")
    return exe, f, core, work


def test_stdout_buffer_is_folded_into_one_runtime_line(c_case, run_cli):
    # GIVEN a core whose biggest live block is stdout's buffer
    exe, f, core, work = c_case
    blksize = int(f["blksize"][0])
    own = sorted(int(line.split()[0], 16) for line in f["own"])
    # WHEN inspect lists the top stacks (the default: runtime folded)
    doc = json.loads(cli(run_cli, work / "state", "inspect", str(core), "--json"))
    # THEN the runtime line counts exactly the one buffer, of st_blksize bytes
    assert doc["runtime"] == {"blocks": 1, "bytes": blksize, "stacks": 1, "shown": False}
    # AND the stacks listed are the program's own, keep_small's first
    assert [s["stack"][0]["function"] for s in doc["top_stacks"]] == ["keep_small"] * OWN_BLOCKS
    assert [(s["blocks"], s["bytes"], s["runtime"]) for s in doc["top_stacks"]] == [
        (1, OWN_SIZE, False)] * OWN_BLOCKS
    assert doc["heap"]["live_bytes"] == blksize + OWN_BLOCKS * OWN_SIZE
    # AND --blocks 1 numbers the stacks the same way: a block of the program's
    blocks = json.loads(cli(run_cli, work / "state", "inspect", str(core), "--json", "--blocks", "1"))
    (b,) = blocks["stack_blocks"]["blocks"]
    assert (int(b["start"], 16) in own, b["size"]) == (True, OWN_SIZE)
    # AND the text says it in one line, before #1
    text = cli(run_cli, work / "state", "inspect", str(core))
    line = (f"runtime: 1 block, {blksize} bytes in 1 stack of the C and C++ runtimes (stdio "
            "buffers, libstdc++'s emergency pool, the loader's TLS) (--runtime lists them)")
    assert line in text, text
    assert text.index(line) < text.index("#1: 100 bytes in 1 block"), text
    assert "_IO_file_doallocate" not in text, text


def test_runtime_flag_lists_the_stdio_stack(c_case, run_cli):
    # GIVEN the same core
    exe, f, core, work = c_case
    blksize = int(f["blksize"][0])
    # WHEN inspect is asked for the runtime's stacks too
    doc = json.loads(cli(run_cli, work / "state", "inspect", str(core), "--json", "--runtime"))
    # THEN the buffer's stack is #1, marked, and reaches printf from main
    first = doc["top_stacks"][0]
    assert (first["blocks"], first["bytes"], first["runtime"]) == (1, blksize, True)
    names = [fr["function"] for fr in first["stack"]]
    assert names[0] == "_IO_file_doallocate", names
    assert "_IO_doallocbuf" in names and "main" in names, names
    assert doc["runtime"] == {"blocks": 1, "bytes": blksize, "stacks": 1, "shown": True}
    assert [s["runtime"] for s in doc["top_stacks"][1:]] == [False] * OWN_BLOCKS
    text = cli(run_cli, work / "state", "inspect", str(core), "--runtime")
    assert f"#1: {blksize} bytes in 1 block (runtime)" in text, text
    assert "_IO_file_doallocate" in text, text
    # AND a function the user names as the runtime's folds the program's stacks
    mine = json.loads(cli(run_cli, work / "state", "inspect", str(core), "--json",
                          "--runtime-function", "keep_*"))
    assert mine["runtime"] == {"blocks": 1 + OWN_BLOCKS, "bytes": blksize + OWN_BLOCKS * OWN_SIZE,
                               "stacks": 1 + OWN_BLOCKS, "shown": False}
    assert mine["top_stacks"] == []


def _page_data(page: Path) -> dict:
    m = re.search(r'<script type="application/json" id="fx-data">(.*?)</script>', page.read_text(), re.S)
    assert m, "expected the page's data script"
    return json.loads(m.group(1))


def test_report_folds_the_runtime_into_one_node(c_case, run_cli):
    # GIVEN the same core
    exe, f, core, work = c_case
    blksize = int(f["blksize"][0])
    # WHEN the report is written (default, then with --runtime)
    page = work / "page.html"
    cli(run_cli, work / "state", "report", str(core), "-o", str(page))
    shown = work / "page-runtime.html"
    cli(run_cli, work / "state", "report", str(core), "-o", str(shown), "--runtime")
    data = _page_data(page)
    # THEN its table lists the program's stacks only, and one node of the
    # hierarchy holds the runtime's buffer
    assert data["runtime"] == {"blocks": 1, "bytes": blksize, "stacks": 1, "shown": False}
    live = [r for r in data["stacks"] if r["blocks"]]
    assert [(r["bytes"], r["runtime"]) for r in live] == [(OWN_SIZE, False)] * OWN_BLOCKS
    tree = data["tree"]
    (node,) = [int(n) for n, label in tree["label"].items() if label == "(the C and C++ runtimes)"]
    assert (tree["parent"][node], tree["bytes"][node], tree["blocks"][node]) == (0, blksize, 1)
    assert tree["bytes"][0] == blksize + OWN_BLOCKS * OWN_SIZE
    # AND with --runtime the buffer's stack is a row of its own, no folded node
    data = _page_data(shown)
    live = [r for r in data["stacks"] if r["blocks"]]
    assert [(r["bytes"], r["runtime"]) for r in live] == [(blksize, True)] + [(OWN_SIZE, False)] * OWN_BLOCKS
    assert "(the C and C++ runtimes)" not in data["tree"]["label"].values()
    if CHROMIUM is None:
        return
    # AND the page says it above the table
    doc = dom(chromium(page, work / "profile")[0])
    assert_clean(doc, "")
    note = doc.one(id="fx-runtime")
    assert (note.attrs["data-blocks"], note.attrs["data-bytes"], note.attrs["data-stacks"]) == (
        "1", str(blksize), "1")
    assert note.text().startswith(f"runtime: 1 block, {blksize:,} bytes in 1 stack"), note.text()


def test_libstdcxx_emergency_pool_is_folded(build_victim, run_victim, run_cli, tmp_path):
    # GIVEN a C++ program whose only runtime block is libstdc++'s pool
    exe = Path(os.path.realpath(build_victim("rt_noise_cxx", cxx=True)))
    f, core = snapshot(run_victim, exe, tmp_path / "snaps")
    # WHEN inspect lists the top stacks, folded and with --runtime
    doc = json.loads(cli(run_cli, tmp_path / "state", "inspect", str(core), "--json"))
    full = json.loads(cli(run_cli, tmp_path / "state", "inspect", str(core), "--json", "--runtime"))
    # THEN the pool is the one runtime block, in libstdc++, and the program's
    # objects are the only stack listed
    pool = full["top_stacks"][0]
    assert (pool["blocks"], pool["runtime"]) == (1, True), pool
    assert os.path.basename(pool["stack"][0]["module"]).startswith("libstdc++.so"), pool["stack"][0]
    # (allocated by libstdc++'s constructor, before libtag's: the loader called it)
    assert "_dl_init" in [f["function"] for f in pool["stack"]], pool["stack"]
    assert doc["runtime"] == {"blocks": 1, "bytes": pool["bytes"], "stacks": 1, "shown": False}
    assert [(s["stack"][0]["function"], s["blocks"], s["bytes"]) for s in doc["top_stacks"]] == [
        ("make_node()", len(f["own"]), len(f["own"]) * NODE_SIZE)]
    # AND the pool has the size gcc 12's libstdc++ gives it
    if os.path.realpath(pool["stack"][0]["module"]).endswith("libstdc++.so.6.0.30"):
        assert pool["bytes"] == GCC12_POOL
