"""The runtime-noise rules, driven by fake memory and fake symbols.

GIVEN allocation stacks of a fake libtag process whose frames lie in libtag,
the C library, the loader or the program (named by a FakeSymbolizer)
WHEN forensics.answers.runtime classifies them
THEN a stack is the runtime's exactly when, after libtag's frames, its run
of runtime frames is the whole stack or holds a runtime function (or one
the user named), as docs/guide.md, "Runtime blocks", says - and inspect
folds those into its "runtime" totals.
"""

from __future__ import annotations

import forensics_test_fakes as F
import pytest

from forensics.answers import inspect
from forensics.answers.documents import to_json
from forensics.answers.runtime import Runtime, glob_regex, split_stacks

LIBC, LD = "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"
LIBC_TEXT, LD_TEXT = 0x7E0000000000, 0x7E1000000000
# pcs by name: (where, what)
PC = {
    "malloc": F.LIBTAG_TEXT + 0x10,
    "_IO_file_doallocate": LIBC_TEXT + 0x10, "printf": LIBC_TEXT + 0x20, "strdup": LIBC_TEXT + 0x30,
    "__libc_start_main": LIBC_TEXT + 0x40,
    "_dl_allocate_tls_init": LD_TEXT + 0x10, "_dl_start": LD_TEXT + 0x20,
    "main": F.PROGRAM_TEXT + 0x10, "my_pool_init": F.PROGRAM_TEXT + 0x20,
}


def symbols() -> F.FakeSymbolizer:
    return F.FakeSymbolizer(
        modules=[(F.LIBTAG, F.LIBTAG_TEXT, F.LIBTAG_TEXT + 0x1000), (LIBC, LIBC_TEXT, LIBC_TEXT + 0x1000),
                 (LD, LD_TEXT, LD_TEXT + 0x1000), (F.PROGRAM, F.PROGRAM_TEXT, F.PROGRAM_TEXT + 0x1000)],
        functions={pc: name for name, pc in PC.items()})


def stack(proc: F.FakeProcess, *innermost_first: str) -> int:
    return proc.stack_id(*[PC[n] for n in reversed(innermost_first)])


def is_runtime(*innermost_first: str, extra=()) -> bool:
    proc = F.FakeProcess()
    sid = stack(proc, *innermost_first)
    return Runtime(F.dump(proc, symbols()), extra).classify([sid])[sid]


@pytest.mark.parametrize("frames, want", [
    # stdio's buffer: a runtime function in the runtime's run
    (("malloc", "_IO_file_doallocate", "printf", "main", "__libc_start_main"), True),
    # the loader's TLS, a glob of RUNTIME_FUNCTIONS
    (("malloc", "_dl_allocate_tls_init", "_dl_start"), True),
    # the runtime allocating on its own: runtime code all the way out
    (("malloc", "printf", "__libc_start_main"), True),
    # strdup called by the program: the program asked for it
    (("malloc", "strdup", "main", "__libc_start_main"), False),
    # the program's own malloc
    (("malloc", "main", "__libc_start_main"), False),
    # a runtime function outside the innermost run does not count
    (("malloc", "main", "_IO_file_doallocate"), False),
    # nothing but libtag's frames: no runtime run at all
    (("malloc",), False),
])
def test_which_stacks_are_the_runtimes(frames, want):
    assert is_runtime(*frames) is want


def test_a_function_the_user_names_counts_as_the_runtimes_in_any_module():
    frames = ("malloc", "my_pool_init", "main", "__libc_start_main")
    assert is_runtime(*frames) is False
    assert is_runtime(*frames, extra=["my_pool_*"]) is True
    assert is_runtime(*frames, extra=["my_pool"]) is False  # a pattern matches the whole name
    assert is_runtime(*frames, extra=[""]) is False  # an empty pattern names nothing


def test_stack_id_0_has_no_frames_and_is_the_programs():
    proc = F.FakeProcess()
    assert Runtime(F.dump(proc, symbols())).classify([0]) == {0: False}


def test_glob_regex_matches_whole_names_only():
    rx = glob_regex(["_dl_allocate_tls*", "_nl_*", "setvbuf"])
    assert [bool(rx.match(n)) for n in ("_dl_allocate_tls", "_dl_allocate_tls_init", "x_dl_allocate_tls",
                                        "_nl_find_locale", "setvbuf", "setvbuf2", "_IO_setvbuf")] == [
        True, True, False, True, True, False, False]


def test_split_stacks_leaves_the_runtimes_out_and_totals_them():
    proc = F.FakeProcess()
    mine, stdio, tls = (stack(proc, "malloc", "main"), stack(proc, "malloc", "_IO_file_doallocate", "printf"),
                        stack(proc, "malloc", "_dl_allocate_tls_init", "_dl_start"))
    rows = [(stdio, 1, 4096), (mine, 3, 300), (tls, 2, 640)]
    dump = F.dump(proc, symbols())
    shown, summary = split_stacks(dump, rows, show=False)
    assert (shown, summary) == ([(mine, 3, 300, False)],
                                {"blocks": 3, "bytes": 4736, "stacks": 2, "shown": False})
    shown, summary = split_stacks(dump, rows, show=True)
    assert shown == [(stdio, 1, 4096, True), (mine, 3, 300, False), (tls, 2, 640, True)]
    assert summary == {"blocks": 3, "bytes": 4736, "stacks": 2, "shown": True}


def test_inspect_folds_the_runtimes_blocks_unless_asked():
    # GIVEN stdio's 4096-byte buffer and the program's two 24-byte blocks
    proc = F.FakeProcess()
    mine = stack(proc, "malloc", "main")
    proc.block(0x40, size=24, stack=mine)
    proc.block(0x80, size=24, stack=mine)
    proc.block(0x100, size=4096, stack=stack(proc, "malloc", "_IO_file_doallocate", "printf", "main"))
    doc = to_json(inspect.inspect_doc(F.dump(proc, symbols())))
    assert [(t["bytes"], t["runtime"]) for t in doc["top_stacks"]] == [(48, False)]
    assert doc["runtime"] == {"blocks": 1, "bytes": 4096, "stacks": 1, "shown": False}
    # libtag's frames are marked in the JSON, not dropped
    assert [(f["function"], f["libtag"]) for f in doc["top_stacks"][0]["stack"]] == [("malloc", True), ("main", False)]
    doc = to_json(inspect.inspect_doc(F.dump(proc, symbols()), runtime=True))
    assert [(t["bytes"], t["runtime"]) for t in doc["top_stacks"]] == [(4096, True), (48, False)]
    assert doc["runtime"]["shown"] is True


def test_a_blocks_rank_past_the_programs_stacks_says_the_runtime_has_more():
    proc = F.FakeProcess()
    proc.block(0x40, size=24, stack=stack(proc, "malloc", "main"))
    proc.block(0x100, size=4096, stack=stack(proc, "malloc", "_IO_file_doallocate", "printf"))
    from forensics.errors import InputError

    with pytest.raises(InputError) as err:
        inspect.stack_blocks(F.dump(proc, symbols()), 2)
    assert err.value.message == ("inspect: --blocks 2: the core has 1 allocation stacks with live blocks "
                                 "(#1 to #1) (and 1 of the runtime's, which --runtime lists)")
    assert inspect.stack_blocks(F.dump(proc, symbols()), 2, runtime=True).bytes == 24
