"""Reusing the outer part of the last walk never changes a stack.

tests/victims/uw_reuse.c makes 3 x 20000 allocations and frees through
random call paths (random depth, two functions with different call sites
and frame sizes, alloca of random sizes on the way), so consecutive stacks
share outer frames at shifting addresses.  Each function stores its own
return address; the victim checks every block's allocation and free stack
against them at once, and counts mismatches.  A capture that reused an
outer part that no longer holds would show up as a mismatch (a build whose
check always passes gives hundreds).
"""
from __future__ import annotations

import pytest

# checks per thread: fixed by the victim's seeds (every allocation, and
# every free of a block it still held)
CHECKED = {1: 15083, 2: 14963, 3: 15019}


@pytest.mark.parametrize("flags,mode", [
    (("-O2", "-fomit-frame-pointer"), "auto"),
    (("-O2", "-fomit-frame-pointer"), "cfi"),
    (("-O2", "-fno-omit-frame-pointer"), "fp"),
], ids=["O2-auto", "O2-cfi", "O2-frame-pointers-fp"])
def test_every_stack_is_the_path_taken(build_victim, run_victim, tmp_path, flags, mode):
    # GIVEN the victim, not instrumented, under LIBTAG_UNWIND=mode
    exe = build_victim("uw_reuse", instrument=False, extra_flags=flags)
    proc = run_victim(exe, snap_dir=tmp_path, env={"LIBTAG_QUIET": "1", "LIBTAG_UNWIND": mode},
                      timeout=120)
    assert proc.returncode == 0, proc.stderr
    # THEN every thread checked every stack and found none wrong
    got = {}
    for line in proc.stdout.splitlines():
        word = line.split()
        if word[:1] == ["thread"]:
            got[int(word[1])] = (int(word[3]), int(word[5]))
    assert got == {t: (n, 0) for t, n in CHECKED.items()}, proc.stdout[-2000:]
