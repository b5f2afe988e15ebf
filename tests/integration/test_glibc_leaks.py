"""The leak scan without libtag: over glibc's chunks in use, in the kernel's
core of tests/victims/leak_shapes.c run without libtag ("abort": it raises
SIGABRT where the libtag run takes its snapshot), every shape's blocks get
the kinds valgrind memcheck gives them in the same victim at the same point
(tests/integration/test_leaks.py runs the same shapes under libtag).
Without allocation stacks the groups are by usable size; the blocks are
matched by the addresses the victim printed.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import forensics_test_support as S
import pytest

SKIP = S.kernel_core_skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

# shape -> the function that allocates its blocks (leak_shapes.c)
SHAPES = {"list": "new_list_node", "ring": "new_ring_node", "global": "alloc_global_only",
          "stack": "alloc_stack_only", "interior": "alloc_interior_only",
          "register": "alloc_register_only"}
_VG_KIND = {"Leak_DefinitelyLost": "definite", "Leak_IndirectlyLost": "indirect",
            "Leak_PossiblyLost": "possible", "Leak_StillReachable": "reachable"}


def blocks(stdout: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for line in stdout.splitlines():
        words = line.split()
        if words[0] == "block":
            out.setdefault(words[1], []).append(int(words[2], 16))
    assert sorted(out) == sorted(SHAPES) and "ready" in stdout.split(), stdout
    return out


def _raise_soft_core_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def env_without_libtag() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


@pytest.fixture(scope="module")
def victim(build_victim) -> Path:
    return Path(os.path.realpath(build_victim("leak_shapes")))


@pytest.fixture(scope="module")
def aborted(victim, tmp_path_factory) -> tuple[Path, dict[str, list[int]]]:
    work = tmp_path_factory.mktemp("leak-abort")
    done = subprocess.run([str(victim), "abort"], cwd=work, env=env_without_libtag(),
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=_raise_soft_core_limit, check=False)
    assert done.returncode == -6, f"expected SIGABRT (-6), got {done.returncode}: {done.stderr}"
    cores = [p for p in work.iterdir() if p.name.startswith("core")]
    assert len(cores) == 1, sorted(work.iterdir())
    return cores[0], blocks(done.stdout)


@pytest.fixture(scope="module")
def memcheck(victim, tmp_path_factory) -> dict[str, list[tuple[str, int]]]:
    """allocating function -> sorted [(kind, blocks)] of memcheck's leak check."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed")
    xml = tmp_path_factory.mktemp("vg") / "memcheck.xml"
    done = subprocess.run(
        ["valgrind", "--tool=memcheck", "--leak-check=no", "--show-leak-kinds=all",
         "--leak-check-heuristics=none", "--xml=yes", f"--xml-file={xml}", str(victim), "valgrind"],
        env=env_without_libtag(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    out: dict[str, list] = {}
    total = None
    for err in ET.parse(xml).getroot().iter("error"):
        kind = _VG_KIND.get(err.findtext("kind") or "")
        if kind is None:
            continue
        xw = err.find("xwhat")
        n, of = map(int, re.search(r"loss record (\d+) of (\d+)", xw.findtext("text")).groups())
        total = of if total is None else total
        fns = [f.findtext("fn") for f in err.find("stack").iter("frame")]
        fn = next((f for f in fns if f not in ("malloc", "calloc")), None)
        out.setdefault(fn, []).append((kind, int(xw.findtext("leakedblocks"))))
        if n == total:
            break  # the leak check at exit follows
    return {k: sorted(v) for k, v in out.items()}


def test_every_shape_has_memchecks_kinds(aborted, memcheck):
    from forensics.answers.leaks import find_leaks
    from forensics.reader.dump import Dump

    core, shapes = aborted
    with Dump.open(core, plain=True) as dump:
        scan = find_leaks(dump)
        for shape, fn in SHAPES.items():
            # WHEN each block the victim printed is classified
            ours = sorted(Counter(scan.kind_of(a) for a in shapes[shape]).items())
            # THEN the kinds and counts are memcheck's for its allocating function
            assert ours == memcheck[fn], (shape, ours, memcheck[fn])


def test_lost_blocks_are_memchecks_in_all(aborted, memcheck, run_cli, tmp_path):
    # GIVEN every block memcheck calls lost (the shapes and glibc's thread DTVs)
    want = Counter()
    for groups in memcheck.values():
        for kind, n in groups:
            if kind != "reachable":
                want[kind] += n
    # WHEN inspect --leaks reads the core without libtag
    core, _ = aborted
    result = run_cli("inspect", str(core), "--leaks", "--json", env={"XDG_STATE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    leaks = json.loads(result.stdout)["leaks"]
    got = Counter()
    for g in leaks:
        got[g["kind"]] += g["blocks"]
        # without stacks: grouped by usable size, the size said, no stack or times
        assert (g["stack"], g["stack_id"], g["age_ms"]) == ([], None, None), g
    # THEN as many definite, indirect and possible blocks as memcheck's
    assert got == want, (got, want)
    # and the list's head owns its four nodes: 48-byte nodes in 56-byte usable chunks
    head = next(g for g in leaks if g["kind"] == "definite" and g["usable_size"] == 56)
    assert (head["blocks"], head["indirect_blocks"], head["indirect_bytes"]) == (1, 4, 4 * 56)
