"""The leak scan's classification, driven by fake memory (no process, no core).

GIVEN a fake libtag process whose globals, stack, registers and blocks point
at each other in the shapes docs/leaks.md describes
WHEN forensics.answers.leaks scans a Dump of it
THEN each live block is reachable, possible, indirect or definite exactly as
valgrind's memcheck would say, and the groups count them by allocation stack.
"""

from __future__ import annotations

import forensics_test_fakes as F

from forensics.answers.leaks import LeakScan
from forensics.reader import abi
from forensics.reader.dump import Dump


def scan_of(proc: F.FakeProcess) -> LeakScan:
    return LeakScan(Dump(proc.memory()))


def test_blocks_reached_from_a_global_through_start_pointers_are_reachable():
    proc = F.FakeProcess()
    a = proc.block(0x40, size=16)
    b = proc.block(0x80, size=16)
    proc.word(proc.globals_at(0x10), a)
    proc.word(a, b)  # a->next = b
    scan = scan_of(proc)
    assert (scan.kind_of(a), scan.kind_of(b)) == ("reachable", "reachable")
    root, steps = scan.how_reached(b)
    assert (root.kind, root.address, root.module) == ("global", proc.globals_at(0x10), "/fake/program")
    assert [(s.block_start, s.via) for s in steps] == [(a, proc.globals_at(0x10)), (b, a)]


def test_an_interior_pointer_makes_a_block_possible_and_what_it_reaches_too():
    proc = F.FakeProcess()
    c = proc.block(0x40, size=32)
    d = proc.block(0xA0, size=16)
    proc.word(proc.globals_at(0), c + 8)  # into c, not at its start
    proc.word(c + 16, d)
    scan = scan_of(proc)
    assert (scan.kind_of(c), scan.kind_of(d)) == ("possible", "possible")


def test_an_unreached_block_is_definite_and_what_only_it_points_to_indirect():
    proc = F.FakeProcess()
    s_lost, s_child = proc.stack_id(0x1000), proc.stack_id(0x2000)
    e = proc.block(0x40, size=16, stack=s_lost)
    f = proc.block(0x80, size=24, stack=s_child)
    proc.word(e, f)
    scan = scan_of(proc)
    assert (scan.kind_of(e), scan.kind_of(f)) == ("definite", "indirect")
    (g,) = [g for g in scan.groups() if g.kind == "definite"]
    assert (g.stack_id, g.blocks, g.bytes, g.indirect_blocks, g.indirect_bytes) == (s_lost, 1, 16, 1, 24)


def test_a_lost_cycle_has_one_definite_owner_its_lowest_block():
    proc = F.FakeProcess()
    g = proc.block(0x40, size=16)
    h = proc.block(0x80, size=16)
    proc.word(g, h)
    proc.word(h, g)
    scan = scan_of(proc)
    assert (scan.kind_of(g), scan.kind_of(h)) == ("definite", "indirect")
    (group,) = [x for x in scan.groups() if x.kind == "definite"]
    assert (group.blocks, group.cycle_leaders, group.indirect_blocks) == (1, 1, 1)


def test_a_live_stack_frame_is_a_root_and_a_dead_one_is_not():
    proc = F.FakeProcess()  # the thread's saved rsp is 0x800 into its stack
    live = proc.block(0x40, size=16)
    dead = proc.block(0x80, size=16)
    proc.word(proc.stack_at(0x900), live)  # above the stack pointer
    proc.word(proc.stack_at(0x100), dead)  # below it: a returned-from frame
    scan = scan_of(proc)
    assert (scan.kind_of(live), scan.kind_of(dead)) == ("reachable", "definite")
    (root,) = scan.roots_of(live)
    assert (root.kind, root.thread, root.address) == ("stack", F.MAIN_TID, proc.stack_at(0x900))


def test_a_register_holding_a_block_start_is_a_root():
    proc = F.FakeProcess()
    r = proc.block(0x40, size=16)
    proc.threads[0]["regs"][5] = r  # rbx, in user_regs_struct order
    scan = scan_of(proc)
    assert scan.kind_of(r) == "reachable"
    (root,) = scan.roots_of(r)
    assert (root.kind, root.thread, root.register) == ("register", F.MAIN_TID, "rbx")


def test_pointers_in_freed_blocks_are_not_references():
    proc = F.FakeProcess()
    target = proc.block(0x40, size=16)
    proc.block(0x80, size=64, freed=(0, 1, 1))
    proc.word(0x80 + abi.TAG_SIZE + 32 + F.HEAP, target)  # inside the freed payload
    proc.word(proc.globals_at(0), 0x80 + abi.TAG_SIZE + F.HEAP)  # a global still points at the freed one
    scan = scan_of(proc)
    assert scan.kind_of(target) == "definite"
    assert scan.kind_of(0x80 + abi.TAG_SIZE + F.HEAP) is None  # freed: not a leak question


def test_counts_by_kind():
    proc = F.FakeProcess()
    a = proc.block(0x40, size=16)
    proc.block(0x80, size=24)
    proc.word(proc.globals_at(0), a)
    assert scan_of(proc).counts() == {"reachable": {"blocks": 1, "bytes": 16},
                                      "possible": {"blocks": 0, "bytes": 0},
                                      "indirect": {"blocks": 0, "bytes": 0},
                                      "definite": {"blocks": 1, "bytes": 24}}


# ------------------------------------------------------ retention paths --

def test_a_slabs_retention_path_skips_its_own_links_and_names_each_hop():
    # GIVEN a global -> a table (slot at +24) -> a slab whose words link
    # into the slab itself (a free list), and a second, longer chain from
    # the stack through another block
    proc = F.FakeProcess()
    table = proc.block(0x40, size=64)
    slab = proc.block(0x100, size=256)
    side = proc.block(0x240, size=16)
    proc.word(proc.globals_at(0x10), table)
    proc.word(table + 24, slab)
    for off in range(0, 256, 32):
        proc.word(slab + off, slab + off + 32 if off + 32 < 256 else slab)
    proc.word(proc.stack_at(0x900), side)
    proc.word(side + 8, slab + 16)  # interior
    # WHEN who keeps the slab alive is asked
    r = LeakScan(Dump(proc.memory()), classify=False).retainers(slab)
    # THEN two roots reach it, the shortest chain first: the global, the
    # table's slot; then the stack word, the side block (interior); the
    # slab's own words are no link
    assert r.count == 2 and not r.depth_limited
    (g_root, g_links), (s_root, s_links) = r.paths
    assert (g_root.kind, g_root.address) == ("global", proc.globals_at(0x10))
    assert [(x.block_start, x.via - x.block_start, x.interior) for x in g_links] == [(table, 24, False)]
    assert (s_root.kind, s_root.address, s_root.thread) == ("stack", proc.stack_at(0x900), F.MAIN_TID)
    assert [(x.block_start, x.via - x.block_start, x.interior) for x in s_links] == [(side, 8, True)]


def test_a_lost_block_has_no_retainers_and_a_freed_one_none_to_give():
    proc = F.FakeProcess()
    lost = proc.block(0x40, size=16)
    gone = proc.block(0x80, size=16, freed=(0, F.MAIN_TID, 5))
    proc.word(proc.globals_at(0), gone)
    scan = LeakScan(Dump(proc.memory()), classify=False)
    r = scan.retainers(lost)
    assert (r.paths, r.count) == ([], 0)
    assert scan.retainers(gone) is None  # no live block holds it
