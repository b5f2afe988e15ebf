"""The stacks forensics reports equal gdb's on the same core or process,
frame by frame, inline frames included.

tests/victims/rs_stacks.c, rs_stacks_cxx.cc, uw_stacks.c and uw_crash.c are
built -O2 without frame pointers and not instrumented: every stack comes
from the binaries' CFI.
gdb runs with its default debug file directory (so, where libc6-dbg is
installed, both see glibc's debug information and its inline frames) and
its own Python API lists each thread's frames: type, pc, function, file and
line.  Two kinds of gdb frames are left out of the comparison, as
docs/json.md says: the signal trampoline (``<signal handler called>``: the
frame after it is the interrupted one, in both) and tail-call frames (gdb
reconstructs them from DWARF call-site records; they are not on the stack).
Names are compared for the victims' own functions; glibc's have aliases
(gdb's ``__GI_raise`` is llvm-symbolizer's ``raise``), so there the
address, file, line and inline structure must agree.  Lines are compared
except in the C++ library's headers, where one address can have several
rows in the line table and the two tools pick different ones (for
``std::string::assign`` inlined at a call, gdb says the line of its
declaration, llvm-symbolizer the line of the call in its body).

- every thread of a snapshot (libtag's saved registers; the thread taking
  the snapshot from its own code), of a gcore core (the core's notes) and of
  a crash core (a fault in a worker, through an inlined function; abort();
  a fault in a signal handler), on both core paths;
- allocation and free stacks of blocks, against gdb's frames at a
  breakpoint on libtag's malloc, free and operator new in the same process
  (whose core gdb then writes): nested calls, a thread, strdup and fopen
  allocating for the program, recursion 40 deep, inlined helpers, signal
  handlers (on the thread's stack and on a sigaltstack), a free through an
  inlined helper, libstdc++ allocating for a std::string and a std::vector;
- a thread whose CFI walk ends early (code without CFI or frame pointer)
  goes on with libtag's shadow stack;
- Debian's python3 (PYTHONMALLOC=malloc) under forensics run: the eval loop
  and Py_BytesMain in its top allocation stacks.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import forensics_test_support as S
from forensics.snapshots import snapdir

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")

O2_NO_FP = ("-O2", "-fomit-frame-pointer")
NORMAL, INLINE, TAILCALL, SIGTRAMP = 0, 2, 3, 4  # gdb.NORMAL_FRAME ...

# gdb's Python: every frame of the selected thread, one line each
GDB_HELPERS = r'''
import gdb

def _frames():
    try:
        f = gdb.newest_frame()
    except gdb.error:  # a thread gdb knows without its registers
        return
    while f is not None:
        try:
            sal = f.find_sal()
            name = f.name() or "-"
            path = sal.symtab.filename if sal.symtab else "-"
            print("F %d %#x %s|%s|%d" % (f.type(), f.pc(), name, path, sal.line or 0))
            f = f.older()
        except gdb.error:  # no registers for this thread, or the end
            break

def dump_threads():
    for t in gdb.selected_inferior().threads():
        try:
            t.switch()
        except gdb.error:  # listed from glibc's thread list, no registers
            continue
        print("T %d" % t.ptid[1])
        _frames()
    print("END")

def print_blocks():
    """The victim's blocks[] array: "block <marker> <address>"."""
    blocks = gdb.parse_and_eval("blocks")
    for m in range(1, blocks.type.range()[1] + 1):
        print("block %d %#x" % (m, int(blocks[m])))

class MarkedBreak(gdb.Breakpoint):
    """At libtag's entry point (frame 0 in libtag's sources) while the
    victim's `marker` is set: print the frames."""
    def __init__(self, spec, what):
        super().__init__(spec, internal=True)
        self.what = what
    def stop(self):
        try:
            m = int(gdb.parse_and_eval("marker"))
        except gdb.error:
            return False
        sal = gdb.newest_frame().find_sal()
        if m and sal.symtab and "/libtag/src/" in sal.symtab.filename:
            print("M %d %s" % (m, self.what))
            _frames()
            print("END")
        return False
'''

GDB_SETTINGS = """\
set pagination off
set confirm off
set debuginfod enabled off
set backtrace past-main on
set startup-with-shell off
"""


@dataclass(frozen=True)
class GFrame:
    type: int
    pc: int
    name: str
    file: str | None
    line: int | None


_F = re.compile(r"^F (\d+) (0x[0-9a-f]+) (.*)\|(.*)\|(\d+)$")


def _parse_frames(lines) -> list[GFrame]:
    out = []
    for line in lines:
        m = _F.match(line)
        if m:
            out.append(GFrame(int(m[1]), int(m[2], 16), m[3], None if m[4] == "-" else m[4],
                              int(m[5]) or None))
    return out


def _sections(text: str, opens: str) -> dict[tuple[str, ...], list[GFrame]]:
    """{the words after `opens`: frames} of each section of gdb's output
    that starts with a line "<opens> ..." and ends with "END" (or the next
    section); the last of equal keys wins."""
    out: dict[tuple[str, ...], list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith(opens + " "):
            cur = tuple(line.split()[1:])
            out[cur] = []
        elif line == "END":
            cur = None
        elif cur is not None:
            out[cur].append(line)
    return {k: _parse_frames(v) for k, v in out.items()}


def gdb_threads(text: str) -> dict[int, list[GFrame]]:
    """{lwp: frames} from dump_threads() output."""
    return {int(k[0]): v for k, v in _sections(text, "T").items()}


def gdb_marked(text: str) -> dict[tuple[int, str], list[GFrame]]:
    """{(marker, "alloc"|"free"): frames} of the last stop per marker."""
    return {(int(k[0]), k[1]): v for k, v in _sections(text, "M").items()}


def gdb_on_core(exe: Path, core: Path, tmp_path: Path) -> dict[int, list[GFrame]]:
    script = tmp_path / "core.gdb"
    script.write_text(GDB_SETTINGS + f"python\n{GDB_HELPERS}\nend\npython dump_threads()\n")
    out = subprocess.run(["gdb", "-q", "-batch", "-nx", "-x", str(script), str(exe), str(core)],
                         capture_output=True, text=True, timeout=180).stdout
    threads = gdb_threads(out)
    assert threads, f"gdb listed no thread of {core}:\n{out[-3000:]}"
    return threads


def _base(path: str | None) -> str | None:
    return path.rsplit("/", 1)[-1] if path else None


def _name(name: str | None) -> str | None:
    """A function name without its parameters or a clone suffix."""
    return name.split("(")[0].strip() if name else name


def _short(name: str | None) -> str | None:
    """The last component of a C++ name: llvm-symbolizer names an inlined
    function the compiler gave no linkage name (a static inline one) by its
    own name, where gdb adds the namespaces around it."""
    return _name(name).split("::")[-1] if name else name


def comparable(frames: list[GFrame]) -> list[GFrame]:
    """gdb's frames that forensics reports too (see the module docstring)."""
    return [f for f in frames if f.type not in (TAILCALL, SIGTRAMP)]


def assert_same_frames(ours: list[dict], theirs: list[GFrame], own_sources: tuple[str, ...], what: str):
    """Frame by frame: address, inline structure, file and line; the name
    too for a function of the victim (a file in own_sources; C++ template
    names are spelled differently by the two tools and left to the rest)."""
    want = comparable(theirs)
    show = "\n".join(f"  ours {f['address']} {f['function']} {_base(f['file'])}:{f['line']}"
                     f"{' inlined' if f['inlined'] else ''}" for f in ours)
    show += "\n" + "\n".join(f"  gdb  {g.pc:#x} {g.name} {_base(g.file)}:{g.line} type {g.type}"
                             for g in theirs)
    assert len(ours) == len(want), f"{what}: {len(ours)} frames, gdb {len(want)}\n{show}"
    for i, (f, g) in enumerate(zip(ours, want)):
        where = f"{what}, frame {i}\n{show}"
        assert int(f["address"], 16) == g.pc, where
        assert f["inlined"] == (g.type == INLINE), where
        assert _base(f["file"]) == _base(g.file), where
        if not (g.file or "").startswith("/usr/include/"):
            assert f["line"] == g.line, where
        if _base(g.file) in own_sources and "<" not in g.name:
            assert _short(f["function"]) == _short(g.name), where


def own(frames: list[dict], source: str) -> list[str]:
    """The victim's own functions of a stack (by source file), innermost first."""
    return [_name(f["function"]) for f in frames if _base(f["file"]) == source]


def inspect_json(run_cli, core: Path, state: Path) -> dict:
    done = run_cli("inspect", "--json", str(core), env={"XDG_STATE_HOME": str(state)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def whoowns_json(run_cli, core: Path, addr: int, state: Path) -> dict:
    done = run_cli("whoowns", hex(addr), "--core", str(core), "--json",
                   env={"XDG_STATE_HOME": str(state)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def one_core(snaps: Path, suffix: str) -> Path:
    dirs = S.snapshot_dirs(snaps)
    assert len(dirs) == 1 and dirs[0].name.endswith(suffix), dirs
    snap = snapdir.wait_complete(dirs[0], 60)
    core = snapdir.find_core(snap.path)
    assert core is not None, f"no core in {snap.path}"
    return core


def printed(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        words = line.split()
        if len(words) >= 2:
            out[" ".join(words[:-1])] = words[-1:]
    return out


# What the victim knows about its parked threads: its own functions on each
# stack, innermost first (rs_stacks.c's header).
PARKED = {
    "nested": ["park_inner", "park_middle", "worker_nested"],
    "recursive": ["park_inner"] + ["park_recurse"] * 30 + ["worker_recursive"],
    "inlined": ["park_inline", "worker_inlined"],
    "handler": ["park_inner", "handler_park", "interrupted", "worker_handler"],
    "spinning": ["spin_clock", "worker_spin"],
}


@pytest.fixture(scope="module")
def rs_exe(build_victim) -> Path:
    return Path(os.path.realpath(build_victim("rs_stacks", instrument=False, extra_flags=O2_NO_FP)))


@pytest.fixture(scope="module")
def cxx_exe(build_victim) -> Path:
    return Path(os.path.realpath(build_victim("rs_stacks_cxx", instrument=False, cxx=True,
                                              extra_flags=O2_NO_FP)))


# -- every thread of a snapshot -------------------------------------------------


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_snapshot_threads_equal_gdb(rs_exe, run_victim, run_cli, tmp_path, core_path):
    # GIVEN rs_stacks with four threads parked in known places (one inside a
    # signal handler, one 30 calls deep, one in an inlined function), one
    # calling clock_gettime() in a loop (in the vDSO, mostly), and main
    # taking a snapshot
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    done = run_victim(rs_exe, "park", snap_dir=snaps, env={"LIBTAG_CORE": core_path})
    assert done.returncode == 0, done.stderr
    facts = printed(done.stdout)
    tids = {name: int(facts[f"thread {name}"][0]) for name in PARKED}
    main_tid = int(facts["main"][0])
    core = one_core(snaps, "-1-on-demand")
    # WHEN inspect reads the threads
    doc = inspect_json(run_cli, core, tmp_path / "state")
    ours = {t["tid"]: t["stack"] for t in doc["threads"]}
    assert set(ours) == {main_tid, *tids.values()}, ours.keys()
    # THEN each parked thread shows the victim's functions where it parked,
    # down to its outermost frame (clone3)
    for name, tid in tids.items():
        assert own(ours[tid], "rs_stacks.c") == PARKED[name], (name, ours[tid])
        assert ours[tid][-1]["function"] == "clone3", (name, ours[tid][-1])
    assert [f["inlined"] for f in ours[tids["inlined"]] if _base(f["file"]) == "rs_stacks.c"] == [True, False]
    # AND a frame in the vDSO is named from the vDSO's own symbols
    spin = ours[tids["spinning"]]
    if spin[0]["module"] == "[vdso]":
        assert spin[0]["function"] in ("clock_gettime", "__vdso_clock_gettime"), spin[0]
    # AND the snapshotting thread starts in libtag's snapshot code (marked),
    # then the program's call to libtag_snapshot(), down to _start
    main = ours[main_tid]
    assert main[0]["libtag"] and main[0]["function"] == "_tag_snapshot_take", main[0]
    assert own(main, "rs_stacks.c") == ["take_snapshot", "park_mode", "main"], main
    assert main[-1]["function"] == "_start" and not any(f["libtag"] for f in main[-6:]), main
    # AND the frames are gdb's on the same core: every thread where the core
    # holds libtag's saved registers (LIBTAG_CORE=self); where the kernel
    # wrote the core of the fork child (kernel), gdb has the registers of
    # that one thread, whose frames from the program's call on are the
    # snapshotting thread's (the others it lists from glibc's thread list,
    # without registers)
    theirs = gdb_on_core(rs_exe, core, tmp_path)
    if core_path == "self":
        assert set(theirs) == set(ours)
        for tid in ours:
            assert_same_frames(ours[tid], theirs[tid], ("rs_stacks.c", "snapshot.c"), f"thread {tid}")
    else:
        (child,) = [fs for fs in theirs.values() if any(g.name == "take_snapshot" for g in fs)]
        start = next(i for i, g in enumerate(child) if g.name == "take_snapshot")
        mine = next(i for i, f in enumerate(main) if f["function"] == "take_snapshot")
        assert_same_frames(main[mine:], child[start:], ("rs_stacks.c",), "snapshotting thread")


# -- crash cores ------------------------------------------------------------------

CRASH_MODES = {
    # mode: victim, signal, the victim's own functions on the crash stack
    "thread": ("rs_stacks", signal.SIGSEGV, ["inline_crash", "crash_here", "crash_worker"]),
    "abort": ("uw_crash", signal.SIGABRT, ["give_up", "check", "main"]),
    "handler": ("rs_stacks", signal.SIGSEGV, ["inline_crash", "crash_here", "crash_handler_fn",
                                              "interrupted", "handler_worker"]),
}


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
@pytest.mark.parametrize("mode", list(CRASH_MODES))
def test_crash_stack_equals_gdb(build_victim, run_victim, run_cli, tmp_path, core_path, mode):
    victim, sig, names = CRASH_MODES[mode]
    exe = Path(os.path.realpath(build_victim(victim, instrument=False, extra_flags=O2_NO_FP)))
    source = f"{victim}.c"
    # GIVEN rs_stacks dying (a fault in a worker two calls and an inlined
    # function deep, abort() two calls deep, a fault in a signal handler)
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    done = run_victim(exe, mode, snap_dir=snaps, env={"LIBTAG_CORE": core_path})
    assert done.returncode == -sig, done.stderr
    core = one_core(snaps, "-1-crash")
    # WHEN inspect reads the crash
    doc = inspect_json(run_cli, core, tmp_path / "state")
    crash = doc["crash"]
    stack = crash["stack"]
    # THEN the stack runs through the victim's functions, inline frames and
    # the code a signal interrupted included, to the thread's outermost frame
    assert own(stack, source) == names, stack
    assert stack[-1]["function"] == ("_start" if mode == "abort" else "clone3"), stack[-1]
    # AND it is gdb's bt of the faulting thread on the same core, frame by
    # frame (on the kernel path an abort core holds the thread inside
    # libtag's handler: libtag's frame, then the signal frame, then abort)
    theirs = gdb_on_core(exe, core, tmp_path)[crash["thread"]]
    assert_same_frames(stack, theirs, (source,), f"crash ({mode}, {core_path})")
    # AND the thread's entry in threads is the same stack
    (thread,) = [t for t in doc["threads"] if t["tid"] == crash["thread"]]
    assert thread["stack"] == stack


def test_human_crash_stack_leaves_libtag_out(build_victim, run_victim, run_cli, tmp_path):
    # GIVEN an abort core the kernel wrote while libtag's handler re-raised
    # the signal (its frames and the system call it made are on the stack)
    if S.kernel_core_skip_reason():
        pytest.skip(S.kernel_core_skip_reason())
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    exe = build_victim("uw_crash", instrument=False, extra_flags=O2_NO_FP)
    done = run_victim(exe, "abort", snap_dir=snaps, env={"LIBTAG_CORE": "kernel"})
    assert done.returncode == -signal.SIGABRT, done.stderr
    core = one_core(snaps, "-1-crash")
    doc = inspect_json(run_cli, core, tmp_path / "state")
    stack = doc["crash"]["stack"]
    assert [f["function"] for f in stack[:2]] == ["syscall", "crash_handler"] and stack[1]["libtag"], stack[:3]
    # WHEN inspect prints it for a person
    text = run_cli("inspect", str(core), env={"XDG_STATE_HOME": str(tmp_path / "state"),
                                              "COLUMNS": "200"}).stdout
    faulting = text.split("faulting thread", 1)[1].split("\n\n", 1)[0]
    lines = [ln for ln in faulting.splitlines() if "0x" in ln]
    # THEN it starts where the program's abort() began: libtag's handler and
    # the system call it made are left out (the JSON keeps them)
    assert "crash_handler" not in faulting and " syscall " not in faulting, faulting
    assert "__pthread_kill_implementation" in lines[0], faulting
    assert [ln.split()[2] for ln in lines if "uw_crash.c" in ln] == ["give_up", "check", "main"], faulting


# -- allocation and free stacks, against gdb in the live process ------------------


def _live_run(exe: Path, libtag_so, tmp_path: Path, breaks: list[tuple[str, str]], *,
              stop: str = "park_done", args: str = "park") -> tuple[str, Path]:
    """Run exe under gdb with libtag preloaded: the marked breakpoints, then
    at `stop` a gcore core, the victim's blocks[] and every thread's frames."""
    core = tmp_path / "gcore.core"
    script = tmp_path / "live.gdb"
    bps = "\n".join(f"MarkedBreak({spec!r}, {what!r})" for spec, what in breaks)
    script.write_text(
        GDB_SETTINGS
        + "set breakpoint pending on\n"
        + "handle SIGUSR1 nostop noprint pass\n"
        + f"set environment LD_PRELOAD={libtag_so}\n"
        + "set environment LIBTAG_QUIET=1\n"
        + f"python\n{GDB_HELPERS}\n{bps}\nend\n"
        + f"break {stop}\n"
        + f"run {args}\n"
        + f"gcore {core}\n"
        + "python print_blocks()\n"
        + "python dump_threads()\n"
        + "kill\n")
    out = subprocess.run(["gdb", "-q", "-batch", "-nx", "-x", str(script), str(exe)],
                         capture_output=True, text=True, timeout=300).stdout
    assert core.is_file(), f"gdb wrote no core:\n{out[-3000:]}"
    return out, core


def _without_libtag_entry(frames: list[GFrame]) -> list[GFrame]:
    """gdb's frames from the caller of libtag's entry point on (libtag's
    stacks start there)."""
    i = 0
    while i < len(frames) and frames[i].file and "/libtag/src/" in frames[i].file:
        i += 1
    return frames[i:]


def _block_stack(run_cli, core: Path, facts: dict, m: int, state: Path, which: str = "alloc_stack"):
    doc = whoowns_json(run_cli, core, int(facts[f"block {m}"][0], 16), state)
    return doc["block"], doc["block"][which]


# uw_stacks.c's markers: the victim's own functions of each allocation
# stack, innermost first (7, malloc under a fake frame pointer, is below)
UW_MARKERS = {
    1: ["inner", "middle", "outer", "mark", "main"],
    2: ["inner", "middle", "outer", "mark", "worker"],
    3: ["dup_name", "main"],
    4: ["open_self", "main"],
    5: ["recurse"] * 41 + ["main"],
    6: ["inline_alloc", "host_of_inline", "mark", "main"],
    8: ["handler", "interrupted", "main"],
    9: ["alt_handler", "interrupted", "main"],
}


def test_allocation_stacks_equal_gdb_live(build_victim, libtag_so, run_cli, tmp_path):
    # GIVEN uw_stacks under gdb: the frames at each marked allocation, then
    # a core of the process at its last call (fclose of the FILE of marker 4)
    exe = Path(os.path.realpath(build_victim("uw_stacks", instrument=False, extra_flags=O2_NO_FP)))
    out, core = _live_run(exe, libtag_so, tmp_path, [("malloc", "alloc")], stop="fclose", args="")
    facts = printed(out)
    marked = gdb_marked(out)
    state = tmp_path / "state"
    for m, names in UW_MARKERS.items():
        assert (m, "alloc") in marked, f"gdb never stopped at marker {m}:\n{out[-3000:]}"
        # WHEN whoowns names the block of marker m in the core
        _, stack = _block_stack(run_cli, core, facts, m, state)
        # THEN its allocation stack runs through the victim's functions
        assert own(stack, "uw_stacks.c") == names, (m, stack)
        # AND it is gdb's at the allocation, frame by frame, inline frames
        # and the signal frames' interrupted code included
        assert_same_frames(stack, _without_libtag_entry(marked[(m, "alloc")]), ("uw_stacks.c",),
                           f"allocation {m}")
    # AND the inlined helper is an inline frame of its host
    _, stack = _block_stack(run_cli, core, facts, 6, state)
    assert [(f["function"], f["inlined"]) for f in stack[:2]] == [("inline_alloc", True),
                                                                  ("host_of_inline", False)]
    # AND under a fake frame pointer the stack stops at malloc's caller,
    # where gdb goes on into the junk
    _, stack = _block_stack(run_cli, core, facts, 7, state)
    gdb7 = _without_libtag_entry(marked[(7, "alloc")])
    assert [int(f["address"], 16) for f in stack] == [gdb7[0].pc] and len(gdb7) > 1, stack


def test_inlined_alloc_free_and_thread_stacks_equal_gdb_live(rs_exe, libtag_so, run_cli, tmp_path):
    # GIVEN rs_stacks under gdb: the frames at the marked allocation and
    # free, then at park_done() a core (gcore) and every thread's frames
    out, core = _live_run(rs_exe, libtag_so, tmp_path, [("malloc", "alloc"), ("free", "free")])
    facts = printed(out)
    marked = gdb_marked(out)
    state = tmp_path / "state"
    # WHEN whoowns names the block allocated through two inlined helpers
    _, stack = _block_stack(run_cli, core, facts, 1, state)
    # THEN both are inline frames of their host, as gdb shows them
    assert own(stack, "rs_stacks.c") == ["inline_inner", "inline_outer", "host_of_inline", "park_mode",
                                         "main"], stack
    assert [f["inlined"] for f in stack[:3]] == [True, True, False]
    assert_same_frames(stack, _without_libtag_entry(marked[(1, "alloc")]), ("rs_stacks.c",), "allocation 1")
    # AND the block freed through an inlined helper has gdb's free stack
    block, free_stack = _block_stack(run_cli, core, facts, 2, state, "free_stack")
    assert block["state"] == "freed"
    assert own(free_stack, "rs_stacks.c") == ["inline_release", "release", "park_mode", "main"], free_stack
    assert_same_frames(free_stack, _without_libtag_entry(marked[(2, "free")]), ("rs_stacks.c",), "free 2")
    # AND every thread's stack in the gcore core (its registers are the
    # core's notes) is gdb's in the live process at that moment
    ours = _threads_equal_gdb(run_cli, core, out, state, "rs_stacks.c")
    assert own(ours[int(facts["main"][0])], "rs_stacks.c") == ["park_done", "park_mode", "main"]


def _threads_equal_gdb(run_cli, core: Path, out: str, state: Path, source: str) -> dict[int, list]:
    """inspect's threads of a gcore core, each checked against gdb's frames
    of the live process (dump_threads in out); {tid: stack}."""
    theirs = gdb_threads(out)
    doc = inspect_json(run_cli, core, state)
    ours = {t["tid"]: t["stack"] for t in doc["threads"]}
    assert set(ours) == set(theirs)
    for tid, stack in ours.items():
        assert_same_frames(stack, theirs[tid], (source,), f"thread {tid}")
    return ours


def test_cxx_stacks_equal_gdb_live(cxx_exe, libtag_so, run_cli, tmp_path):
    # GIVEN rs_stacks_cxx under gdb: operator new at each marker, then a
    # gcore core with a std::thread parked
    out, core = _live_run(cxx_exe, libtag_so, tmp_path,
                          [("operator new(unsigned long)", "alloc"), ("malloc", "alloc")])
    facts = printed(out)
    marked = gdb_marked(out)
    state = tmp_path / "state"
    own_names = {1: ["make_inline", "shapes::Shape::make", "main"], 2: ["main"], 3: ["grow"]}
    for m, names in own_names.items():
        assert (m, "alloc") in marked, f"gdb never stopped at marker {m}:\n{out[-3000:]}"
        # WHEN whoowns names the block
        _, stack = _block_stack(run_cli, core, facts, m, state)
        # THEN the stack is gdb's at operator new, inline frames of the
        # victim and of the standard library's headers included
        assert [n for n in own(stack, "rs_stacks_cxx.cc")] == names, (m, stack)
        assert_same_frames(stack, _without_libtag_entry(marked[(m, "alloc")]), ("rs_stacks_cxx.cc",),
                           f"allocation {m}")
    # the vector grew through inlined library code (push_back and friends)
    _, stack = _block_stack(run_cli, core, facts, 3, state)
    assert any(f["inlined"] and "push_back" in (f["function"] or "") for f in stack)
    # AND every thread's stack, the parked std::thread's too
    ours = _threads_equal_gdb(run_cli, core, out, state, "rs_stacks_cxx.cc")
    parked = ours[int(facts["thread parked"][0])]
    assert own(parked, "rs_stacks_cxx.cc")[:2] == ["park_here", "parked_worker"], parked


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_cxx_uncaught_exception_equals_gdb(cxx_exe, run_victim, run_cli, tmp_path, core_path):
    # GIVEN a std::thread whose exception nobody catches: std::terminate, abort
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    done = run_victim(cxx_exe, "throw", snap_dir=snaps, env={"LIBTAG_CORE": core_path})
    assert done.returncode == -signal.SIGABRT, done.stderr
    core = one_core(snaps, "-1-crash")
    # WHEN inspect reads the crash
    doc = inspect_json(run_cli, core, tmp_path / "state")
    stack = doc["crash"]["stack"]
    # THEN it runs from abort through the C++ runtime to the throw
    names = [f["function"] for f in stack]
    assert "std::terminate()" in names and "__cxa_throw" in names, names
    assert own(stack, "rs_stacks_cxx.cc") == ["fail_deep", "throwing_worker"], stack
    # AND it is gdb's bt on the core
    theirs = gdb_on_core(cxx_exe, core, tmp_path)[doc["crash"]["thread"]]
    assert_same_frames(stack, theirs, ("rs_stacks_cxx.cc",), f"uncaught exception ({core_path})")


# -- a distribution binary ---------------------------------------------------------

PY_SNAPSHOT = """\
import os, signal
table = {f"k{i}": [i, str(i) * 3, {"n": i}] for i in range(20000)}
def snapshot():
    os.kill(os.getpid(), signal.SIGUSR2)  # libtag's snapshot signal
snapshot()
print(len(table))
"""


def test_debian_python3_shows_the_eval_loop(run_cli, tmp_path):
    # GIVEN Debian's python3 (stripped, no frame pointers: its stacks come
    # from its .eh_frame) with PYTHONMALLOC=malloc, snapshotting itself
    python3 = Path("/usr/bin/python3")
    if not python3.exists():
        pytest.skip("/usr/bin/python3 is not installed (.ci/run installs python3)")
    snaps = tmp_path / "snaps"
    done = run_cli("run", "--dir", snaps, "--", python3, "-s", "-c", PY_SNAPSHOT,
                   env={"PYTHONMALLOC": "malloc", "XDG_STATE_HOME": str(tmp_path / "state")},
                   timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "20000", done.stderr
    core = one_core(snaps, "-1-on-demand")
    # WHEN inspect reads it
    doc = inspect_json(run_cli, core, tmp_path / "state")
    # THEN the top allocation stacks run through the eval loop to Py_BytesMain
    tops = [[f["function"] for f in s["stack"]] for s in doc["top_stacks"]]
    assert tops and all("_PyEval_EvalFrameDefault" in t and "Py_BytesMain" in t for t in tops[:3]), tops[:3]
    # AND so does the main thread, from libtag's snapshot code in the
    # signal handler through the interrupted interpreter
    (main,) = [t["stack"] for t in doc["threads"] if t["tid"] == doc["process"]["pid"]]
    names = [f["function"] for f in main]
    assert main[0]["libtag"] and "_PyEval_EvalFrameDefault" in names and "Py_BytesMain" in names, names


# -- where CFI ends early, the shadow stack goes on ---------------------------------


def test_shadow_stack_continues_where_cfi_ends(build_victim, run_victim, run_cli, tmp_path):
    # GIVEN rs_shadow (instrumented): a thread parked under assembly without
    # CFI whose rbp is no frame pointer, below three instrumented callers
    exe = build_victim("rs_shadow")
    source = Path(__file__).resolve().parents[1] / "victims" / "rs_shadow.c"
    lines = source.read_text().splitlines()
    call_line = {fn: next(i for i, ln in enumerate(lines, 1) if ln.strip() == f"{fn}();")
                 for fn in ("shadow_b", "shadow_a")}
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    done = run_victim(exe, snap_dir=snaps, env={"LIBTAG_CORE": "self"})
    assert done.returncode == 0, done.stderr
    tid = int(printed(done.stdout)["thread"][0])
    core = one_core(snaps, "-1-on-demand")
    # WHEN inspect unwinds the thread
    doc = inspect_json(run_cli, core, tmp_path / "state")
    (stack,) = [t["stack"] for t in doc["threads"] if t["tid"] == tid]
    names = [f["function"] for f in stack if not f["inlined"]]
    # THEN CFI gives read, park_read and park_nocfi, and the shadow stack
    # the rest: shadow_b (whose call went through park_nocfi: its entry, no
    # line), shadow_a and worker at the lines of their calls, start_thread
    start = names.index("park_read")
    assert names[start:] == ["park_read", "park_nocfi", "shadow_b", "shadow_a", "worker", "start_thread"], stack
    by_name = {f["function"]: f for f in stack}
    assert by_name["shadow_b"]["line"] is None
    assert by_name["shadow_a"]["line"] == call_line["shadow_b"]
    assert by_name["worker"]["line"] == call_line["shadow_a"]
    # AND no frame is there twice
    physical = [f["address"] for f in stack if not f["inlined"]]
    assert len(physical) == len(set(physical)), stack
