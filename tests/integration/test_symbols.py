"""forensics.reader.symbols names real code addresses of a live victim and of its core.

tests/victims/sym_victim.c prints the entry addresses of sym_outer, sym_inner
and main, a return address inside sym_outer with the line of its call, and the
addresses of libc's qsort and getpid, then waits on stdin.  We build it as a
PIE with -g, as a non-PIE with -g, without -g, and stripped, read its modules
from /proc/PID/maps (and from a gcore core), and check every frame exactly:
names, file, line, and module offsets against ``nm`` of the unstripped build.
"""

from __future__ import annotations

import os
import select
import shutil
import sqlite3
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from forensics.core import Core, elf
from forensics.reader.insn import module_code, read_code
from forensics.reader.model import Frame
from forensics.reader.live import read_maps
from forensics.reader.symbols import (
    FRAME_CALL,
    FRAME_ENTRY,
    Module,
    SymbolFrame,
    Symbolizer,
    merge_entry_frames,
    modules_from_mappings,
)
import forensics_test_support as S

SOURCE = "sym_victim.c"
CALL_LINE = 35  # sym_victim.c: the line of sym_outer's call to sym_inner
ENTRY_LINES = {"sym_inner": 27, "sym_outer": 33, "main": 40}  # each function's opening line
TOOLS = [t for t in ("llvm-symbolizer", "addr2line") if shutil.which(t)]
LIBC_NAMES = {  # what each tool calls libc's qsort: addr2line reads the debug
    # file's symbol table (glibc's internal __GI_ alias) when libc6-dbg is there
    "llvm-symbolizer": {"qsort"},
    "addr2line": {"qsort", "__GI_qsort"},
}


@dataclass
class Victim:
    proc: subprocess.Popen[str]
    exe: Path
    pid: int = 0
    fn: dict[str, int] = field(default_factory=dict)
    libc: dict[str, int] = field(default_factory=dict)
    ret: int = 0
    ret_line: int = 0


def start_victim(exe: Path, timeout: float = 20.0) -> Victim:
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    victim = Victim(proc, exe)
    assert proc.stdout is not None
    out, deadline = b"", time.monotonic() + timeout
    while not out.endswith(b"ready\n"):  # raw reads: select() must see every byte
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            stop_victim(victim)
            raise AssertionError(f"{exe} did not report ready in {timeout}s: {out!r}")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise AssertionError(f"{exe} exited early ({proc.wait()}): {out!r}")
        out += chunk
    for line in out.decode().splitlines():
        key, *vals = line.split()
        if key == "pid":
            victim.pid = int(vals[0])
        elif key == "fn":
            victim.fn[vals[0]] = int(vals[1], 16)
        elif key == "libc":
            victim.libc[vals[0]] = int(vals[1], 16)
        elif key == "ret":
            victim.ret, victim.ret_line = int(vals[0], 16), int(vals[1])
    return victim


def stop_victim(victim: Victim) -> None:
    if victim.proc.poll() is None:
        assert victim.proc.stdin is not None
        victim.proc.stdin.close()
        try:
            victim.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            victim.proc.kill()
            victim.proc.wait(timeout=10)


@pytest.fixture
def victim_of() -> Iterator[Callable[[Path], Victim]]:
    started: list[Victim] = []

    def start(exe: Path) -> Victim:
        started.append(start_victim(exe))
        return started[-1]

    yield start
    for v in started:
        stop_victim(v)


def nm_values(exe: Path) -> dict[str, int]:
    """Symbol name -> st_value, from the file's own symbol table."""
    out = subprocess.run(["nm", "--defined-only", str(exe)], capture_output=True, text=True, check=True)
    return {f[2]: int(f[0], 16) for f in (line.split() for line in out.stdout.splitlines()) if len(f) == 3}


def victim_pcs(v: Victim) -> list[tuple[int, int]]:
    """ENTRY sym_inner, ENTRY sym_outer, ENTRY main, CALL ret, ENTRY qsort."""
    return [
        (v.fn["sym_inner"], FRAME_ENTRY),
        (v.fn["sym_outer"], FRAME_ENTRY),
        (v.fn["main"], FRAME_ENTRY),
        (v.ret, FRAME_CALL),
        (v.libc["qsort"], FRAME_ENTRY),
    ]


@pytest.fixture(scope="module")
def builds(build_victim, tmp_path_factory) -> dict[str, Path]:
    """pie (-g), nopie (-g -no-pie), nodebug (-g0), stripped (strip of pie)."""
    pie = build_victim("sym_victim", instrument=False)
    stripped = tmp_path_factory.mktemp("stripped") / "sym_victim-stripped"
    subprocess.run(["strip", "-o", str(stripped), str(pie)], check=True)
    return {
        "pie": pie,
        "nopie": build_victim("sym_victim", instrument=False, extra_flags=("-no-pie",)),
        "nodebug": build_victim("sym_victim", instrument=False, extra_flags=("-g0",)),
        "stripped": stripped,
    }


def module_named(modules: list[Module], path: Path) -> Module:
    found = [m for m in modules if m.path == str(path)]
    assert len(found) == 1, modules
    return found[0]


# -- modules and load bias -----------------------------------------------------


def test_pie_bias_is_the_start_of_its_first_mapping(builds, victim_of):
    # GIVEN a running PIE victim
    v = victim_of(builds["pie"])
    maps = read_maps(v.pid)
    # WHEN its modules are read from /proc/PID/maps
    modules = modules_from_mappings(maps)
    # THEN the victim is one module whose bias is where file offset 0 is mapped,
    # and pc - bias is the symbol's value in the file
    mod = module_named(modules, builds["pie"])
    offset0 = [m.start for m in maps if m.path == str(builds["pie"]) and m.offset == 0]
    assert mod.load_bias == offset0[0]
    assert mod.start == offset0[0]
    assert v.fn["sym_outer"] - mod.load_bias == nm_values(builds["pie"])["sym_outer"]
    assert mod.deleted is False


def test_non_pie_bias_is_zero(builds, victim_of):
    # GIVEN a running -no-pie victim (first PT_LOAD at vaddr 0x400000)
    v = victim_of(builds["nopie"])
    # WHEN its modules are read
    mod = module_named(modules_from_mappings(read_maps(v.pid)), builds["nopie"])
    # THEN its bias is 0 and it starts at 0x400000
    assert mod.load_bias == 0
    assert mod.start == 0x400000
    assert v.fn["sym_outer"] == nm_values(builds["nopie"])["sym_outer"]


def test_libc_is_a_module_with_page_aligned_bias(builds, victim_of):
    # GIVEN a running victim WHEN its modules are read
    v = victim_of(builds["pie"])
    modules = modules_from_mappings(read_maps(v.pid))
    libc = [m for m in modules if os.path.basename(m.path) == "libc.so.6"]
    # THEN libc is one module holding qsort, and qsort - bias is its dynsym value
    assert len(libc) == 1
    assert v.libc["qsort"] in libc[0]
    assert libc[0].load_bias % 4096 == 0
    dynsym = subprocess.run(["nm", "-D", "--defined-only", libc[0].path], capture_output=True, text=True,
                            check=True).stdout
    qsort = [int(f[0], 16) for f in (line.split() for line in dynsym.splitlines())
             if len(f) == 3 and f[2].split("@")[0] == "qsort"]
    assert v.libc["qsort"] - libc[0].load_bias == qsort[0]


# -- symbolising -------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("build", ["pie", "nopie"])
def test_debug_info_gives_function_file_line(builds, victim_of, build, tool):
    # GIVEN a running victim built with -g
    exe = builds[build]
    v = victim_of(exe)
    assert v.ret_line == CALL_LINE
    sym = Symbolizer(modules_from_mappings(read_maps(v.pid)), tool=tool)
    # WHEN its entries, a return address and libc's qsort are symbolised
    inner, outer, main, ret, qsort = sym.symbolize(victim_pcs(v))
    values = nm_values(exe)
    # THEN each names its function, file and line; a return address reports its
    # own pc but the line of its call
    for frame, name in ((inner, "sym_inner"), (outer, "sym_outer"), (main, "main")):
        assert (frame.address, frame.function, os.path.basename(frame.file), frame.line, frame.module) == (
            v.fn[name], name, SOURCE, ENTRY_LINES[name], str(exe))
        assert frame.offset == 0
    assert (ret.address, ret.function, os.path.basename(ret.file), ret.line, ret.module) == (
        v.ret, "sym_outer", SOURCE, CALL_LINE, str(exe))
    assert ret.offset == v.ret - v.fn["sym_outer"]
    assert ret.module_offset == values["sym_outer"] + (v.ret - v.fn["sym_outer"])
    assert qsort.function in LIBC_NAMES[tool]
    assert os.path.basename(qsort.module) == "libc.so.6"
    assert qsort.offset == 0


@pytest.mark.parametrize("tool", TOOLS)
def test_symbols_without_debug_info_give_symbol_plus_offset(builds, victim_of, tool):
    # GIVEN a running victim built with -g0 (symbol table, no DWARF)
    exe = builds["nodebug"]
    v = victim_of(exe)
    sym = Symbolizer(modules_from_mappings(read_maps(v.pid)), tool=tool)
    # WHEN the return address inside sym_outer is symbolised
    inner, outer, main, ret, _ = sym.symbolize(victim_pcs(v))
    # THEN it is sym_outer + (ret - entry) with no file or line
    values = nm_values(exe)
    assert (ret.address, ret.function, ret.file, ret.line, ret.module) == (v.ret, "sym_outer", None, None, str(exe))
    assert ret.offset == v.ret - v.fn["sym_outer"]
    assert ret.module_offset == values["sym_outer"] + ret.offset
    assert (inner.function, inner.file, inner.line, inner.offset) == ("sym_inner", None, None, 0)
    assert (main.function, main.offset, main.module_offset) == ("main", 0, values["main"])


@pytest.mark.parametrize("tool", TOOLS)
def test_stripped_binary_gives_module_plus_offset(builds, victim_of, tool):
    # GIVEN a running stripped victim (no symbols at all in the executable)
    v = victim_of(builds["stripped"])
    sym = Symbolizer(modules_from_mappings(read_maps(v.pid)), tool=tool)
    # WHEN its addresses are symbolised
    inner, outer, main, ret, qsort = sym.symbolize(victim_pcs(v))
    # THEN its frames keep the module and the offset the unstripped file's nm gives
    values = nm_values(builds["pie"])  # same code: strip keeps the layout
    for frame, name in ((inner, "sym_inner"), (outer, "sym_outer"), (main, "main")):
        assert (frame.address, frame.function, frame.file, frame.line, frame.offset) == (
            v.fn[name], None, None, None, None)
        assert (frame.module, frame.module_offset) == (str(builds["stripped"]), values[name])
    assert (ret.function, ret.module, ret.module_offset) == (
        None, str(builds["stripped"]), values["sym_outer"] + (v.ret - v.fn["sym_outer"]))
    # and libc, which has symbols, is still named
    assert qsort.function in LIBC_NAMES[tool]


@pytest.mark.parametrize("tool", TOOLS)
def test_stripped_binary_is_named_from_its_debug_file_by_build_id(builds, victim_of, tool, tmp_path):
    # GIVEN a running stripped victim whose debug file (objcopy
    # --only-keep-debug of the unstripped build) is in a debug directory at
    # .build-id/xx/rest.debug, as a -dbgsym package puts it
    exe = builds["stripped"]
    with open(exe, "rb") as f:
        bid = elf.file_build_id(f).hex()
    debug = tmp_path / "debug"
    (debug / ".build-id" / bid[:2]).mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(builds["pie"]),
                    str(debug / ".build-id" / bid[:2] / f"{bid[2:]}.debug")], check=True)
    v = victim_of(exe)
    sym = Symbolizer(modules_from_mappings(read_maps(v.pid)), tool=tool, debug_dirs=[str(debug)])
    # WHEN its entries and a return address are symbolised
    inner, outer, main, ret, _ = sym.symbolize(victim_pcs(v))
    # THEN each names its function, file and line from the debug file
    values = nm_values(builds["pie"])
    for frame, name in ((inner, "sym_inner"), (outer, "sym_outer"), (main, "main")):
        assert (frame.function, os.path.basename(frame.file), frame.line, frame.module, frame.offset) == (
            name, SOURCE, ENTRY_LINES[name], str(exe), 0)
        assert frame.module_offset == values[name]
    assert (ret.function, os.path.basename(ret.file), ret.line, ret.offset) == (
        "sym_outer", SOURCE, CALL_LINE, v.ret - v.fn["sym_outer"])
    assert not [w for w in sym.warnings if str(exe) in w], sym.warnings

    # WHEN code at sym_inner is read with no memory to read it from
    def no_memory(addr: int, n: int) -> bytes:
        raise OSError("not in memory")

    code = read_code(no_memory, sym, v.fn["sym_inner"], 16)
    # THEN it comes from the module's own file (the debug file has no code)
    assert code is not None and code == module_code(str(builds["pie"]), values["sym_inner"], 16)


def test_pc_in_no_module_keeps_its_frame(builds, victim_of):
    # GIVEN the modules of a running victim
    v = victim_of(builds["pie"])
    sym = Symbolizer(modules_from_mappings(read_maps(v.pid)))
    # WHEN addresses in no module are symbolised among good ones
    frames = sym.symbolize([(0x1000, FRAME_CALL), (v.fn["main"], FRAME_ENTRY), (0x10, FRAME_ENTRY)])
    # THEN every frame is there, the strays with nothing but their address
    assert frames[0] == SymbolFrame(0x1000, None, None, None, None, offset=None, module_offset=None)
    assert (frames[1].function, frames[1].line) == ("main", ENTRY_LINES["main"])
    assert frames[2] == SymbolFrame(0x10, None, None, None, None, offset=None, module_offset=None)
    assert isinstance(frames[1], Frame)  # what model.frame_json takes


def test_deleted_module_file_keeps_module_and_offset(builds, victim_of, tmp_path):
    # GIVEN a running victim whose executable was deleted after it started
    exe = tmp_path / "sym_victim-gone"
    shutil.copy2(builds["pie"], exe)
    v = victim_of(exe)
    exe.unlink()
    modules = modules_from_mappings(read_maps(v.pid))
    mod = module_named(modules, exe)
    assert mod.deleted is True
    # WHEN its addresses are symbolised
    (outer,) = Symbolizer(modules).symbolize([(v.fn["sym_outer"], FRAME_ENTRY)])
    # THEN the module and its offset remain, nothing else
    assert (outer.address, outer.function, outer.file, outer.line, outer.module) == (
        v.fn["sym_outer"], None, None, None, str(exe))
    assert outer.module_offset == nm_values(builds["pie"])["sym_outer"]


def test_core_mappings_give_the_same_frames(builds, victim_of, tmp_path):
    # GIVEN a gcore core of a running PIE victim
    if shutil.which("gcore") is None:
        pytest.skip("gcore (gdb) is not installed")
    v = victim_of(builds["pie"])
    prefix = tmp_path / "core"
    done = subprocess.run(["gcore", "-o", str(prefix), str(v.pid)], capture_output=True, text=True, timeout=180)
    core_path = Path(f"{prefix}.{v.pid}")
    assert done.returncode == 0 and core_path.is_file(), done.stderr
    # WHEN the modules come from the core's NT_FILE note
    with Core(str(core_path)) as core:
        modules = modules_from_mappings(core.mappings)
    frames = Symbolizer(modules).symbolize(victim_pcs(v))
    # THEN they are the live process's modules and give the same frames
    assert module_named(modules, builds["pie"]) == module_named(
        modules_from_mappings(read_maps(v.pid)), builds["pie"])
    assert [(f.function, f.line) for f in frames[:4]] == [
        ("sym_inner", ENTRY_LINES["sym_inner"]), ("sym_outer", ENTRY_LINES["sym_outer"]),
        ("main", ENTRY_LINES["main"]), ("sym_outer", CALL_LINE)]


def test_unknown_kind_is_refused(builds, victim_of):
    v = victim_of(builds["pie"])
    sym = Symbolizer(modules_from_mappings(read_maps(v.pid)))
    with pytest.raises(ValueError, match="unknown frame kind 99"):
        sym.symbolize([(v.fn["main"], 99)])


# -- the disk cache ------------------------------------------------------------------


def test_disk_cache_is_private_keyed_by_file_identity(builds, victim_of, tmp_path):
    # GIVEN a victim run from a copy we can later rewrite in place
    exe = tmp_path / "sym_victim-copy"
    shutil.copy2(builds["pie"], exe)
    v = victim_of(exe)
    modules = modules_from_mappings(read_maps(v.pid))
    cache = tmp_path / "cache"
    # WHEN it is symbolised with a cache_dir
    with Symbolizer(modules, cache_dir=cache) as sym:
        first = sym.symbolize(victim_pcs(v))
    db_path = cache / "symbols.sqlite"
    # THEN the cache file is 0600, holds one row per looked-up address, and a
    # new Symbolizer on it gives the same frames
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o600
    with sqlite3.connect(db_path) as db:
        rows = db.execute("SELECT count(*) FROM sym3 WHERE json_extract(source, '$[0]') = ?",
                          (str(exe),)).fetchone()[0]
    assert rows == 4  # sym_inner, sym_outer, main, ret - 1
    with Symbolizer(modules, cache_dir=cache) as sym:
        assert sym.symbolize(victim_pcs(v)) == first
    # WHEN the file is replaced by its stripped build (other size and mtime)
    # (a new inode renamed over it: the running text itself cannot be written)
    shutil.copyfile(builds["stripped"], tmp_path / "new")
    os.replace(tmp_path / "new", exe)
    with Symbolizer(modules, cache_dir=cache) as sym:
        (outer,) = sym.symbolize([(v.fn["sym_outer"], FRAME_ENTRY)])
    # THEN the stale entries are not used
    assert (outer.function, outer.module) == (None, str(exe))


# -- merging ENTRY frames ------------------------------------------------------------


def F(function: str | None, address: int = 0x1000, module: str | None = "/bin/v") -> Frame:
    return Frame(address, function, None, None, module)


@pytest.mark.parametrize(
    ("frames", "kinds", "expected"),
    [
        pytest.param(  # malloc called straight from instrumented f: ENTRY f repeats CALL in f
            [F("f", 1), F("f", 2), F("g", 3), F("main", 4)],
            [FRAME_CALL, FRAME_ENTRY, FRAME_CALL, FRAME_CALL],
            [F("f", 1), F("g", 3), F("main", 4)],
            id="same-function-merged"),
        pytest.param(  # operator new (uninstrumented) called from instrumented f
            [F("operator new(unsigned long)", 1), F("f", 2), F("main", 3)],
            [FRAME_CALL, FRAME_ENTRY, FRAME_CALL],
            [F("operator new(unsigned long)", 1), F("f", 2), F("main", 3)],
            id="uninstrumented-caller-kept"),
        pytest.param(  # unknown functions are never taken to be equal
            [F(None, 1), F(None, 2)], [FRAME_CALL, FRAME_ENTRY], [F(None, 1), F(None, 2)],
            id="unknown-kept"),
        pytest.param(  # same name in two modules is two functions
            [F("init", 1, "/lib/a.so"), F("init", 2, "/bin/v")], [FRAME_CALL, FRAME_ENTRY],
            [F("init", 1, "/lib/a.so"), F("init", 2, "/bin/v")],
            id="other-module-kept"),
        pytest.param(  # an ENTRY with no CALL inside it
            [F("f", 2), F("main", 3)], [FRAME_ENTRY, FRAME_CALL], [F("f", 2), F("main", 3)],
            id="leading-entry-kept"),
        pytest.param([], [], [], id="empty"),
    ],
)
def test_merge_entry_frames(frames, kinds, expected):
    assert merge_entry_frames(frames, kinds) == expected


def test_merge_entry_frames_on_real_frames(builds, victim_of):
    # GIVEN a libtag-shaped stack: CALL ret in sym_outer, ENTRY sym_outer, ENTRY main
    v = victim_of(builds["pie"])
    sym = Symbolizer(modules_from_mappings(read_maps(v.pid)))
    kinds = [FRAME_CALL, FRAME_ENTRY, FRAME_ENTRY]
    frames = sym.symbolize([(v.ret, FRAME_CALL), (v.fn["sym_outer"], FRAME_ENTRY), (v.fn["main"], FRAME_ENTRY)])
    # WHEN merged THEN the ENTRY of sym_outer goes, main (no CALL inside it)
    # stays, without a line: its address gives main's opening line, not the
    # line being executed in it
    assert frames[2].line == ENTRY_LINES["main"]
    assert [(f.function, f.line) for f in merge_entry_frames(frames, kinds)] == [
        ("sym_outer", CALL_LINE), ("main", None)]


def test_merge_entry_frames_needs_one_kind_per_frame():
    with pytest.raises(ValueError, match="2 frames but 1 kinds"):
        merge_entry_frames([F("f"), F("g")], [FRAME_CALL])


def test_a_module_path_that_became_a_fifo_does_not_hang(build_victim, run_cli, tmp_path):
    # GIVEN a core whose executable's path is now a FIFO
    exe = tmp_path / "rev_fifo"
    shutil.copy(build_victim("rev_cases"), exe)
    core, _ = S.zero_block_core(exe, tmp_path)
    exe.unlink()
    os.mkfifo(exe)  # the path the core's NT_FILE note names
    # THEN inspect answers (the module has no symbols) instead of hanging
    done = run_cli("inspect", core, "--json", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 0, done.stderr
