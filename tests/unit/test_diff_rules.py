"""diff's block matching and per-stack growth, driven by fake memory.

GIVEN two fake snapshots of one process (same pid, same libtag start)
WHEN forensics.answers.diff compares them
THEN a block survives only when its start, allocation time, thread and stack
are all the same; an address handed out again is one gone and one new block;
and each stack's growth, churn and common size are counted.
"""

from __future__ import annotations

import forensics_test_fakes as F

from forensics.answers.diff import diff, match, same_process
from forensics.reader.dump import Dump


def test_a_block_survives_only_with_the_same_identity():
    old, new = F.FakeProcess(), F.FakeProcess()
    s = old.stack_id(0x1000)
    new.stack_id(0x1000)
    kept = old.block(0x40, size=16, stack=s, time=5)
    assert new.block(0x40, size=16, stack=s, time=5) == kept
    # the same address, freed and handed out again between the snapshots
    reused = old.block(0x80, size=16, stack=s, time=6)
    assert new.block(0x80, size=16, stack=s, time=9) == reused
    o, n = Dump(old.memory()), Dump(new.memory())
    assert same_process(o, n)
    d = diff(o, n)
    assert (d.survived_blocks, d.new_blocks, d.gone_blocks) == (1, 1, 1)
    (g,) = d.stacks
    assert (g.old_blocks, g.new_blocks, g.survived, g.added, g.gone, g.blocks, g.bytes) == (2, 2, 1, 1, 1, 0, 0)


def test_match_compares_every_part_of_the_identity():
    import numpy as np

    def live(**cols):
        return {k: np.array(v, dtype=np.uint64 if k == "start" else np.uint32) for k, v in cols.items()}

    old = live(start=[0x10, 0x20, 0x30, 0x40], alloc_time=[1, 1, 1, 1], tid=[7, 7, 7, 7], alloc_stack=[3, 3, 3, 3])
    new = live(start=[0x10, 0x20, 0x30, 0x50], alloc_time=[1, 2, 1, 1], tid=[7, 7, 8, 7], alloc_stack=[3, 3, 3, 3])
    keep_old, keep_new = match(old, new)
    assert keep_old.tolist() == [True, False, False, False]
    assert keep_new.tolist() == [True, False, False, False]


def test_growth_by_stack_most_severe_first_with_its_common_size():
    old, new = F.FakeProcess(), F.FakeProcess()
    leak, churn = old.stack_id(0x1000), old.stack_id(0x2000)
    new.stack_id(0x1000), new.stack_id(0x2000)
    old.block(0x40, size=64, stack=churn, time=1)
    new.block(0x40, size=32, stack=churn, time=7)  # freed and another allocated
    for i in range(3):
        new.block(0x100 + 0x40 * i, size=24, stack=leak, time=10 + i)
    new.block(0x200, size=40, stack=leak, time=20)
    d = diff(Dump(old.memory()), Dump(new.memory()))
    assert [g.key for g in d.stacks] == [leak, churn]
    grew, shrank = d.stacks
    assert (grew.bytes, grew.blocks, grew.added, grew.common_size, grew.same_size_share) == (112, 4, 4, 24, 0.75)
    assert (shrank.bytes, shrank.blocks, shrank.added, shrank.gone) == (-32, 0, 1, 1)
    assert diff(Dump(old.memory()), Dump(new.memory()), min_bytes=100).stacks[0].key == leak
    assert len(diff(Dump(old.memory()), Dump(new.memory()), min_bytes=100).stacks) == 1


def test_snapshots_of_two_processes_share_no_block():
    old, new = F.FakeProcess(start_realtime_ns=1), F.FakeProcess(start_realtime_ns=2)
    assert not same_process(Dump(old.memory()), Dump(new.memory()))
