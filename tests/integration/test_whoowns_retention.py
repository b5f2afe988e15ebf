"""forensics whoowns says who keeps a block alive: the shortest chains of
references from a root (a global by symbol, a live stack frame by thread and
function, TLS, a register) through live blocks to it.

tests/victims/slab_chain.c holds a 4096-byte slab page only through the
global ``registry`` -> a table block -> the table's slot 5, while 63 words of
the slab point into the slab itself (a free list); a block pointed to by the
250 words of another block; and a block held by a local variable of
hold_on_stack only, whose frame is live when the victim snapshots itself.
It prints every address, offset and thread id.  Under libtag it snapshots
itself; without libtag (``abort``) the kernel writes its core and glibc's
chunks are the blocks.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from forensics.snapshots import snapdir
import forensics_test_support as S

SLAB_SIZE, TABLE_SIZE, SLOT_OFFSET, CROWD, CROWD_SIZE, STACK_BLOCK_SIZE = 4096, 128, 48, 250, 40, 48
SHOWN_REFERRERS, JSON_REFERRERS = 50, 200  # whoowns' text table and --json's cut


@dataclass
class Case:
    exe: Path
    facts: dict[str, list[int]]
    core: Path
    state: Path

    def __getitem__(self, key: str) -> int:
        return self.facts[key][0]


def parse(stdout: str) -> dict[str, list[int]]:
    facts = {}
    for line in stdout.splitlines():
        key, *rest = line.split()
        facts[key] = [int(v, 0) for v in rest]
    want = {"pid", "main_tid", "registry", "table", "slot", "slab", "crowd", "crowd_holder",
            "crowd_root", "stack_block", "stack_slot", "freed", "leaked"}
    assert want <= facts.keys(), f"expected the lines {sorted(want)}, got {stdout!r}"
    return facts


@pytest.fixture(scope="module")
def exe(build_victim) -> Path:
    return Path(os.path.realpath(build_victim("slab_chain")))


@pytest.fixture(scope="module", params=S.CORE_PATHS)
def case(request, exe, run_victim, tmp_path_factory) -> Case:
    snaps = tmp_path_factory.mktemp(f"retain-snaps-{request.param}")
    snaps.chmod(0o700)
    done = run_victim(exe, snap_dir=snaps, env={"LIBTAG_CORE": request.param})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    facts = parse(done.stdout)
    dirs = list(snaps.glob(f"*-{facts['pid'][0]}-1-on-demand"))
    assert len(dirs) == 1, f"expected one snapshot dir, got {sorted(snaps.iterdir())}"
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    assert core is not None, f"expected a core in {snap.path}"
    return Case(exe, facts, core, tmp_path_factory.mktemp("state"))


def ask(run_cli, case: Case, addr: int) -> dict:
    result = run_cli("whoowns", hex(addr), "--core", str(case.core), "--json",
                     env={"XDG_STATE_HOME": str(case.state)})
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def text(run_cli, case: Case, addr: int) -> str:
    result = run_cli("whoowns", hex(addr), "--core", str(case.core),
                     env={"XDG_STATE_HOME": str(case.state), "COLUMNS": "200"})
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    return result.stdout


def global_root(case: Case, name: str, addr: int) -> dict:
    return {"kind": "global", "address": hex(addr), "thread": None, "register": None,
            "module": str(case.exe), "symbol": name, "section": ".bss", "function": None,
            "interior": False}


def test_slab_is_kept_alive_by_registry_through_the_table_slot(case, run_cli):
    # GIVEN the slab page, held only by registry -> table -> slot 5
    # WHEN whoowns is asked about a word inside the slab
    doc = ask(run_cli, case, case["slab"] + 200)
    # THEN one root keeps it alive: the global registry in the victim's .bss;
    # the path's one link is the table block at its exact start, through the
    # word of slot 5 at offset 48, pointing at the slab's start
    assert doc["retainers"] == [{
        "root": global_root(case, "registry", case["registry"]),
        "path": [{"address": hex(case["slot"]), "block_start": hex(case["table"]),
                  "size": TABLE_SIZE, "offset": SLOT_OFFSET, "interior": False}],
    }], doc["retainers"]
    assert case.facts["slot"][1] == SLOT_OFFSET and case["slot"] - case["table"] == SLOT_OFFSET
    assert (doc["retainer_count"], doc["retainers_depth_limited"]) == (1, False), doc
    # AND the slab's 63 free-list links into itself are counted, never a link nor a referrer
    assert doc["self_referrers"] == 63, doc["self_referrers"]
    assert doc["referrer_count"] == 1, doc["referrers"]
    slab_words = range(case["slab"], case["slab"] + SLAB_SIZE)
    assert not [p for r in doc["retainers"] for p in r["path"]
                if int(p["address"], 16) in slab_words], doc["retainers"]


def test_text_prints_the_chain(case, run_cli):
    # WHEN whoowns prints the slab's answer as text
    out = text(run_cli, case, case["slab"])
    # THEN "kept alive by" gives the chain on one line: the global, the table's word, this block
    chain = (f"global registry (.bss of {case.exe.name}) -> {hex(case['slot'])} "
             f"[+{SLOT_OFFSET} of {TABLE_SIZE}-byte block {hex(case['table'])}] -> this block")
    assert "kept alive by (1 root, shortest chains first)" in out, out
    assert f"  {chain}\n" in out, f"expected {chain!r} in:\n{out}"
    assert "more roots" not in out, out


def test_stack_root_names_the_thread_and_the_function(case, run_cli):
    # GIVEN a block held only by hold_on_stack's local variable, its frame live at the snapshot
    # WHEN
    doc = ask(run_cli, case, case["stack_block"])
    # THEN the root is that stack word of the main thread, in hold_on_stack; no link between
    assert doc["retainers"] == [{
        "root": {"kind": "stack", "address": hex(case["stack_slot"]), "thread": case["main_tid"],
                 "register": None, "module": None, "symbol": None, "section": None,
                 "function": "hold_on_stack", "interior": False},
        "path": [],
    }], doc["retainers"]
    assert doc["retainer_count"] == 1, doc["retainer_count"]
    # AND the text says it
    out = text(run_cli, case, case["stack_block"])
    line = (f"  stack of thread {case['main_tid']} in hold_on_stack (word {hex(case['stack_slot'])})"
            " -> this block\n")
    assert line in out, f"expected {line!r} in:\n{out}"


def test_long_referrer_list_says_how_many_it_left_out(case, run_cli):
    # GIVEN a block pointed to by every one of the 250 words of another block
    # WHEN
    doc = ask(run_cli, case, case["crowd"])
    out = text(run_cli, case, case["crowd"])
    # THEN --json lists 200 of the 250 and counts them all
    assert (len(doc["referrers"]), doc["referrer_count"]) == (JSON_REFERRERS, CROWD), doc["referrer_count"]
    assert {r["block_start"] for r in doc["referrers"]} == {hex(case["crowd_holder"])}, doc["referrers"]
    # AND the text shows 50 rows and says how many more there are, exactly
    line = (f"  ... and {CROWD - SHOWN_REFERRERS} more referrers "
            f"(roots first; --json lists {JSON_REFERRERS})\n")
    assert line in out, f"expected {line!r} in:\n{out}"
    assert out.count(f"│ heap │ block {hex(case['crowd_holder'])} │") == SHOWN_REFERRERS, out
    # AND the one root keeps it alive through the holder's first word
    assert doc["retainers"] == [{
        "root": global_root(case, "crowd_root", case["crowd_root"]),
        "path": [{"address": hex(case["crowd_holder"]), "block_start": hex(case["crowd_holder"]),
                  "size": CROWD * 8, "offset": 0, "interior": False}],
    }], doc["retainers"]
    assert case.facts["crowd_holder"][1] == CROWD * 8, case.facts["crowd_holder"]


def test_freed_block_has_no_retainers(case, run_cli):
    # GIVEN a block freed before the snapshot
    # WHEN
    doc = ask(run_cli, case, case["freed"])
    out = text(run_cli, case, case["freed"])
    # THEN nothing keeps a freed block alive: no retention answer, none printed
    assert (doc["block"]["state"], doc["block"]["size"]) == ("freed", case.facts["freed"][1]), doc["block"]
    assert (doc["retainers"], doc["retainer_count"], doc["retainers_depth_limited"]) == (
        None, None, False), doc
    assert "kept alive by" not in out, out


def test_leaked_block_is_kept_alive_by_nothing(case, run_cli):
    # GIVEN a live block whose only pointer the victim dropped
    # WHEN
    doc = ask(run_cli, case, case["leaked"])
    out = text(run_cli, case, case["leaked"])
    # THEN no root reaches it, and the text says it is a leak
    assert (doc["block"]["state"], doc["block"]["size"]) == ("live", case.facts["leaked"][1]), doc["block"]
    assert (doc["retainers"], doc["retainer_count"], doc["retainers_depth_limited"]) == ([], 0, False), doc
    line = "  kept alive by nothing: no global, live stack frame, TLS or register reaches it - a leak\n"
    assert line in out, f"expected {line!r} in:\n{out}"


# ------------------------------------------------------------ without libtag --


def _raise_soft_core_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


@pytest.mark.skipif(S.kernel_core_skip_reason() is not None,
                    reason=S.kernel_core_skip_reason() or "")
def test_without_libtag_the_chunk_has_the_same_paths(build_victim, run_cli, tmp_path):
    # GIVEN slab_chain without libtag, aborted inside hold_on_stack: the kernel's core
    exe = Path(os.path.realpath(build_victim("slab_chain", instrument=False)))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run([str(exe), "abort"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, preexec_fn=_raise_soft_core_limit, check=False)
    assert done.returncode == -6, f"expected SIGABRT (-6), got {done.returncode}: {done.stderr}"
    cores = [p for p in tmp_path.iterdir() if p.name.startswith("core")]
    assert len(cores) == 1, f"expected one core in {tmp_path}, got {sorted(tmp_path.iterdir())}"
    case = Case(exe, parse(done.stdout), cores[0], tmp_path / "state")
    # WHEN whoowns is asked about the slab's chunk
    doc = ask(run_cli, case, case["slab"])
    # THEN registry -> the table's chunk (its usable size: 136 bytes for 128) -> the slab
    assert doc["libtag"] is False, doc["libtag"]
    assert doc["retainers"] == [{
        "root": global_root(case, "registry", case["registry"]),
        "path": [{"address": hex(case["slot"]), "block_start": hex(case["table"]),
                  "size": 136, "offset": SLOT_OFFSET, "interior": False}],
    }], doc["retainers"]
    assert (doc["retainer_count"], doc["self_referrers"]) == (1, 63), doc
    # AND the block held by hold_on_stack's local: that frame, not glibc's arena
    # (its top pointer lies in the chunk's usable bytes)
    doc = ask(run_cli, case, case["stack_block"])
    assert [(r["root"]["kind"], r["root"]["address"], r["root"]["thread"], r["root"]["function"],
             r["path"]) for r in doc["retainers"]] == [
        ("stack", hex(case["stack_slot"]), case["main_tid"], "hold_on_stack", [])], doc["retainers"]
    assert doc["retainer_count"] == 1, doc["retainer_count"]
