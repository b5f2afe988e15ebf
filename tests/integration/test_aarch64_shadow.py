"""libtag's aarch64 ports beyond test_aarch64.py's subset, for victims
cross-compiled for aarch64 and run under qemu-aarch64-static with the
cross-built libtag preloaded.  The helpers - the cross tools, how a victim
runs under qemu through the aarch64 loader, and what qemu-user changes for
libtag - are test_aarch64.py's, loaded from it.

The -finstrument-functions shadow stack: the x86_64 shadow-stack tests
(test_shadow_jumps.py, test_libtag_stacks.py, test_reader_stacks.py's
shadow case) on aarch64.  An aarch64 call pushes nothing: libtag keys an
instrumented function's entry by the end of the slot where its prologue
saved x30 (x29 + 16 in a frame record, elsewhere where the CFI at the
hook's call says), and strips what that slot holds of a PAC signature
before comparing it with the call site (docs/aarch64.md).  So each case
runs in three builds:

- ``O2``: gcc's aarch64 default, a frame record in every non-leaf function;
- ``O2-nofp``: ``-fomit-frame-pointer``, x30 saved beside the other
  registers, with no frame record;
- ``O2-pac``: ``-mbranch-protection=standard`` under ``qemu -cpu max``, the
  saved return addresses signed.

Victims (tests/victims): uw_jumps.c and uw_throw.cc leave instrumented
frames without their exit hooks - longjmp, nested setjmp, a C++ exception,
a signal handler that siglongjmps out (on the thread's stack and on a
sigaltstack), a void function's exit hook reached by a jump after its
epilogue - then main allocates through fresh_alloc; lt_stack.c allocates
three calls deep in main and in a thread; a64_shadow.c parks under
assembly without CFI and takes a snapshot, whose core the reader walks.
Every stack is named with aarch64-linux-gnu-addr2line (-no-pie builds).

Then the guard pool under 4, 16 and 64 KiB pages (a64_pages.c, which reads
libtag's control block from inside: qemu's /proc/self/maps under larger
pages leaves libtag's control block out of its cores), and the FP
registers (NT_FPREGSET) of libtag's snapshot and crash cores
(a64_fpregs.c), read from the notes and by gdb-multiarch.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forensics import libpath


def _aarch64_module():
    """tests/integration/test_aarch64.py as a module (pytest's importlib
    mode puts no test folder on sys.path)."""
    name = "forensics_test_aarch64"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("test_aarch64.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


A = _aarch64_module()
ADDR2LINE, OBJDUMP, NM = "aarch64-linux-gnu-addr2line", "aarch64-linux-gnu-objdump", "aarch64-linux-gnu-nm"


def _missing() -> str | None:
    if A.SKIP is not None:
        return A.SKIP
    if (why := A._libtag_missing()) is not None:
        return why
    for tool in (ADDR2LINE, OBJDUMP, NM):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install binutils-aarch64-linux-gnu)"
    return None


SKIP = _missing()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

CALL, ENTRY = 1, 2
BUILDS = {
    "O2": ("-O2",),
    "O2-nofp": ("-O2", "-fomit-frame-pointer"),
    "O2-pac": ("-O2", "-mbranch-protection=standard"),
}
FRESH_FROM_MAIN = ["fresh_alloc", "fresh_alloc", "main", "<lib>"]


@pytest.fixture(scope="module")
def a64_build(tmp_path_factory):
    """build(name, build, cxx=False, instrument=True) -> the victim
    cross-compiled with -no-pie, BUILDS[build] and (instrument)
    -finstrument-functions, once a module."""
    out = tmp_path_factory.mktemp("a64shadow")
    built: dict[tuple, Path] = {}

    def build(name: str, build: str, *, cxx: bool = False, instrument: bool = True) -> Path:
        if (name, build) not in built:
            src = A.VICTIMS / f"{name}.{'cc' if cxx else 'c'}"
            exe = out / f"{name}-{build}"
            cmd = [A.CXX if cxx else A.CC, "-g", "-pthread", *(["-finstrument-functions"] if instrument else []),
                   "-no-pie", f"-I{libpath.include_dir()}", *BUILDS[build], "-o", str(exe), str(src)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"$ {' '.join(cmd)}\n{done.stderr}"
            built[name, build] = exe
        return built[name, build]

    return build


def _stacks(stdout: str) -> dict[str, list[tuple[int, int]]]:
    """{name: [(kind, pc), ...]} of the victim's "frame KIND 0xPC" lines,
    each list after its name line (alloc, lt_stack's "alloc size=N", alloc1,
    free, realignK)."""
    stacks: dict[str, list] = {}
    cur = None
    for line in stdout.splitlines():
        word = line.split()
        if word[:1] == ["alloc"] or (len(word) == 1 and (word[0] in ("alloc1", "free") or
                                                           word[0].startswith("realign"))):
            cur = stacks.setdefault(word[0], [])
        elif word[:1] == ["frame"]:
            cur.append((int(word[1]), int(word[2], 16)))
    return stacks


def _names(exe: Path, frames: list[tuple[int, int]]) -> list[str]:
    """The function of each frame; "<lib>" for a pc outside the executable."""
    addrs = [hex(pc - 1 if kind == CALL else pc) for kind, pc in frames]
    out = subprocess.run([ADDR2LINE, "-f", "-e", str(exe), *addrs], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()[0::2]
    return [n if n != "??" else "<lib>" for n in out]


def _depth(stdout: str) -> tuple[int, int]:
    line = next(line for line in stdout.splitlines() if line.startswith("depth "))
    _, depth, _, overflows = line.split()
    return int(depth), int(overflows)


def _run(exe: Path, tmp_path: Path, build: str, mode: str, *args: str) -> str:
    # a64_run passes no LIBTAG_* of the test run's: guarded sampling off
    # again (tests/conftest.py says why), so each block is in libtag's heap
    run = A.a64_run(exe, tmp_path, *args, pac=build == "O2-pac", LIBTAG_QUIET="1", LIBTAG_UNWIND=mode,
                    LIBTAG_GUARD_RATE="0")
    assert run.returncode == 0, run.stderr
    assert "no-libtag" not in run.stdout, run.stdout
    return run.stdout


# ------------------------------------------ frames left without their exits --


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("mode", ["auto", "shadow"])
@pytest.mark.parametrize("args", [("jump", "1"), ("jump", "3"), ("jump", "40"), ("many",),
                                  ("signal",), ("altsignal",)],
                         ids=["jump1", "jump3", "jump40", "200-jumps", "signal", "altsignal"])
def test_stack_after_frames_were_left_is_fresh_alloc_from_main(a64_build, tmp_path, build, mode, args):
    # GIVEN instrumented aarch64 frames left by longjmp/siglongjmp without
    # their exit hooks
    exe = a64_build("uw_jumps", build)
    out = _run(exe, tmp_path, build, mode, *args)
    alloc = _stacks(out)["alloc"]
    # THEN the block main allocated through fresh_alloc has exactly the
    # shadow stack's answer: the call in fresh_alloc, its entry, the call
    # in main, main's caller - no frame of the functions jumped out of
    assert [k for k, _ in alloc] == [CALL, ENTRY, CALL, CALL]
    assert _names(exe, alloc) == FRESH_FROM_MAIN
    # AND the shadow stack is as deep as the real one (main, probe)
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("build", list(BUILDS))
def test_nested_setjmp(a64_build, tmp_path, build):
    # GIVEN setjmp in main and in level1; a longjmp to level1's from three
    # frames down, an allocation in level1, then a longjmp to main's
    exe = a64_build("uw_jumps", build)
    stacks = _stacks(_run(exe, tmp_path, build, "auto", "nested"))
    # THEN level1's block is fresh_alloc <- level1 <- main, and main's,
    # after the second jump, fresh_alloc <- main
    assert _names(exe, stacks["alloc1"]) == ["fresh_alloc", "fresh_alloc", "level1", "main", "<lib>"]
    assert _names(exe, stacks["alloc"]) == FRESH_FROM_MAIN


@pytest.mark.parametrize("build", list(BUILDS))
def test_cxx_exception_through_instrumented_frames(a64_build, tmp_path, build):
    # GIVEN 100 exceptions thrown four instrumented frames down, caught in main
    exe = a64_build("uw_throw", build, cxx=True)
    out = _run(exe, tmp_path, build, "auto")
    alloc = _stacks(out)["alloc"]
    # THEN main's allocation through fresh_alloc is fresh_alloc <- main
    assert [k for k, _ in alloc] == [CALL, ENTRY, CALL, CALL]
    assert [n.removeprefix("_ZL11") for n in _names(exe, alloc)] == [
        "fresh_allocm", "fresh_allocm", "main", "<lib>"]
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("mode", ["auto", "shadow"])
def test_frames_left_then_a_deeper_call_through_code_not_instrumented(a64_build, tmp_path, build, mode):
    # GIVEN a longjmp out of down, down, down, thrower; then deep_call (not
    # instrumented), whose 8 KiB frame overwrites the frames left, calls
    # fresh_alloc
    exe = a64_build("uw_jumps", build)
    out = _run(exe, tmp_path, build, mode, "deep")
    stacks = _stacks(out)
    # THEN that block's stack is fresh_alloc <- deep_call <- main's caller
    # (deep_call's frame: its return address is the one main's call left)
    assert [k for k, _ in stacks["alloc1"]] == [CALL, ENTRY, CALL, CALL]
    assert _names(exe, stacks["alloc1"]) == ["fresh_alloc", "fresh_alloc", "deep_call", "<lib>"]
    # AND main's own allocation after it fresh_alloc <- main
    assert _names(exe, stacks["alloc"]) == FRESH_FROM_MAIN
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("build", ["O2-nofp", "O2-pac"])
@pytest.mark.parametrize("mode", ["auto", "shadow"])
def test_exit_hook_reached_by_a_jump_after_the_epilogue(a64_build, tmp_path, build, mode):
    # GIVEN tail_exit, a void function whose exit hook -O2 reaches by a
    # branch after its epilogue (x30 its own return address again:
    # restored, and with PAC authenticated), whose uninstrumented callee
    # setjmps and calls throw_back, which longjmps back: when the exit
    # runs, throw_back's dead entry is inside tail_exit's
    exe = a64_build("uw_jumps", build)
    disasm = subprocess.run([OBJDUMP, "-d", "--no-show-raw-insn", str(exe)], capture_output=True,
                            text=True, timeout=60, check=True).stdout
    body = disasm.split("<tail_exit>:", 1)[1].split("\n\n", 1)[0].strip().splitlines()
    last = body[-1].split()
    assert last[1:] == ["b", last[2], "<__cyg_profile_func_exit@plt>"], body
    out = _run(exe, tmp_path, build, mode, "tailexit")
    # THEN that exit pops throw_back's entry and tail_exit's, not main's
    assert _names(exe, _stacks(out)["alloc"]) == FRESH_FROM_MAIN
    assert _depth(out) == (2, 0)


@pytest.mark.parametrize("build", list(BUILDS))
def test_callee_entered_again_at_other_stack_pointers(a64_build, tmp_path, build):
    # GIVEN host(k), k = 0..7, which alloca()s 16 k + 1 bytes and then calls
    # realigned, whose 64-byte aligned local gcc places in an oversized
    # frame on aarch64 (it does not realign the stack pointer there, as on
    # x86_64): realigned entered from one call site at eight stack pointers
    exe = a64_build("uw_jumps", build)
    out = _run(exe, tmp_path, build, "auto", "realign")
    stacks = _stacks(out)
    # THEN every block realigned allocated has its whole stack
    assert sorted(k for k in stacks if k.startswith("realign")) == [f"realign{k}" for k in range(8)]
    for k in range(8):
        assert _names(exe, stacks[f"realign{k}"]) == ["realigned", "realigned", "host", "main", "<lib>"], k
    assert _names(exe, stacks["alloc"]) == FRESH_FROM_MAIN
    assert _depth(out) == (2, 0)


# ---------------------------------------------------- three calls deep --


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize("where,outer", [("main", "main"), ("thread", "thread_main")])
def test_shadow_stack_names_the_three_calls(a64_build, tmp_path, build, where, outer):
    # GIVEN lt_stack: level1 -> level2 -> level3 -> malloc, from main or
    # from a thread's start routine
    exe = a64_build("lt_stack", build)
    out = _run(exe, tmp_path, build, "auto", *(("thread",) if where == "thread" else ()))
    stacks = _stacks(out)
    alloc = stacks["alloc"]
    # THEN: the return address in level3, level3's entry, then the call
    # sites in level2, level1 and the outer function
    assert [k for k, _ in alloc[:5]] == [CALL, ENTRY, CALL, CALL, CALL]
    assert _names(exe, alloc)[:5] == ["level3", "level3", "level2", "level1", outer]
    # AND the ENTRY frame is level3's entry address exactly
    nm = subprocess.run([NM, str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout
    level3 = next(int(line.split()[0], 16) for line in nm.splitlines() if line.endswith(" level3"))
    assert alloc[1] == (ENTRY, level3)
    assert _names(exe, stacks["free"])[:5] == ["free_level2", "free_level2", "free_level1", "report", "main"]


# ------------------------------------ the reader, where CFI ends early --


@pytest.mark.parametrize("build", ["O2", "O2-pac"])
def test_the_readers_walk_goes_on_with_libtags_shadow_stack(a64_build, run_cli, tmp_path, build):
    # GIVEN a64_shadow: main -> shadow_a -> shadow_b -> park_nocfi (no CFI,
    # x29 not a frame record) -> snap, which takes a snapshot
    exe = a64_build("a64_shadow", build)
    line = A.lines_of(A.VICTIMS / "a64_shadow.c")
    run = A.a64_run(exe, tmp_path, pac=build == "O2-pac", LIBTAG_GUARD_RATE="0")
    assert run.returncode == 0, run.stderr
    pid = int(run.stdout.split("pid ", 1)[1].split()[0])
    # WHEN inspect reads libtag's core of it
    doc = A.cli_json_plain(run_cli, tmp_path, "inspect", str(A.only_core(tmp_path, "on-demand")))
    (thread,) = [t for t in doc["threads"] if t["tid"] == pid]
    # THEN the thread has the stack pointer libtag saved for it, and its
    # stack is the walk's from those registers - snap at its call of
    # libtag_snapshot, park_nocfi, where the walk ends - then the shadow
    # stack's: shadow_b (its entry: the call in it went through park_nocfi,
    # which no hook saw), shadow_a and main at the lines of their calls,
    # then main's caller in libc
    assert thread["sp"] is not None
    stack = [f for f in thread["stack"] if not f["inlined"]]
    names = [f["function"] for f in stack]
    start = names.index("snap")
    assert A.frames(stack[start:start + 5]) == [
        ("snap", line["snapshot"]), ("park_nocfi", None), ("shadow_b", None),
        ("shadow_a", line["call-b"]), ("main", line["call-a"])], stack
    assert stack[start + 5]["module"].endswith("/libc.so.6") and len(stack) == start + 6, stack


# ------------------------------------------------------------ page size --


@pytest.mark.parametrize("page", [4096, 16384, 65536])
def test_guard_pool_takes_the_systems_page_size(a64_build, tmp_path, page):
    # GIVEN qemu giving the guest pages of 4, 16 or 64 KiB (QEMU_PAGESIZE:
    # sysconf, AT_PAGESZ and mmap's alignment), every block guarded
    exe = a64_build("a64_pages", "O2", instrument=False)
    run = A.a64_run(exe, tmp_path, QEMU_PAGESIZE=str(page), LIBTAG_GUARD_RATE="1", LIBTAG_ON_ANOMALY="ignore",
                    LIBTAG_QUIET="1")
    assert run.returncode == 0, run.stderr
    got = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    # THEN libtag took that page size and says so in its control block
    assert (int(got["page"]), int(got["control"])) == (page, page)
    # AND its guard slots are four of those pages, each after a guard page:
    # the first block ends slot 0, the third slot 2
    slot = 4 * page
    assert int(got["slot"]) == slot
    assert (int(got["first"]), int(got["third"])) == (page + slot - 48, page + 2 * (slot + page) + slot - 48)
    # AND a read after free is caught at the instruction (a read, then the
    # free pattern), and a write one byte past a block in the guard page
    # after its slot (a heap overflow, a write)
    assert got["uaf"].split() == [str(4), str(1), str(0xFD)]
    assert got["overflow"].split() == [str(3), str(2)]
    assert run.stdout.splitlines()[-1] == "survived"


# -------------------------------------------- FP registers in libtag's cores --

NT_PRSTATUS, NT_FPREGSET, NT_PRPSINFO, NT_AUXV, NT_FILE = 1, 2, 3, 6, 0x46494C45
PR_PID, PR_FPVALID = 32, 384  # offsets in aarch64's struct elf_prstatus (392 bytes)


def _fp_notes(core: Path) -> tuple[list[int], dict[int, bytes], dict[int, int]]:
    """(the note types in order, {tid: its NT_FPREGSET}, {tid: pr_fpvalid})."""
    from forensics.core import Core

    with Core.open(core) as c:
        raw = c.notes.raw
    fp, valid, tid = {}, {}, None
    for n in raw:
        if n.type == NT_PRSTATUS:
            tid = int.from_bytes(n.desc[PR_PID:PR_PID + 4], "little")
            valid[tid] = int.from_bytes(n.desc[PR_FPVALID:PR_FPVALID + 4], "little")
        elif n.type == NT_FPREGSET:
            fp[tid] = bytes(n.desc)
    return [n.type for n in raw], fp, valid


def _vreg(fp: bytes, i: int) -> int:
    return int.from_bytes(fp[16 * i:16 * i + 16], "little")


def _fpcr(fp: bytes) -> int:
    return int.from_bytes(fp[516:520], "little")


def _gdb_fp(exe: Path, core: Path, *exprs: str) -> list[str]:
    """What gdb-multiarch prints for each expression on the core's current thread."""
    args = [arg for e in exprs for arg in ("-ex", f"p/x {e}")]
    done = subprocess.run(["gdb-multiarch", "-nx", "-q", "-batch", "-ex", f"set sysroot {A.SYSROOT}", *args,
                           str(exe), str(core)], capture_output=True, text=True, timeout=120)
    return [line.split(" = ", 1)[1] for line in done.stdout.splitlines() if line.startswith("$")]


def test_a_snapshot_core_has_the_snapshotting_threads_fp_registers(a64_build, tmp_path):
    # GIVEN main with d8 (callee-saved) 0x0123456789abcdef and FPCR's
    # rounding mode towards zero, asking for a snapshot
    exe = a64_build("a64_fpregs", "O2", instrument=False)
    run = A.a64_run(exe, tmp_path, "snapshot", LIBTAG_GUARD_RATE="0")
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "done", run.stderr
    pid = int(run.stdout.split("pid ", 1)[1].split()[0])
    core = A.only_core(tmp_path, "on-demand")
    # WHEN its notes are read
    types, fp, valid = _fp_notes(core)
    # THEN the thread's NT_FPREGSET follows the process's notes, as the
    # kernel orders them, and its NT_PRSTATUS says one follows
    assert types == [NT_PRSTATUS, NT_PRPSINFO, NT_AUXV, NT_FILE, NT_FPREGSET]
    assert (list(fp), valid, len(fp[pid])) == ([pid], {pid: 1}, 528)
    # AND it holds d8 and FPCR as main set them; v17, which no call keeps,
    # reads 0
    assert (_vreg(fp[pid], 8) & (1 << 64) - 1, _fpcr(fp[pid]), _vreg(fp[pid], 17)) == (
        0x0123456789ABCDEF, 0xC00000, 0)
    if shutil.which("gdb-multiarch"):
        assert _gdb_fp(exe, core, "$d8.u", "$fpcr") == ["0x123456789abcdef", "0xc00000"]


def test_a_crash_core_has_the_faulting_threads_fp_registers(a64_build, tmp_path):
    # GIVEN a worker thread with v17 0x0123456789abcdef:fedcba9876543210 and
    # FPCR's rounding mode towards plus infinity, writing through NULL
    exe = a64_build("a64_fpregs", "O2", instrument=False)
    run = A.a64_run(exe, tmp_path, "crash", LIBTAG_GUARD_RATE="0")
    assert run.returncode == -11, run.stderr
    worker = int(run.stdout.split("worker ", 1)[1].split()[0])
    core = A.only_core(tmp_path, "crash")
    # WHEN the notes of libtag's crash core are read
    types, fp, valid = _fp_notes(core)
    # THEN the faulting thread's NT_FPREGSET (from its signal context)
    # holds them, after its NT_PRSTATUS and the process's notes
    assert types[:5] == [NT_PRSTATUS, NT_PRPSINFO, NT_AUXV, NT_FILE, NT_FPREGSET]
    assert valid[worker] == 1
    assert (_vreg(fp[worker], 17), _fpcr(fp[worker])) == (0x0123456789ABCDEF_FEDCBA9876543210, 0x400000)
    if shutil.which("gdb-multiarch"):
        assert _gdb_fp(exe, core, "$v17.q.u", "$fpcr") == ["{0x123456789abcdeffedcba9876543210}", "0x400000"]
