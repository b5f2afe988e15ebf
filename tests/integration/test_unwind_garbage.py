"""A stack full of garbage ends a walk: never a fault, never a junk frame.

tests/victims/uw_garbage.c (-O2, no frame pointers) allocates 20000 times
with garbage where the walk looks: its own return address slot overwritten
(random bits, small numbers, heap and stack addresses, 0), or rbp pointing
into 4 KiB of such words under code without CFI, so only a frame-pointer
walk can go on.  Every block's stack must hold none of the garbage words
(the library before the unwinder recorded 12,038 of them in the fp case).
"""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("mode", ["auto", "cfi", "fp"])
@pytest.mark.parametrize("where", ["ra", "fp"])
def test_garbage_never_becomes_a_frame(build_victim, run_victim, tmp_path, mode, where):
    # GIVEN the victim under LIBTAG_UNWIND=mode, garbage in `where`
    exe = build_victim("uw_garbage", instrument=False, extra_flags=("-O2", "-fomit-frame-pointer"))
    proc = run_victim(exe, where, snap_dir=tmp_path,
                      env={"LIBTAG_QUIET": "1", "LIBTAG_UNWIND": mode}, timeout=120)
    # THEN it ran to the end, and no recorded frame is a garbage word
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "checked 20000 bad 0", proc.stdout[-500:]
