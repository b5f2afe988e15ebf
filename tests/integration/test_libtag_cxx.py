"""C++ new/delete reach libtag through libstdc++ (docs/libtag.md, "Anomalies"): every form of
operator new hands out a tagged block, every delete frees it, and failures
keep C++ semantics (std::bad_alloc, nullptr for nothrow).

The victim tests/victims/lt_cxx.cc reads the tags itself (lt_reader.c).
"""
from __future__ import annotations

import pytest

LIVE = "tag ok=1 size={size} state=1 tid_self=1 stack_set=1 canary=1"

# form: (requested size libtag recorded, how it recorded the allocation:
# enum libtag_alloc_kind, 1 new, 2 new[], 3 aligned new, 4 aligned new[])
FORMS = {
    "new": (4, 1),                       # new int
    "new[]": (100, 2),                   # new char[100]
    "new[]cookie": (3 * 20 + 8, 2),      # new WithDtor[3]: 8-byte array cookie first
    "new-aligned": (64, 3),              # new of an alignas(64) type
    "new[]-aligned": (3 * 64, 4),
    "operator-new-align256": (100, 3),   # the size asked for, not rounded up
    "new-nothrow": (50, 2),              # new (std::nothrow) char[50]
    "new-nothrow-aligned": (64, 3),
}


@pytest.mark.parametrize("instrument", [False, True], ids=["plain", "instrumented"])
def test_every_new_is_tagged_and_every_delete_frees(build_victim, run_victim, tmp_path,
                                                    instrument):
    # GIVEN a C++ victim using each form of new and delete under libtag
    exe = build_victim("lt_cxx", instrument=instrument, cxx=True)
    proc = run_victim(exe, snap_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for form, (size, kind) in FORMS.items():
        # THEN the block behind each new carries a live tag of that size,
        # made by that form of new
        assert f"{form} {LIVE.format(size=size)}" in lines, form
        assert f"{form} kind={kind}" in lines, form
        # AND after the matching delete the tag says freed, by this thread
        assert f"{form} deleted tag_ok=1 state=2 free_tid_self=1" in lines, form
    for form in ("new-aligned", "new[]-aligned", "operator-new-align256"):
        assert f"{form} aligned=1" in lines
    # AND containers allocate through libtag too
    assert "vector tag_ok=1 size_is_capacity=1" in lines
    assert "string tag_ok=1 size=201" in lines
    # AND nothing leaked or was reported
    assert "stats live_blocks=0 anomalies=0" in lines
    assert "libtag:" not in proc.stderr


def test_statically_linked_cxx_victim_gets_tags(build_victim, run_victim, tmp_path):
    # GIVEN libtag.a linked into a C++ program, no LD_PRELOAD: libstdc++'s
    # operator new finds the program's malloc
    exe = build_victim("lt_cxx", instrument=False, cxx=True, static_libtag=True)
    proc = run_victim(exe, preload=False, env={"LD_PRELOAD": ""}, snap_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # THEN every form of new is tagged as under LD_PRELOAD
    for form, (size, kind) in FORMS.items():
        assert f"{form} {LIVE.format(size=size)}" in lines, form
        assert f"{form} kind={kind}" in lines, form
        assert f"{form} deleted tag_ok=1 state=2 free_tid_self=1" in lines, form
    assert "stats live_blocks=0 anomalies=0" in lines


def test_failed_new_keeps_cxx_semantics(build_victim, run_victim, tmp_path):
    # GIVEN allocations far beyond the address space
    exe = build_victim("lt_cxx", instrument=False, cxx=True)
    proc = run_victim(exe, snap_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # THEN nothrow new returns nullptr and new throws std::bad_alloc,
    # aligned or not: libtag's NULL reached libstdc++ as a failure
    assert "new-nothrow-huge null=1" in lines
    assert "new-huge bad_alloc" in lines
    assert "new-aligned-huge bad_alloc" in lines
    # AND a new that succeeds only after its new_handler freed memory (the
    # retry runs in libstdc++ over libtag's malloc) is still a new[] block,
    # and delete[] of it is no mismatch
    assert "new[]-after-handler handler_calls=1" in lines
    assert f"new[]-after-handler {LIVE.format(size=40 << 20)}" in lines
    assert "new[]-after-handler kind=2" in lines
    assert "new[]-after-handler anomalies=0" in lines


def test_cxx_victim_runs_without_libtag(build_victim, run_victim):
    exe = build_victim("lt_cxx", instrument=False, cxx=True)
    proc = run_victim(exe, preload=False, env={"LD_PRELOAD": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "no-libtag\n"
