"""Shadow stacks survive longjmp, exceptions and signal handlers.

tests/victims/uw_jumps.c and uw_throw.cc are built with
-finstrument-functions and -no-pie (so addr2line names the pcs).  They leave
instrumented frames without running their exit hooks - longjmp out of N
frames, 200 times over, nested setjmp, a C++ exception, a signal handler
that siglongjmps out (on the thread's stack and on a sigaltstack) - then
main calls fresh_alloc, which allocates.  The block's stack must be exactly
fresh_alloc <- main (then main's caller in libc): no frame of the code that
was left, and the shadow stack as deep as the real one.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("addr2line") is None, reason="needs addr2line")

CALL, ENTRY = 1, 2
BUILDS = {
    "O1-fp": ("-no-pie",),
    "O2": ("-no-pie", "-O2", "-fomit-frame-pointer"),
}


def _stacks(stdout: str) -> dict[str, list[tuple[int, int]]]:
    stacks: dict[str, list] = {}
    cur = None
    for line in stdout.splitlines():
        word = line.split()
        if len(word) == 1 and (word[0] in ("alloc", "alloc1") or word[0].startswith("realign")):
            cur = stacks.setdefault(word[0], [])
        elif word[:1] == ["frame"]:
            cur.append((int(word[1]), int(word[2], 16)))
    return stacks


def _names(exe, frames) -> list[str]:
    """Function per frame; "<lib>" for pcs outside the executable."""
    addrs = [hex(pc - 1 if kind == CALL else pc) for kind, pc in frames]
    out = subprocess.run(["addr2line", "-f", "-e", str(exe), *addrs], capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()[0::2]
    return [n if n != "??" else "<lib>" for n in out]


def _depth(stdout: str) -> tuple[int, int]:
    line = next(l for l in stdout.splitlines() if l.startswith("depth "))
    _, depth, _, overflows = line.split()
    return int(depth), int(overflows)


def _run(build_victim, run_victim, tmp_path, name, flags, mode, *args, cxx=False):
    exe = build_victim(name, instrument=True, cxx=cxx, extra_flags=flags)
    proc = run_victim(exe, *args, snap_dir=tmp_path,
                      env={"LIBTAG_QUIET": "1", "LIBTAG_UNWIND": mode})
    assert proc.returncode == 0, proc.stderr
    return exe, proc.stdout


FRESH_FROM_MAIN = ["fresh_alloc", "fresh_alloc", "main", "<lib>"]


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("mode", ["auto", "shadow"])
@pytest.mark.parametrize("args", [("jump", "1"), ("jump", "3"), ("jump", "40"), ("many",),
                                  ("signal",), ("altsignal",)],
                         ids=["jump1", "jump3", "jump40", "200-jumps", "signal", "altsignal"])
def test_stack_after_frames_were_left_is_fresh_alloc_from_main(
        build_victim, run_victim, tmp_path, build, mode, args):
    # GIVEN instrumented frames left by longjmp/siglongjmp without exit hooks
    exe, out = _run(build_victim, run_victim, tmp_path, "uw_jumps", BUILDS[build], mode, *args)
    alloc = _stacks(out)["alloc"]
    # THEN the block main allocated through fresh_alloc has exactly that
    # stack: the call in fresh_alloc, its entry, the call in main, main's
    # caller - and no frame of the functions that were jumped out of
    assert [k for k, _ in alloc] == [CALL, ENTRY, CALL, CALL]
    assert _names(exe, alloc) == FRESH_FROM_MAIN
    # AND the shadow stack is as deep as the real one (main, probe), with
    # no overflow however many jumps there were
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("build", list(BUILDS))
def test_nested_setjmp(build_victim, run_victim, tmp_path, build):
    # GIVEN setjmp in main and in level1; a longjmp to level1's from three
    # frames down, an allocation in level1, then a longjmp to main's
    exe, out = _run(build_victim, run_victim, tmp_path, "uw_jumps", BUILDS[build], "auto",
                    "nested")
    stacks = _stacks(out)
    # THEN level1's block has the stack fresh_alloc <- level1 <- main
    assert _names(exe, stacks["alloc1"]) == ["fresh_alloc", "fresh_alloc", "level1", "main",
                                             "<lib>"]
    # AND main's, after the second jump, fresh_alloc <- main
    assert _names(exe, stacks["alloc"]) == FRESH_FROM_MAIN
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("build", list(BUILDS))
def test_cxx_exception_through_instrumented_frames(build_victim, run_victim, tmp_path, build):
    # GIVEN 100 exceptions thrown four instrumented frames down, caught in main
    exe, out = _run(build_victim, run_victim, tmp_path, "uw_throw", BUILDS[build], "auto",
                    cxx=True)
    alloc = _stacks(out)["alloc"]
    names = _names(exe, alloc)
    # THEN main's allocation through fresh_alloc is fresh_alloc <- main
    assert [n.removeprefix("_ZL11") for n in names] == [
        "fresh_allocm", "fresh_allocm", "main", "<lib>"]
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("mode", ["auto", "shadow"])
def test_frames_left_then_a_deeper_call_through_code_not_instrumented(
        build_victim, run_victim, tmp_path, build, mode):
    # GIVEN a longjmp out of down, down, down, thrower; then main calls
    # deep_call (not instrumented), whose 8 KiB frame overwrites the frames
    # left and which calls fresh_alloc: its entry lands below theirs, so
    # the enter hook keeps it on top of them (whether they are alive is
    # the next capture's to check)
    exe, out = _run(build_victim, run_victim, tmp_path, "uw_jumps", BUILDS[build], mode, "deep")
    stacks = _stacks(out)
    # THEN the block allocated there has the stack fresh_alloc <- deep_call
    # (the call site of fresh_alloc's entry) <- main's caller: none of the
    # frames that were left
    assert [k for k, _ in stacks["alloc1"]] == [CALL, ENTRY, CALL, CALL]
    assert _names(exe, stacks["alloc1"]) == ["fresh_alloc", "fresh_alloc", "deep_call", "<lib>"]
    # AND main's own allocation after it, fresh_alloc <- main, with the
    # shadow stack as deep as the real one
    assert _names(exe, stacks["alloc"]) == FRESH_FROM_MAIN
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("mode", ["auto", "shadow"])
def test_tail_jumped_exit_with_a_frame_it_called_left_inside_it(build_victim, run_victim, tmp_path, mode):
    # GIVEN tail_exit, a void function that -O2 leaves by its epilogue and a
    # jump to the exit hook (so the hook sits at tail_exit's own CFA), whose
    # uninstrumented callee setjmps and calls throw_back, which longjmps
    # back: when tail_exit's exit runs, throw_back's dead entry is inside it
    exe, out = _run(build_victim, run_victim, tmp_path, "uw_jumps", BUILDS["O2"], mode, "tailexit")
    disasm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(exe)], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    body = disasm.split("<tail_exit>:", 1)[1].split("\n\n", 1)[0]
    assert "jmp" in body and "__cyg_profile_func_exit" in body.split("jmp", 1)[1].split("\n", 1)[0]
    # THEN that exit pops throw_back's entry and tail_exit's, not main's: the
    # block main allocates next has the stack fresh_alloc <- main <- libc
    assert _names(exe, _stacks(out)["alloc"]) == FRESH_FROM_MAIN
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("mode", ["auto", "shadow"])
def test_realigned_frame_entered_again_at_the_same_stack_pointer(build_victim, run_victim, tmp_path,
                                                                 build, mode):
    # GIVEN host(k), k = 0..7, which alloca()s 16 k + 1 bytes and then calls
    # realigned from one call site; realigned aligns its stack to 64 bytes,
    # so its enter hook sees the same stack pointer for CFAs 16 bytes apart
    # (the same site, stack pointer and return address: an entry the enter
    # keeps as it was)
    exe, out = _run(build_victim, run_victim, tmp_path, "uw_jumps", BUILDS[build], mode, "realign")
    stacks = _stacks(out)
    # THEN every block realigned allocated has its whole stack: realigned
    # <- host <- main <- libc
    assert sorted(k for k in stacks if k.startswith("realign")) == [f"realign{k}" for k in range(8)]
    for k in range(8):
        assert _names(exe, stacks[f"realign{k}"]) == ["realigned", "realigned", "host", "main", "<lib>"], k
    # AND main's allocation after them is fresh_alloc <- main, the shadow
    # stack as deep as the real one
    assert _names(exe, stacks["alloc"]) == FRESH_FROM_MAIN
    assert _depth(out) == (2, 0)
