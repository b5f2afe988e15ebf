"""forensics diff and trend on three snapshots of a victim with known growth.

tests/victims/diff_growth.c (K = 7, LIBTAG_QUARANTINE=0) keeps 10 blocks from
keep_alloc, churns 32 blocks from churn_alloc (each freed and allocated again
with the same size 20 times before every snapshot), leaks K blocks of 40 bytes
from leak_alloc before snapshots 2 and 3, and before snapshot 2 frees its
recycle_alloc block and allocates again from the same call site 50 ms later -
glibc hands back the same address, which must not count as a survivor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import forensics_test_support as S

K = 7
LEAK_SIZE = 40
CHURN = 32
KEEP = 10


def _series(build_victim, run_victim, tmp_path_factory, guard_rate: str):
    victim = Path(os.path.realpath(build_victim("diff_growth")))
    snap_dir = tmp_path_factory.mktemp(f"diff-snaps-{guard_rate}")
    snap_dir.chmod(0o700)
    done = run_victim(victim, str(K), snap_dir=snap_dir,
                      env={"LIBTAG_QUARANTINE": "0", "LIBTAG_GUARD_RATE": guard_rate})
    assert done.returncode == 0, done.stderr
    fields = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    pid = int(fields["pid"])
    old_addr, new_addr = (int(x, 16) for x in fields["recycled"].split())
    cores = [S.wait_core(snap_dir, pid, seq) for seq in (1, 2, 3)]
    return cores, old_addr, new_addr


@pytest.fixture(scope="module")
def series(build_victim, run_victim, tmp_path_factory):
    return _series(build_victim, run_victim, tmp_path_factory, "0")


@pytest.fixture(scope="module")
def guarded_series(build_victim, run_victim, tmp_path_factory):
    """The same run with every block guarded (LIBTAG_GUARD_RATE=1): a freed
    block's slot is not handed out again soon, so nothing is recycled."""
    return _series(build_victim, run_victim, tmp_path_factory, "1")


@pytest.fixture(params=["series", "guarded_series"])
def either_series(request):
    """Each test that takes it runs on both series: the growth is the same."""
    return request.getfixturevalue(request.param)


def _fn(entry: dict) -> str | None:
    return entry["stack"][0]["function"] if entry["stack"] else None


def run_json(run_cli, tmp_path, *args) -> dict:
    done = run_cli(*args, "--json", env={"XDG_STATE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_diff_shows_exactly_k_new_blocks_for_the_leaking_stack(either_series, run_cli, tmp_path):
    # GIVEN snapshots 1 and 2  WHEN diffed
    cores, _, _ = either_series
    doc = run_json(run_cli, tmp_path, "diff", cores[0], cores[1])
    growth = {_fn(g): g for g in doc["growth"]}
    # THEN the leaking stack grew by K blocks of 40 bytes, all new, and ranks first
    assert list(growth) == ["leak_alloc"]
    g = growth["leak_alloc"]
    assert (g["blocks"], g["bytes"], g["added"], g["survived"], g["gone"]) == (K, K * LEAK_SIZE, K, 0, 0)
    assert (g["same_size_share"], g["common_size"]) == (1.0, LEAK_SIZE)
    assert [f["function"] for f in g["stack"][:2]] == ["leak_alloc", "do_leak"]


def test_diff_shows_no_growth_for_churn(either_series, run_cli, tmp_path):
    cores, _, _ = either_series
    doc = run_json(run_cli, tmp_path, "diff", cores[0], cores[1])
    churn = [g for g in doc["no_growth"] if _fn(g) == "churn_alloc"]
    # THEN every churn block was replaced: 32 new, 32 gone, net zero
    assert [(g["blocks"], g["bytes"], g["added"], g["gone"], g["survived"]) for g in churn] == \
        [(0, 0, CHURN, CHURN, 0)]
    assert "churn_alloc" not in {_fn(g) for g in doc["growth"]}


def test_recycled_address_is_gone_plus_new_not_a_survivor(series, run_cli, tmp_path):
    cores, old_addr, new_addr = series
    # GIVEN glibc handed the freed block's address out again
    assert new_addr == old_addr
    doc = run_json(run_cli, tmp_path, "diff", cores[0], cores[1])
    rec = [g for g in doc["no_growth"] + doc["growth"] if _fn(g) == "recycle_alloc"]
    # THEN the block at that address is one gone and one new block
    assert [(g["survived"], g["added"], g["gone"], g["blocks"], g["addresses"]) for g in rec] == \
        [(0, 1, 1, 0, [hex(new_addr)])]
    # and the totals: new = K leaked + 32 churned + 1 recycled; gone = 32 + 1;
    # survivors = the 10 kept blocks + stdout's buffer
    assert (doc["new_blocks"], doc["gone_blocks"], doc["survived_blocks"]) == (K + CHURN + 1, CHURN + 1, KEEP + 1)


def test_diff_filter_exclude_and_min_bytes(series, run_cli, tmp_path):
    cores, _, _ = series
    only = run_json(run_cli, tmp_path, "diff", cores[0], cores[1], "--filter", "leak_*")
    assert [(_fn(g), g["blocks"]) for g in only["growth"]] == [("leak_alloc", K)]
    assert only["no_growth"] == []
    dropped = run_json(run_cli, tmp_path, "diff", cores[0], cores[1], "--exclude", "do_leak")
    assert [_fn(g) for g in dropped["growth"]] == []
    small = run_json(run_cli, tmp_path, "diff", cores[0], cores[1], "--min-bytes", str(K * LEAK_SIZE + 1))
    assert small["growth"] == []
    exact = run_json(run_cli, tmp_path, "diff", cores[0], cores[1], "--min-bytes", str(K * LEAK_SIZE))
    assert [(_fn(g), g["bytes"]) for g in exact["growth"]] == [("leak_alloc", K * LEAK_SIZE)]


def test_diff_human_output(series, run_cli, tmp_path):
    cores, _, _ = series
    done = run_cli("diff", cores[0], cores[1], env={"XDG_STATE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert f"+{K * LEAK_SIZE} bytes, +{K} blocks" in done.stdout


def test_trend_flags_only_the_leaking_stack(series, run_cli, tmp_path):
    # GIVEN the three snapshots, given out of order
    cores, _, _ = series
    doc = run_json(run_cli, tmp_path, "trend", cores[2], cores[0], cores[1])
    # THEN they are put in the order they were taken
    assert [s["snapshot_seq"] for s in doc["snapshots"]] == [1, 2, 3]
    by_fn = {}
    for s in doc["stacks"]:
        by_fn.setdefault(_fn(s), []).append(s)
    leak, = by_fn["leak_alloc"]
    assert (leak["blocks"], leak["bytes"], leak["monotonic"]) == \
        ([0, K, 2 * K], [0, K * LEAK_SIZE, 2 * K * LEAK_SIZE], True)
    churn, = by_fn["churn_alloc"]
    assert (churn["blocks"], churn["monotonic"]) == ([CHURN, CHURN, CHURN], False)
    keep, = by_fn["keep_alloc"]
    assert (keep["blocks"], keep["monotonic"]) == ([KEEP, KEEP, KEEP], False)
    rec, = by_fn["recycle_alloc"]
    assert (rec["blocks"], rec["monotonic"]) == ([1, 1, 1], False)
    assert doc["monotonic_stacks"] == 1
    assert doc["stacks"][0]["stack_id"] == leak["stack_id"]


def test_trend_human_output_and_usage_error(series, run_cli, tmp_path):
    cores, _, _ = series
    done = run_cli("trend", cores[0], cores[1], cores[2], "--growing", env={"XDG_STATE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "1 stack grows monotonically" in done.stdout
    one = run_cli("trend", cores[0], env={"XDG_STATE_HOME": str(tmp_path)})
    assert one.returncode == 2
    assert one.stderr.startswith("forensics: error: trend needs at least two snapshots")


def test_diff_in_the_wrong_order_warns(series, run_cli, tmp_path):
    # GIVEN snapshots 1 and 2 of one process, given NEW first
    cores, _, _ = series
    done = run_cli("diff", cores[1], cores[0], "--json", env={"XDG_STATE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    expected = ("OLD was taken after NEW (snapshot 2 of pid {pid} after snapshot 1): diff takes the "
                "earlier core first (forensics diff OLD NEW), so here growth and shrinkage are swapped"
                ).format(pid=doc["old"]["pid"])
    assert doc["warnings"] == [expected]
    assert done.stderr == f"forensics: warning: {expected}\n"
    # ... and in the right order it says nothing
    right = run_cli("diff", cores[0], cores[1], "--json", env={"XDG_STATE_HOME": str(tmp_path)})
    assert (json.loads(right.stdout)["warnings"], right.stderr) == ([], "")


def test_trend_top_says_how_many_stacks_it_hides(series, run_cli, tmp_path):
    cores, _, _ = series
    env = {"XDG_STATE_HOME": str(tmp_path)}
    total = run_json(run_cli, tmp_path, "trend", *cores)["stacks_total"]
    assert total >= 4, "the victim has at least its four stacks"
    done = run_cli("trend", *cores, "--top", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert f"... {total - 1} more stacks not shown (--top N shows more; --json has them all)" in done.stdout
    capped = run_json(run_cli, tmp_path, "trend", *cores, "--top", "1")
    assert (len(capped["stacks"]), capped["stacks_total"]) == (1, total)


def test_guarded_blocks_are_not_recycled(guarded_series):
    # GIVEN the run where every block is guarded (the growth tests above
    # take it too)  THEN the freed block's address was not handed out again:
    # its slot waits, inaccessible, while the pool has others
    _, old_addr, new_addr = guarded_series
    assert new_addr != old_addr
