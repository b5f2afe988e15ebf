"""Guarded sampling keeps its rate for the whole run: the first blocks of
thousands of allocation stacks (first-of-site guards, LIBTAG_GUARD_SITES=1,
the default), most of them long-lived, no longer take every slot of the
pool and starve the 1-in-N sample, and LIBTAG_STATS shows the share.

guard_longrun (tests/victims/guard_longrun.c) allocates 10,000 long-lived
blocks from 5,000 stacks, then churns CHURN short-lived blocks (50 M, ~11-13 s
under libtag on a 2-core machine), counting its own blocks that landed in the
guard pool: at half the default rate that is at least 5,000 guarded.  The rate is set to libtag's
default explicitly (conftest.py sets 0 for every other program).
"""

from __future__ import annotations

import re
from pathlib import Path

CHURN = 50_000_000
REPO = Path(__file__).resolve().parents[2]


def default_rate() -> int:
    """TAG_GUARD_DEFAULT_RATE, as libtag is built with it."""
    src = (REPO / "libtag" / "src" / "base" / "options.h").read_text()
    return int(re.search(r"#define TAG_GUARD_DEFAULT_RATE\s+(\d+)u", src).group(1))


def said(stdout: str) -> dict[str, int]:
    return {k: int(v) for line in stdout.splitlines() for k, _, v in
            (w.partition("=") for w in line.split()) if v}


def stats(stderr: str) -> dict[str, int]:
    line = next((ln for ln in stderr.splitlines() if ln.startswith("libtag: stats ")), None)
    assert line is not None, f"expected a 'libtag: stats' line, got {stderr!r}"
    return {k: int(v) for k, _, v in (kv.partition("=") for kv in line.split()[2:])}


def test_the_sample_keeps_its_rate_after_many_long_lived_first_of_site_blocks(build_victim,
                                                                             run_victim):
    rate = default_rate()
    assert rate == 5000, f"expected libtag's default rate 5000, got {rate}"
    exe = build_victim("guard_longrun", instrument=False)
    # WHEN 10,000 long-lived blocks from 5,000 sites are followed by CHURN
    # short-lived ones, at the default rate and the default first-of-site guards
    done = run_victim(exe, str(CHURN), timeout=180,
                      env={"LIBTAG_GUARD_RATE": str(rate), "LIBTAG_STATS": "1"})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    assert done.stdout.splitlines()[-1] == "done", done.stdout
    v, s = said(done.stdout), stats(done.stderr)
    assert v["churn"] == CHURN, v
    assert s["allocs"] >= CHURN + 10_000, s
    # THEN first-of-site guards took their share of the pool, not all of it
    # (half of the 256 slots a sampling pool uses before it reuses any) ...
    assert s["guard_site_firsts"] == 128, s
    assert v["long_guarded"] >= 128, v
    # ... and the churn after them was sampled at no less than half the rate
    want = CHURN // rate // 2
    assert want == 5000, want
    assert v["churn_guarded"] >= want, (v, want)
    assert s["guard_allocs"] - v["long_guarded"] >= want, (s, v, want)
    assert s["guard_sampled"] >= want, (s, want)
    # ... which LIBTAG_STATS states as one allocation in N, within 2x of the rate
    assert 0 < s["guard_one_in"] <= 2 * rate, s
