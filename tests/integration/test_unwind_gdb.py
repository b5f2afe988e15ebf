"""The allocation stacks libtag records from CFI equal gdb's bt at the same
allocation, frame by frame.

tests/victims/uw_stacks.c and uw_stacks_cxx.cc are built -O2 without frame
pointers and not instrumented, so every stack comes from the binaries' own
.eh_frame.  Each marked allocation sets the global ``marker``; the victim
runs under gdb (batch mode) with libtag preloaded and a breakpoint on
libtag's entry points whose condition is ``marker != 0``, which prints bt.
At the end the victim prints the stack libtag stored in each block's tag.
Both happen in the same process, so the addresses must be equal: libtag's
frames are gdb's physical frames (the lines bt prints with an address),
from the caller of libtag's entry point outward, past main to _start or
through start_thread to clone3.

gdb is kept to what the binaries carry (no separate debug files): with
libc's debug info it would add frames that are not on the stack - inlined
functions and tail calls it reconstructs from DWARF call-site records -
which libtag, by design, records as the physical frames they are in (the
reader expands inline frames).  One case (marker 6) documents that on the
victim's own inlined helper.

uw_dlopen.c loads tests/victims/uw_plugin.c (also -O2 without frame
pointers) with dlopen() after libtag has scanned the modules, unloads it and
loads it again: the stacks through it must equal gdb's too.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")

VICTIMS = Path(__file__).resolve().parents[1] / "victims"
O2_NO_FP = ("-O2", "-fomit-frame-pointer")
FRAME_SIGNAL = 3

GDB_SCRIPT = """\
set pagination off
set confirm off
set startup-with-shell off
set backtrace past-main on
set debug-file-directory /nonexistent
set debuginfod enabled off
set breakpoint pending on
handle SIGUSR1 nostop noprint pass
set environment LD_PRELOAD={lib}
set environment LIBTAG_QUIET=1
set environment LIBTAG_UNWIND={mode}
{breaks}
run {args}
"""

BREAK = """\
break {where} if marker != 0
commands
silent
printf "bt-begin %d\\n", marker
bt
printf "bt-end\\n"
continue
end
"""

FRAME_RE = re.compile(r"^#(\d+)\s+(?:(0x[0-9a-f]+) in )?(.*)$")


def _run_under_gdb(exe, tmp_path, libtag_so, mode: str, cxx: bool, args: str = ""):
    wheres = ["malloc"] + (["'operator new(unsigned long)'"] if cxx else [])
    script = tmp_path / "bt.gdb"
    script.write_text(GDB_SCRIPT.format(lib=libtag_so, mode=mode, args=args,
                                        breaks="".join(BREAK.format(where=w) for w in wheres)))
    proc = subprocess.run(["gdb", "-q", "-batch", "-nx", "-x", str(script), str(exe)],
                          capture_output=True, text=True, timeout=180)
    return proc.stdout


def _gdb_stacks(out: str) -> dict[int, list[tuple[str | None, str]]]:
    """marker -> frames (address or None, rest of the line) of the last hit
    whose frame #0 is libtag's own entry point (the program called it; a
    hit in glibc's malloc that libtag itself calls comes later)."""
    stacks: dict[int, list] = {}
    cur, frames = None, []
    for line in out.splitlines():
        if line.startswith("bt-begin "):
            cur, frames = int(line.split()[1]), []
        elif line == "bt-end" and cur is not None:
            if frames and "libtag/src/" in frames[0][1]:
                stacks[cur] = frames
            cur = None
        elif cur is not None:
            m = FRAME_RE.match(line)
            if m:
                frames.append((m.group(2), m.group(3)))
    return stacks


def _libtag_stacks(out: str) -> dict[int, list[tuple[int, int]]]:
    """marker -> [(pc, kind)] innermost first, as the victim printed them."""
    pcs, kinds = {}, {}
    for line in out.splitlines():
        word = line.split()
        if word[:1] == ["stack"] and word[2:3] != ["none"]:
            pcs[int(word[1])] = [int(x, 16) for x in word[2:]]
        elif word[:1] == ["kinds"]:
            kinds[int(word[1])] = [int(x) for x in word[2:]]
    return {m: list(zip(pcs[m], kinds[m], strict=True)) for m in pcs}


def _physical(frames) -> list[int]:
    """gdb's frames after #0 that have an address: one per physical frame."""
    return [int(addr, 16) for addr, _ in frames[1:] if addr]


def _name(rest: str) -> str:
    return rest.split(" (")[0]


@pytest.fixture(scope="module")
def c_run(build_victim, libtag_so, tmp_path_factory):
    exe = build_victim("uw_stacks", instrument=False, extra_flags=O2_NO_FP)
    out = {}
    for mode in ("auto", "cfi"):
        text = _run_under_gdb(exe, tmp_path_factory.mktemp(mode), libtag_so, mode, cxx=False)
        out[mode] = (_gdb_stacks(text), _libtag_stacks(text), text)
    return out


@pytest.mark.parametrize("mode", ["auto", "cfi"])
@pytest.mark.parametrize("marker,what,names,libc_frames", [
    (1, "main -> outer -> middle -> inner", ["inner", "middle", "outer", "mark", "main"], 2),
    (2, "the same in a thread", ["inner", "middle", "outer", "mark", "worker"], 2),
    (3, "strdup allocating for the program", ["dup_name", "main"], 3),
    (4, "fopen allocating its FILE", ["open_self", "main"], 3),
    (5, "recursion 40 deep", ["recurse"] * 41 + ["main"], 2),
])
def test_cfi_stack_equals_gdb_bt(c_run, mode, marker, what, names, libc_frames):
    gdb, ours, text = c_run[mode]
    assert marker in gdb, f"gdb never stopped at marker {marker} ({what}):\n{text[-3000:]}"
    assert marker in ours, f"the victim printed no stack for marker {marker}:\n{text[-3000:]}"
    # GIVEN gdb's bt at the allocation and libtag's recorded stack of the block
    want = _physical(gdb[marker])
    got = [pc for pc, _ in ours[marker]]
    # THEN they are the same physical frames, frame by frame, to the end
    assert got == want, (f"marker {marker} ({what}): libtag {[hex(p) for p in got]} "
                         f"!= gdb {[hex(p) for p in want]}\n" + "\n".join(r for _, r in gdb[marker]))
    assert all(kind == 1 for _, kind in ours[marker])  # return addresses
    # AND they are the program's functions the victim went through, plus
    # glibc's frames (at least the thread's start and, for strdup/fopen, the
    # function that allocated): gdb names these from .dynsym only, so only
    # their number is checked
    program = [_name(r) for a, r in gdb[marker][1:] if a and "uw_stacks.c" in r]
    assert program == names
    assert len(got) - len(names) >= libc_frames


@pytest.mark.parametrize("mode", ["auto", "cfi"])
def test_inlined_helper_is_its_host_physical_frame(c_run, mode):
    # GIVEN marker 6: an always_inline helper calls malloc inside the
    # noinline host_of_inline
    gdb, ours, _ = c_run[mode]
    frames = gdb[6][1:]
    # gdb shows two frames for the one physical frame: the inlined helper
    # (with the address) and its host (without one)
    assert _name(frames[0][1]) == "inline_alloc" and frames[0][0] is not None
    assert _name(frames[1][1]) == "host_of_inline" and frames[1][0] is None
    # THEN libtag records the physical frames only: the same addresses
    assert [pc for pc, _ in ours[6]] == _physical(gdb[6])


@pytest.mark.parametrize("mode", ["auto", "cfi"])
def test_no_junk_frame_from_a_fake_frame_pointer(c_run, mode):
    # GIVEN marker 7: malloc called from code without CFI whose rbp points at
    # a fake frame whose "return address" is the bytes "key" (0x79656b)
    gdb, ours, _ = c_run[mode]
    got = [pc for pc, _ in ours[7]]
    # gdb's heuristics take it for a frame
    assert 0x79656B in _physical(gdb[7])
    # THEN libtag stops before it: the caller of malloc, and nothing that is
    # not a return address after a call
    assert got == _physical(gdb[7])[:1]


@pytest.mark.parametrize("mode", ["auto", "cfi"])
@pytest.mark.parametrize("marker,handler", [(8, "handler"), (9, "alt_handler")],
                         ids=["own-stack", "sigaltstack"])
def test_stack_continues_through_a_signal_frame(c_run, mode, marker, handler):
    # GIVEN malloc in a signal handler (on the thread's stack, or on a
    # sigaltstack); raise() was interrupted
    gdb, ours, _ = c_run[mode]
    frames = gdb[marker][1:]
    assert any("<signal handler called>" in r for _, r in frames)
    got = ours[marker]
    # THEN the handler, then the interrupted instruction (an exact pc,
    # TAG_FRAME_SIGNAL), then its callers - gdb's frames exactly
    assert [pc for pc, _ in got] == _physical(gdb[marker])
    assert [k for _, k in got][:2] == [1, FRAME_SIGNAL]
    assert _name(frames[0][1]) == handler
    assert "main" in [_name(r) for _, r in frames]


def test_cxx_stacks_equal_gdb_bt(build_victim, libtag_so, tmp_path):
    # GIVEN the C++ victim: new through a chain, std::vector growing in a
    # std::thread, and the exception object of a throw three calls deep
    exe = build_victim("uw_stacks_cxx", instrument=False, cxx=True, extra_flags=O2_NO_FP)
    text = _run_under_gdb(exe, tmp_path, libtag_so, "auto", cxx=True)
    gdb, ours = _gdb_stacks(text), _libtag_stacks(text)
    for marker, inner in ((1, "make_node"), (2, "grow"), (3, "thrower")):
        assert marker in gdb and marker in ours, (marker, text[-3000:])
        # THEN each stack is gdb's physical frames, frame by frame
        assert [pc for pc, _ in ours[marker]] == _physical(gdb[marker]), (
            marker, "\n".join(r for _, r in gdb[marker]))
        names = [_name(r) for _, r in gdb[marker][1:]]  # inline frames too
        assert any(inner in n for n in names), names
    # AND the throw's stack holds all four thrower frames
    assert sum("thrower" in _name(r) for a, r in gdb[3][1:] if a) == 4
    assert sum(pc in _physical(gdb[3]) for pc, _ in ours[3]) == len(ours[3])


def test_fp_walk_on_a_frame_pointer_build(build_victim, libtag_so, tmp_path):
    # GIVEN the same victim built -O2 with frame pointers, LIBTAG_UNWIND=fp
    exe = build_victim("uw_stacks", instrument=False,
                       extra_flags=("-O2", "-fno-omit-frame-pointer"))
    text = _run_under_gdb(exe, tmp_path, libtag_so, "fp", cxx=False)
    gdb, ours = _gdb_stacks(text), _libtag_stacks(text)
    for marker in (1, 2, 5):
        want = _physical(gdb[marker])
        got = [pc for pc, _ in ours[marker]]
        # THEN the program's own frames (all built with frame pointers) are
        # gdb's, frame by frame; the walk may stop in glibc, whose frames
        # have none, but never adds a frame gdb does not have
        program = [pc for pc, (_, r) in zip(want, [f for f in gdb[marker][1:] if f[0]])
                   if "uw_stacks.c" in r]
        assert got[:len(program)] == program, (marker, [hex(p) for p in got])
        assert got == want[:len(got)]
    # AND the fake frame of marker 7 stops the walk before "key"
    assert [pc for pc, _ in ours[7]] == _physical(gdb[7])[:1]


def test_module_loaded_later_with_dlopen(build_victim, libtag_so, tmp_path):
    # GIVEN a library built -O2 without frame pointers that the victim
    # dlopen()s after libtag scanned the modules, unloads and loads again
    plugin = tmp_path / "libuwplugin.so"
    subprocess.run(["gcc", "-g", "-O2", "-fPIC", "-shared", "-o", str(plugin),
                    str(VICTIMS / "uw_plugin.c")], check=True)
    exe = build_victim("uw_dlopen", instrument=False, extra_flags=O2_NO_FP + ("-ldl",))
    text = _run_under_gdb(exe, tmp_path, libtag_so, "auto", cxx=False, args=str(plugin))
    gdb, ours = _gdb_stacks(text), _libtag_stacks(text)
    for marker, where in ((1, "plugin_inner"), (2, "callback"), (3, "plugin_inner")):
        assert marker in gdb and marker in ours, (marker, text[-3000:])
        # THEN the stacks run through the plugin's frames as gdb's do
        assert [pc for pc, _ in ours[marker]] == _physical(gdb[marker]), (
            marker, "\n".join(r for _, r in gdb[marker]))
        assert _name(gdb[marker][1][1]) == where
    names = [_name(r) for _, r in gdb[2][1:]]
    assert names[:4] == ["callback", "plugin_relay", "plugin_call", "main"]
