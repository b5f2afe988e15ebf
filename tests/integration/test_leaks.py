"""forensics' leak scan classifies exactly the leak shapes a victim built, and
agrees with valgrind memcheck on the same victim.

tests/victims/leak_shapes.c builds, each from its own allocating function: an
orphaned list (head definite, 4 nodes indirect), an unreachable ring of 3
(one definite, 2 indirect), a block held only by a global, one held only by a
worker thread's stack, one held only through an interior pointer in a global
(possible), and one held only in register r12 of a worker blocked in read(2).
It prints every block, then takes a libtag snapshot of itself - or, run under
valgrind, asks memcheck for a leak check at the same point.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from forensics.reader.dump import Dump
from forensics.answers.leaks import KINDS, find_leaks
import forensics_test_support as S

ALLOCATORS = ("calloc", "malloc")

# allocating function -> [(kind, blocks, bytes, indirect bytes lost through them)]
EXPECTED = {
    "new_list_node": [("definite", 1, 48, 192), ("indirect", 4, 192, 0)],
    "new_ring_node": [("definite", 1, 64, 128), ("indirect", 2, 128, 0)],
    "alloc_global_only": [("reachable", 1, 72, 0)],
    "alloc_stack_only": [("reachable", 1, 88, 0)],
    "alloc_interior_only": [("possible", 1, 100, 0)],
    "alloc_register_only": [("reachable", 1, 120, 0)],
}


@dataclass
class Shapes:
    pid: int = 0
    blocks: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # shape -> [(addr, size)]
    threads: dict[str, int] = field(default_factory=dict)  # shape -> tid
    head: int = 0


def parse(text: str) -> Shapes:
    s = Shapes()
    for line in text.splitlines():
        key, *v = line.split()
        if key == "pid":
            s.pid = int(v[0])
        elif key == "block":
            s.blocks.setdefault(v[0], []).append((int(v[1], 16), int(v[2])))
        elif key == "thread":
            s.threads[v[0]] = int(v[1])
        elif key == "head":
            s.head = int(v[1], 16)
    assert "ready" in text.split() and len(s.blocks) == 6, text
    return s


@pytest.fixture(scope="module")
def victim(build_victim) -> Path:
    return Path(os.path.realpath(build_victim("leak_shapes")))


@pytest.fixture(scope="module", params=["0", "1"], ids=["unguarded", "guarded"])
def guard_rate(request) -> str:
    """LIBTAG_GUARD_RATE: every shape must read the same when every block
    lives in a guarded slot (rate 1) as when none does."""
    return request.param


@pytest.fixture(scope="module", params=S.CORE_PATHS)
def taken(request, guard_rate, victim, run_victim, tmp_path_factory):
    """The victim's snapshot, its core written by libtag itself or by the kernel
    (their notes differ: libtag's has every thread, the kernel's the fork child)."""
    snap_dir = tmp_path_factory.mktemp(f"leak-snaps-{request.param}-{guard_rate}")
    snap_dir.chmod(0o700)
    done = run_victim(victim, "snapshot", snap_dir=snap_dir,
                      env={"LIBTAG_CORE": request.param, "LIBTAG_GUARD_RATE": guard_rate})
    assert done.returncode == 0, done.stderr
    shapes = parse(done.stdout)
    core = S.wait_core(snap_dir, shapes.pid)
    dump = Dump.open(core)
    # at rate 1 every shape's block is a guarded one
    guarded = {dump.heap.block_at(a).guarded for bs in shapes.blocks.values() for a, _ in bs}
    assert guarded == {guard_rate == "1"}, guarded
    yield shapes, core, dump
    dump.close()


def first_own_function(functions: list[str | None]) -> str | None:
    """The first frame that is not the allocator itself."""
    return next((f for f in functions if f not in ALLOCATORS), None)


def our_groups(dump: Dump) -> dict[str, list[tuple[str, int, int, int]]]:
    scan = find_leaks(dump)
    out: dict[str, list] = {}
    for g in scan.groups(kinds=KINDS):
        fn = first_own_function([f.function for f in dump.stack(g.stack_id)])
        out.setdefault(fn, []).append((g.kind, g.blocks, g.bytes, g.indirect_bytes))
    return {k: sorted(v) for k, v in out.items()}


# ------------------------------------------------------------ block by block --


def test_orphaned_list_head_is_definite_and_the_rest_indirect(taken):
    # GIVEN a 5-node list whose head pointer was dropped
    shapes, _, dump = taken
    scan = find_leaks(dump)
    nodes = [a for a, _ in shapes.blocks["list"]]
    # WHEN each node is classified  THEN the head is definite, the others indirect
    assert scan.kind_of(shapes.head) == "definite"
    assert sorted(scan.kind_of(a) for a in nodes if a != shapes.head) == ["indirect"] * 4
    assert scan.how_reached(shapes.head) is None


def test_unreachable_ring_has_one_definite_owner_and_two_indirect(taken):
    shapes, _, dump = taken
    scan = find_leaks(dump)
    ring = sorted(a for a, _ in shapes.blocks["ring"])
    # THEN the lowest-addressed node owns the cycle, as valgrind's clique leader
    assert [scan.kind_of(a) for a in ring] == ["definite", "indirect", "indirect"]


def test_block_only_a_global_points_to_is_reachable_from_that_global(taken, victim):
    shapes, _, dump = taken
    scan = find_leaks(dump)
    (addr, size), = shapes.blocks["global"]
    assert scan.kind_of(addr) == "reachable"
    assert [(r.kind, r.module, r.interior) for r in scan.roots_of(addr)] == [("global", str(victim), False)]
    root, steps = scan.how_reached(addr)
    assert (root.kind, root.module) == ("global", str(victim))
    assert [(s.block_start, s.size) for s in steps] == [(addr, size)]


def test_block_only_a_thread_stack_points_to_is_reachable_from_that_stack(taken):
    shapes, _, dump = taken
    scan = find_leaks(dump)
    (addr, _), = shapes.blocks["stack"]
    tid = shapes.threads["stack"]
    assert scan.kind_of(addr) == "reachable"
    assert [(r.kind, r.thread) for r in scan.roots_of(addr)] == [("stack", tid)]
    root, _ = scan.how_reached(addr)
    assert (root.kind, root.thread) == ("stack", tid)


def test_block_reached_only_through_an_interior_pointer_is_possible(taken, victim):
    shapes, _, dump = taken
    scan = find_leaks(dump)
    (addr, _), = shapes.blocks["interior"]
    assert scan.kind_of(addr) == "possible"
    assert [(r.kind, r.module, r.interior) for r in scan.roots_of(addr)] == [("global", str(victim), True)]


def test_block_held_only_in_another_threads_register_is_reachable_from_it(taken):
    # GIVEN a worker blocked in read(2) holding the only pointer in r12: libtag
    # saved its registers in its thread record before the snapshot's fork
    shapes, _, dump = taken
    scan = find_leaks(dump)
    (addr, _), = shapes.blocks["register"]
    tid = shapes.threads["register"]
    assert scan.kind_of(addr) == "reachable"
    assert [(r.kind, r.thread, r.register) for r in scan.roots_of(addr)] == [("register", tid, "r12")]


def test_groups_by_allocation_stack_are_exactly_the_shapes(taken):
    _, _, dump = taken
    groups = our_groups(dump)
    for fn, want in EXPECTED.items():
        assert groups.get(fn) == sorted(want), fn


def test_leak_groups_carry_the_allocation_times(taken):
    _, _, dump = taken
    scan = find_leaks(dump)
    idx = dump.heap.index
    for g in scan.groups():
        sel = (idx["alloc_stack"] == g.stack_id) & (scan.kind == {"definite": 4, "indirect": 3,
                                                                   "possible": 2}[g.kind])
        times = idx["alloc_time"][sel]
        assert (g.oldest_ms, g.newest_ms) == (int(times.min()), int(times.max()))


def test_inspect_leaks_json_lists_the_lost_groups(taken, run_cli, tmp_path):
    # WHEN forensics inspect --leaks --json runs on the core
    _, core, _ = taken
    done = run_cli("inspect", str(core), "--leaks", "--json", env={"XDG_STATE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    got = sorted((first_own_function([f["function"] for f in g["stack"]]), g["kind"], g["blocks"], g["bytes"])
                 for g in doc["leaks"] if g["stack"] and g["stack"][0]["function"] in EXPECTED
                 or first_own_function([f["function"] for f in g["stack"]]) in EXPECTED)
    # THEN the definite/indirect/possible groups of the shapes are there, with the fields of docs/json.md
    assert got == sorted([
        ("alloc_interior_only", "possible", 1, 100),
        ("new_list_node", "definite", 1, 48),
        ("new_list_node", "indirect", 4, 192),
        ("new_ring_node", "definite", 1, 64),
        ("new_ring_node", "indirect", 2, 128),
    ])
    for g in doc["leaks"]:
        assert set(g) >= {"kind", "blocks", "bytes", "stack"}


def test_inspect_leaks_human_output_runs(taken, run_cli, tmp_path):
    _, core, _ = taken
    done = run_cli("inspect", str(core), "--leaks", env={"XDG_STATE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Traceback") == 0


# ------------------------------------------------------------------ valgrind --

_VG_KIND = {"Leak_DefinitelyLost": "definite", "Leak_IndirectlyLost": "indirect",
            "Leak_PossiblyLost": "possible", "Leak_StillReachable": "reachable"}


def valgrind_groups(xml_path: Path) -> dict[str, list[tuple[str, int, int, int]]]:
    """The loss records of the first leak check in a memcheck XML file, as
    allocating function -> [(kind, blocks, direct bytes, indirect bytes)]."""
    root = ET.parse(xml_path).getroot()
    out: dict[str, list] = {}
    total = None
    for err in root.iter("error"):
        kind = _VG_KIND.get(err.findtext("kind") or "")
        if kind is None:
            continue
        xw = err.find("xwhat")
        text = xw.findtext("text")
        n, of = map(int, re.search(r"loss record (\d+) of (\d+)", text).groups())
        total = of if total is None else total
        fns = [f.findtext("fn") for f in err.find("stack").iter("frame")]
        nbytes = int(xw.findtext("leakedbytes"))
        m = re.search(r"\(([\d,]+) direct, ([\d,]+) indirect\)", text)
        direct, indirect = (int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))) if m \
            else (nbytes, 0)
        out.setdefault(first_own_function(fns), []).append(
            (kind, int(xw.findtext("leakedblocks")), direct, indirect))
        if n == total:
            break  # the leak check at exit follows
    return {k: sorted(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def memcheck(victim, tmp_path_factory):
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed")
    xml = tmp_path_factory.mktemp("vg") / "memcheck.xml"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run(
        ["valgrind", "--tool=memcheck", "--leak-check=no", "--show-leak-kinds=all",
         "--leak-check-heuristics=none", "--xml=yes", f"--xml-file={xml}", str(victim), "valgrind"],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    parse(done.stdout)
    return valgrind_groups(xml)


def test_memcheck_agrees_on_every_shape(memcheck, taken):
    # GIVEN the same victim under memcheck, checked at the same point
    _, _, dump = taken
    ours = our_groups(dump)
    for fn, want in EXPECTED.items():
        # THEN memcheck's kind, blocks and bytes (direct and indirect) are the victim's ...
        assert memcheck.get(fn) == sorted(want), fn
        # ... and ours
        assert ours.get(fn) == memcheck.get(fn), fn


def test_memcheck_agrees_on_libc_blocks(memcheck, taken):
    # stdout's buffer: reachable from libc's globals in both
    _, _, dump = taken
    ours = our_groups(dump)
    assert memcheck["_IO_file_doallocate"] == [("reachable", 1, 4096, 0)]
    assert ours["_IO_file_doallocate"] == [("reachable", 1, 4096, 0)]


def test_thread_dtvs_are_possible_in_both_and_ours_one_slot_larger(memcheck, taken):
    # The DTV glibc callocs for each new thread is pointed to 16 bytes in
    # (dtv[-1] holds its length): possible in both.  Under libtag the process
    # has one more module with TLS (libtag.so itself), so each DTV has one more
    # 16-byte slot (docs/leaks.md).
    _, _, dump = taken
    vg = memcheck["allocate_dtv"]
    assert [(k, n) for k, n, _, _ in vg] == [("possible", 1), ("possible", 1)]
    scan = find_leaks(dump)
    possible = [g for g in scan.groups(kinds=("possible",))
                if first_own_function([f.function for f in dump.stack(g.stack_id)]) != "alloc_interior_only"]
    # one group per creating stack, as memcheck's (full stacks tell the two
    # pthread_create calls apart)
    assert sorted((g.kind, g.blocks, g.bytes) for g in possible) == \
        sorted(("possible", 1, b + 16) for _, _, b, _ in vg)
