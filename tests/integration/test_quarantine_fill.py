"""A write after free deep inside a freed block, caught by libtag's DEFAULT
quarantine: every byte of a freed block up to 4 KiB holds the fill pattern
(LIBTAG_QUARANTINE_FILL, default 4096) and is checked when the block leaves
the quarantine or, here, when the process exits.

uaf_deep (tests/victims/uaf_deep.c) has the shape of a real bug: a
1,160-byte struct freed by loop_destroy, then its caller loop_dealloc
clears the pointer at offset 1128; and the same 8-byte store at offsets
300, 2000 and 4000 of a 4 KiB block freed by buffer_destroy, called by
buffer_release.  No LIBTAG_QUARANTINE* is set; LIBTAG_GUARD_RATE=0 comes
from conftest.py, so the quarantine, not a guarded block, catches it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from forensics.snapshots import snapdir
import forensics_test_support as S

# case -> (victim arguments, block size, offset written, the allocation's,
# the free's innermost functions in the victim)
CASES = {
    "loop-1128": (["loop"], 1160, 1128, ["loop_new", "main"],
                  ["loop_destroy", "loop_dealloc", "main"]),
    **{f"buffer-{off}": (["buffer", str(off)], 4096, off, ["buffer_new", "main"],
                         ["buffer_destroy", "buffer_release", "main"])
       for off in (300, 2000, 4000)},
}


def facts(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def functions(frames: list[dict], exe: Path) -> list[str]:
    """The victim's own frames' function names, innermost first, through main."""
    names = [f["function"] for f in frames if f["module"] == str(exe)]
    return names[:names.index("main") + 1] if "main" in names else names


def the_use_after_free(snaps: Path, run_cli, tmp_path: Path) -> tuple[Path, dict]:
    """The one snapshot in snaps, the use-after-free's, once complete: its
    core and inspect's one anomaly in it."""
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1 and dirs[0].name.endswith("-1-use-after-free"), [d.name for d in dirs]
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    assert core is not None, f"expected a core in {snap.path}"
    result = run_cli("inspect", str(core), "--json",
                     env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert result.returncode == 0, result.stderr
    [a] = json.loads(result.stdout)["anomalies"]
    return core, a


@pytest.mark.parametrize("case", list(CASES))
def test_a_write_deep_in_a_freed_block_is_caught_with_default_settings(case, build_victim,
                                                                       run_victim, run_cli,
                                                                       tmp_path):
    args, size, off, alloc_fns, free_fns = CASES[case]
    exe = Path(os.path.realpath(build_victim("uaf_deep", instrument=False)))
    env = {k: v for k, v in os.environ.items() if k.startswith("LIBTAG_QUARANTINE")}
    assert env == {}, f"expected libtag's default quarantine, got {env}"
    snaps = tmp_path / "snaps"
    # WHEN the victim frees the block, then stores 8 bytes of NULL at OFF
    done = run_victim(exe, *args, snap_dir=snaps, on_anomaly="snapshot",
                      env={"LIBTAG_CORE": "self"})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    assert done.stdout.splitlines()[-1] == "survived", done.stdout
    f = facts(done.stdout)
    block = int(f["block"], 16)
    assert (int(f["size"]), int(f["address"], 16)) == (size, block + off), f
    # THEN one snapshot, the use-after-free's, found when the process exited
    _, a = the_use_after_free(snaps, run_cli, tmp_path)
    # ... at the first byte written, the 8 bytes of NULL
    assert (a["kind"], a["address"], a["offset"], a["written"]) == (
        "use-after-free", hex(block + off), off, "00" * 8), a
    # ... naming the block, its allocation and its free
    b = a["block"]
    assert (b["start"], b["size"], b["state"]) == (hex(block), size, "freed"), b
    assert functions(b["alloc_stack"], exe) == alloc_fns, b["alloc_stack"]
    assert functions(b["free_stack"], exe) == free_fns, b["free_stack"]
    # ... found by libtag's check at exit (the quarantine's flush)
    assert "libtag_destructor" in [x["function"] for x in a["stack"]], a["stack"]


def test_hunting_mode_catches_it_at_the_instruction_in_a_core_of_the_slots_used(
        build_victim, run_victim, run_cli, tmp_path):
    # GIVEN every allocation guarded (LIBTAG_GUARD_RATE=1): a pool reserved
    # for 262144 slots of 20 KiB (5.4 GB of address space)
    exe = Path(os.path.realpath(build_victim("uaf_deep", instrument=False)))
    snaps = tmp_path / "snaps"
    # WHEN loop_dealloc clears the pointer at offset 1128 after the free
    done = run_victim(exe, "loop", snap_dir=snaps, on_anomaly="snapshot",
                      env={"LIBTAG_CORE": "self", "LIBTAG_GUARD_RATE": "1"})
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    f = facts(done.stdout)
    block = int(f["block"], 16)
    # THEN the store faulted at its instruction in loop_dealloc, on the guarded block
    core, a = the_use_after_free(snaps, run_cli, tmp_path)
    assert (a["kind"], a["access"], a["address"], a["offset"]) == (
        "use-after-free", "write", hex(block + 1128), 1128), a
    b = a["block"]
    assert (b["start"], b["size"], b["state"], b["guarded"]) == (hex(block), 1160, "freed", True), b
    assert functions(a["stack"], exe) == ["loop_dealloc", "main"], a["stack"]
    assert functions(b["free_stack"], exe) == ["loop_destroy", "loop_dealloc", "main"], b
    # ... and the core holds the slots used, not the whole reservation (it
    # was 5,395,947,520 bytes when every slot was exposed)
    size = core.stat().st_size
    assert size < 64 << 20, f"expected a core under 64 MiB, got {size} bytes"
