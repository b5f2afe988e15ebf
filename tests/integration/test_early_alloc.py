"""An allocation made before libtag's constructor runs - in another
library's constructor, which the loader runs first - has its whole stack:
the constructor's functions down to the loader's _dl_init, not one frame.

Victims: tests/victims/ctor_lib.c, built here as a shared library whose
constructor allocates 333 bytes (ctor_init -> ctor_alloc -> ctor_helper),
and tests/victims/ctor_main.c linked with it, which prints the block.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from forensics.snapshots import snapdir

VICTIMS = Path(__file__).resolve().parents[1] / "victims"
CTOR_SIZE = 333  # ctor_lib.c


def build(out: Path) -> tuple[Path, Path]:
    lib = out / "libctor_lib.so"
    exe = out / "ctor_main"
    for cmd in (["gcc", "-g", "-O1", "-fPIC", "-shared", "-fno-omit-frame-pointer", "-o", str(lib),
                 str(VICTIMS / "ctor_lib.c")],
                ["gcc", "-g", "-O1", "-fno-omit-frame-pointer", "-o", str(exe), str(VICTIMS / "ctor_main.c"),
                 f"-L{out}", "-lctor_lib", f"-Wl,-rpath,{out}"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)} failed: {r.stderr}"
    return lib, exe


def test_a_library_constructors_allocation_has_its_whole_stack(run_victim, run_cli, tmp_path):
    # GIVEN a program linked with a library whose constructor allocates
    lib, exe = build(tmp_path)
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    done = run_victim(exe, snap_dir=snaps)
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    facts = {k: v for k, *v in (line.split() for line in done.stdout.splitlines())}
    addr, size = facts["ctor"]
    dirs = list(snaps.glob(f"*-{facts['pid'][0]}-1-on-demand"))
    assert len(dirs) == 1, f"expected one snapshot dir, got {sorted(snaps.iterdir())}"
    core = snapdir.find_core(snapdir.wait_complete(dirs[0], 60).path)
    # WHEN whoowns answers for the constructor's block
    r = run_cli("whoowns", addr, "--core", str(core), "--json", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert r.returncode == 0, r.stderr
    block = json.loads(r.stdout)["block"]
    # THEN it is the block, and its stack runs through the constructor's
    # functions in the library into the loader that called them
    assert (block["start"], block["size"]) == (addr, CTOR_SIZE) == (addr, int(size))
    stack = block["alloc_stack"]
    mine = [f["function"] for f in stack if f["module"] == str(lib)]
    assert mine == ["ctor_helper", "ctor_alloc", "ctor_init"], stack
    assert [f["function"] for f in stack[:3]] == mine, stack
    loader = [f for f in stack[3:] if f["module"] and "ld-linux" in f["module"]]
    assert loader and "_dl_init" in [f["function"] for f in loader], stack
