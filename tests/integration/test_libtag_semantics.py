"""libtag's malloc family behaves as glibc's toward the program, and tags
every block it hands out (docs/format.md).

The probe tests/victims/lt_semantics.c runs WITH and WITHOUT libtag and the
outputs must match line by line, except the "usable" lines: under libtag
malloc_usable_size is exactly the requested size.  tests/victims/lt_tags.c
reads each block's tag from inside the victim (preloaded and with libtag.a
linked statically).
"""
from __future__ import annotations

import re

import pytest

USABLE = re.compile(r"^usable (?P<what>\S+) requested=(?P<req>\d+) got=(?P<got>\d+)$")

# Lines the probe must print in both runs: the edge cases the issue names.
EXPECTED_LINES = [
    # malloc: huge sizes fail with NULL + ENOMEM
    "malloc(0) -> ptr aligned=1 errno=unchanged",
    "malloc(SIZE_MAX) -> NULL errno=ENOMEM",
    "malloc(PTRDIFF_MAX+1) -> NULL errno=ENOMEM",
    "malloc(2^48) -> NULL errno=ENOMEM",
    "malloc(2^47) -> NULL errno=ENOMEM",
    # free keeps errno (POSIX.1-2024; glibc since 2.33)
    "free(NULL) errno=unchanged",
    "free(p) errno=unchanged",
    "free(big) errno=unchanged",
    "free(p) from 0 errno=0",
    # calloc: zeroed memory, overflow is ENOMEM
    "calloc zeroing checked",
    "calloc(SIZE_MAX,0) -> ptr aligned=1 errno=unchanged",
    "calloc(SIZE_MAX/2,3) -> NULL errno=ENOMEM",
    "calloc(2^32,2^32) -> NULL errno=ENOMEM",
    "calloc(1,SIZE_MAX) -> NULL errno=ENOMEM",
    # realloc: content kept growing and shrinking; failure keeps the block
    "realloc(100->200) content kept=1",
    "realloc(300000->4194304) content kept=1",
    "realloc(4194304->100000) content kept=1",
    "realloc(30->1) content kept=1",
    "realloc(p,SIZE_MAX) -> NULL errno=ENOMEM",
    "realloc(p,SIZE_MAX) old kept=1",
    "realloc(p,2^47) old kept=1",
    "realloc(p,0) -> NULL errno=unchanged",
    "realloc(NULL,0) -> ptr aligned=1 errno=unchanged",
    # reallocarray: multiplication overflow is ENOMEM, block kept
    "reallocarray grow kept=1",
    "reallocarray(p,SIZE_MAX/2,3) -> NULL errno=ENOMEM",
    "reallocarray(p,2^32,2^32) old kept=1",
    "reallocarray(p,0,5) -> NULL errno=unchanged",
    # memalign / aligned_alloc (glibc 2.36: the same function)
    "memalign(24,100) -> ptr aligned=1 errno=unchanged",
    "memalign(65536,5000) -> ptr aligned=1 errno=unchanged",
    "memalign(SIZE_MAX,10) -> NULL errno=EINVAL",
    "memalign(SIZE_MAX/2+2,10) -> NULL errno=EINVAL",
    "memalign(2^63,10) -> NULL errno=ENOMEM",
    "memalign(64,SIZE_MAX) -> NULL errno=ENOMEM",
    "aligned_alloc(100,100) -> ptr aligned=1 errno=unchanged",
    "aligned_alloc(SIZE_MAX,10) -> NULL errno=EINVAL",
    "aligned_alloc(64,SIZE_MAX-100) -> NULL errno=ENOMEM",
    # posix_memalign: EINVAL / ENOMEM returned, *memptr untouched
    "posix_memalign(0,100) -> EINVAL memptr untouched=1",
    "posix_memalign(4,100) -> EINVAL memptr untouched=1",
    "posix_memalign(24,100) -> EINVAL memptr untouched=1",
    "posix_memalign(9223372036854775816,100) -> EINVAL memptr untouched=1",
    "posix_memalign(8,100) -> 0 aligned=1",
    "posix_memalign(4096,100) -> 0 aligned=1",
    "posix_memalign(1048576,0) -> 0 aligned=1",
    "posix_memalign(64,18446744073709551615) -> ENOMEM memptr untouched=1",
    "posix_memalign(9223372036854775808,100) -> ENOMEM memptr untouched=1",
    # valloc / pvalloc: page aligned, huge sizes ENOMEM
    "valloc(100) -> ptr aligned=1 errno=unchanged",
    "pvalloc(5000) -> ptr aligned=1 errno=unchanged",
    "valloc(SIZE_MAX) -> NULL errno=ENOMEM",
    "pvalloc(SIZE_MAX-100) -> NULL errno=ENOMEM",
    "malloc_usable_size(NULL)=0",
    "malloc(10) success errno=unchanged",
    "done",
]


def _semantic(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("usable ")]


def _usable(lines: list[str]) -> list[tuple[str, int, int]]:
    out = []
    for line in lines:
        m = USABLE.match(line)
        if line.startswith("usable "):
            assert m, f"malformed usable line {line!r}"
            out.append((m["what"], int(m["req"]), int(m["got"])))
    return out


@pytest.fixture(params=[False, True], ids=["plain", "instrumented"])
def probe_runs(request, build_victim, run_victim, tmp_path):
    """(bare stdout lines, libtag stdout lines, libtag stderr) of lt_semantics."""
    exe = build_victim("lt_semantics", instrument=request.param)
    bare = run_victim(exe, preload=False)
    tagged = run_victim(exe, snap_dir=tmp_path)
    assert bare.returncode == 0, bare.stderr
    assert tagged.returncode == 0, tagged.stderr
    return bare.stdout.splitlines(), tagged.stdout.splitlines(), tagged.stderr


def test_probe_output_is_glibc_output_line_by_line(probe_runs):
    # GIVEN the probe run without and with libtag
    bare, tagged, _ = probe_runs
    # THEN every non-"usable" line is the same, in the same order
    assert _semantic(tagged) == _semantic(bare)
    # AND the edge cases of the issue were exercised, with glibc's answers
    for line in EXPECTED_LINES:
        assert line in bare, f"glibc run lacks {line!r}"
    assert not [l for l in bare if "NOT ZERO" in l or "kept=0" in l or "aligned=0" in l]


def test_probe_under_libtag_reports_no_anomaly(probe_runs):
    # GIVEN the probe filled every usable byte of every block it got
    _, _, stderr = probe_runs
    # THEN libtag saw no overflow, double free or invalid free
    assert "libtag:" not in stderr, stderr


def test_malloc_usable_size_is_the_requested_size(probe_runs):
    bare, tagged, _ = probe_runs
    tagged_usable = _usable(tagged)
    # GIVEN every allocation function of the probe reported its usable size
    assert len(tagged_usable) == len(_usable(bare))
    assert len(tagged_usable) >= 100
    # THEN under libtag it is exactly what was asked for (pvalloc: whole pages)
    assert [(w, r, g) for w, r, g in tagged_usable if g != r] == []
    # AND glibc's own answer is never below it (the probe is sound)
    assert [(w, r, g) for w, r, g in _usable(bare) if g < r] == []
    assert ("pvalloc(100)", 4096, 4096) in tagged_usable
    assert ("calloc(7,3)", 21, 21) in tagged_usable
    assert ("malloc(0)", 0, 0) in tagged_usable


def test_statically_linked_probe_behaves_as_preloaded(build_victim, run_victim, tmp_path):
    # GIVEN the probe with libtag.a linked in, run with no LD_PRELOAD
    static = build_victim("lt_semantics", instrument=False, static_libtag=True)
    preloaded = build_victim("lt_semantics", instrument=False)
    env = {"LD_PRELOAD": ""}
    s = run_victim(static, preload=False, env=env, snap_dir=tmp_path)
    p = run_victim(preloaded, snap_dir=tmp_path)
    # THEN it prints exactly what the preloaded run prints, usable sizes too
    assert s.returncode == 0, s.stderr
    assert s.stdout.splitlines() == p.stdout.splitlines()
    assert "usable malloc(100) requested=100 got=100" in s.stdout.splitlines()


# ------------------------------------------------------------------ tags --

FUNCTIONS = {
    # name: (size in the tag, pad: bytes from the slot's start, where an
    # aligned block's forward record is, to the 16-byte tag)
    "malloc": (100, 0),
    "malloc0": (0, 0),
    "calloc": (300, 0),
    "realloc": (1000, 0),
    "reallocarray": (63, 0),
    "memalign": (100, 64 - 16),
    "aligned_alloc": (512, 256 - 16),
    "posix_memalign": (300, 128 - 16),
    "valloc": (123, 4096 - 16),
    "pvalloc": (4096, 4096 - 16),
}


def _check_tag_lines(out: str) -> None:
    lines = out.splitlines()
    assert "control magic=LIBTAG-CONTROL-1 self_ok=1 abi=5 tag_size=16 pid_ok=1" in lines
    for name, (size, pad) in FUNCTIONS.items():
        assert f"{name} tag ok=1 size={size} state=1 tid_self=1 stack_set=1 canary=1" in lines, name
        assert f"{name} aligned=1 pad={pad} usable={size}" in lines, name
        assert (f"{name} freed tag_ok=1 state=2 free_rec_ok=1 free_tid_self=1 "
                f"free_stack_set=1") in lines, name
    assert "posix_memalign rc=0" in lines
    # 10 checked blocks + the 2 that realloc/reallocarray moved away from
    assert "stats allocs=12 frees=12 live_blocks=0 live_bytes=0 anomalies=0" in lines
    assert "record found=1 shadow_set=1" in lines


@pytest.mark.parametrize("instrument", [False, True], ids=["plain", "instrumented"])
def test_every_function_tags_its_block_preloaded(build_victim, run_victim, tmp_path, instrument):
    # GIVEN a victim that allocates with each function under LD_PRELOAD
    exe = build_victim("lt_tags", instrument=instrument)
    proc = run_victim(exe, snap_dir=tmp_path)
    # THEN each block carries a valid live tag naming this thread and a
    # stack, and after free a valid freed tag + free record
    assert proc.returncode == 0, proc.stderr
    _check_tag_lines(proc.stdout)


def test_statically_linked_victim_gets_tags(build_victim, run_victim, tmp_path):
    # GIVEN libtag.a linked into the victim and no LD_PRELOAD at all
    exe = build_victim("lt_tags", instrument=False, static_libtag=True)
    proc = run_victim(exe, preload=False, env={"LD_PRELOAD": ""}, snap_dir=tmp_path)
    # THEN the blocks are tagged just as under LD_PRELOAD
    assert proc.returncode == 0, proc.stderr
    _check_tag_lines(proc.stdout)


def test_reader_victim_runs_without_libtag(build_victim, run_victim):
    # GIVEN the same victim with no libtag: the weak symbols are NULL
    exe = build_victim("lt_tags", instrument=False)
    proc = run_victim(exe, preload=False, env={"LD_PRELOAD": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "no-libtag\n"


@pytest.mark.parametrize("align", [16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
def test_a_second_free_of_a_large_aligned_block_is_reported_not_a_fault(build_victim, run_victim,
                                                                         align):
    # GIVEN a 2 MiB block from posix_memalign(align): glibc mmaps its chunk,
    # and the block starts at a page offset that depends on the alignment
    exe = build_victim("lt_aligned_refree")
    # WHEN the program frees it twice (the first free() munmaps it)
    done = run_victim(exe, str(align), on_anomaly="ignore")
    # THEN libtag reports the second free() and the program runs on
    assert done.returncode == 0, f"expected exit 0, got {done.returncode}: {done.stderr}"
    block = done.stdout.split()[0].split("=")[1]
    assert done.stdout.endswith("survived\n"), done.stdout
    assert f"libtag: invalid-free of {block} " in done.stderr, done.stderr
