"""Cores of processes that never ran libtag: forensics reads glibc's own heap,
and every answer matches what the victim printed - chunk starts and sizes
exact, states and bins exact, the damaged chunk named, the crash explained.

Victims (built -O2, no libtag; the kernel writes their cores, the soft core
limit raised in the child only):

- tests/victims/glibc_damage.c lays out a chunk in every state (tcache,
  fastbin, unsorted, small and large bin, mmapped, in use), prints each
  pointer, size and state, then: ``overflow`` overruns a block into the
  next chunk's size field and free() aborts; ``double-free`` frees a block
  twice and glibc's tcache check aborts; ``tcache-uaf`` overwrites a freed
  block's tcache next pointer and malloc() aborts.
- tests/victims/glibc_threads.c: four threads allocate and free in their own
  arenas, then main aborts while they are alive.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import forensics_test_support as S
import pytest

SKIP = S.kernel_core_skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

MODES = ("overflow", "double-free", "tcache-uaf")


def chunk_size(request: int) -> int:
    """glibc's request2size on x86_64 (and an mmapped chunk's page rounding)."""
    if request >= 128 * 1024:
        return (request + 8 + 4095) & ~4095
    return max(32, (request + 8 + 15) & ~15)


def expected_bin(state: str, size: int) -> int | None:
    """The bin index glibc files a free chunk of this size under."""
    if state == "tcache":
        return (size - 32 + 15) // 16
    if state == "fastbin":
        return (size >> 4) - 2
    if state == "unsorted":
        return 1
    if state == "smallbin":
        return size >> 4
    if state == "largebin":
        # glibc's bin_index for 1024 <= size < 3072 (the victim's)
        return 48 + (size >> 6)
    return None


@dataclass
class Facts:
    pid: int = 0
    chunks: list[tuple[str, int, int, str]] = field(default_factory=list)  # name, ptr, size, state
    other: dict[str, int] = field(default_factory=dict)
    threads: dict[int, int] = field(default_factory=dict)  # thread number -> tid

    def named(self, name: str) -> tuple[str, int, int, str]:
        (found,) = [c for c in self.chunks if c[0] == name]
        return found


def parse(stdout: str) -> Facts:
    f = Facts()
    for line in stdout.splitlines():
        words = line.split()
        if words[0] == "pid":
            f.pid = int(words[1])
        elif words[0] == "chunk":
            f.chunks.append((words[1], int(words[2], 16), int(words[3]), words[4]))
        elif words[0] == "thread":
            f.threads[int(words[1])] = int(words[2])
        elif len(words) == 2:
            f.other[words[0]] = int(words[1], 16)
    assert f.pid and f.chunks, f"expected pid and chunk lines, got {stdout!r}"
    return f


def _raise_soft_core_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def kernel_core(exe: Path, workdir: Path, *args: str) -> tuple[Path, str, str]:
    """Run exe in workdir, without libtag, until it aborts; (the kernel's
    core, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run([str(exe), *args], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=60, preexec_fn=_raise_soft_core_limit, check=False)
    assert done.returncode == -6, f"expected SIGABRT (-6), got {done.returncode}: {done.stderr}"
    cores = [p for p in workdir.iterdir() if p.name.startswith("core")]
    assert len(cores) == 1, f"expected one core in {workdir}, got {sorted(workdir.iterdir())}"
    return cores[0], done.stdout, done.stderr


@dataclass
class Case:
    mode: str
    exe: Path
    core: Path
    facts: Facts
    stderr: str
    state: Path


@pytest.fixture(scope="module")
def make_case(build_victim, tmp_path_factory):
    """make(mode) -> Case: glibc_damage's core in that mode, made once."""
    made: dict[str, Case] = {}

    def make(mode: str) -> Case:
        if mode not in made:
            exe = build_victim("glibc_damage", instrument=False, extra_flags=("-O2",))
            work = tmp_path_factory.mktemp(f"glibc-{mode}")
            core, out, err = kernel_core(exe, work, mode)
            made[mode] = Case(mode, Path(os.path.realpath(exe)), core, parse(out), err,
                              tmp_path_factory.mktemp("state"))
        return made[mode]

    return make


@pytest.fixture(scope="module", params=MODES)
def case(request, make_case) -> Case:
    return make_case(request.param)


@pytest.fixture(scope="module")
def heap(case):
    """The reader's view of the core, in process (the CLI is checked below)."""
    from forensics.reader.dump import Dump

    with Dump.open(case.core, plain=True) as dump:
        yield dump.glibc


def cli_json(run_cli, case: Case, *args: str) -> tuple[int, dict]:
    result = run_cli(*args, "--json", env={"XDG_STATE_HOME": str(case.state)})
    assert result.returncode in (0, 1), f"expected exit 0 or 1, got {result.returncode}: {result.stderr}"
    return result.returncode, json.loads(result.stdout)


# ------------------------------------------------------------ the heap map --


def test_every_chunk_the_victim_printed_has_its_start_size_state_and_bin(case, heap):
    # GIVEN every block the victim printed, with the state it left its chunk in
    for name, ptr, size, state in case.facts.chunks:
        # WHEN the reader is asked for the chunk of the block's pointer
        c = heap.chunk_at(ptr)
        # THEN it starts 16 bytes below, has glibc's size for the request, and the state
        assert c is not None, f"{name} {ptr:#x}: no chunk"
        if case.mode == "overflow" and name == "b":
            continue  # its size field is the damage: test_overflow_* checks it
        want = (ptr - 16, chunk_size(size), state, expected_bin(state, chunk_size(size)))
        assert (c.start, c.size, c.state, c.bin) == want, f"{name} {ptr:#x} {size}: {c}"


def test_tcache_chunks_belong_to_the_one_thread_and_the_main_arena(case, heap):
    # GIVEN the victim is one thread: the core's only one
    tcached = [heap.chunk_at(p) for name, p, _, st in case.facts.chunks if st == "tcache"
               and not (case.mode == "tcache-uaf" and name == "p")]
    # THEN each tcache chunk is that thread's, in the main arena, which it uses
    assert {(c.thread, c.arena.main, c.arena.threads) for c in tcached} == {
        (case.facts.pid, True, (case.facts.pid,))}
    if case.mode == "tcache-uaf":
        # p is cut off its bin's list: found by its key, whose tcache is not known
        assert heap.chunk_at(case.facts.named("p")[1]).thread is None


def test_inspect_counts_the_heap_and_says_what_is_unknown_without_libtag(case, run_cli, heap):
    # WHEN
    rc, doc = cli_json(run_cli, case, "inspect", str(case.core))
    # THEN the document is a libtag-less one: glibc's map, no stacks or counters
    assert rc == 0
    assert (doc["libtag"], doc["reason"], doc["anomalies"], doc["top_stacks"], doc["counters"]) == (
        False, "crash", [], [], None)
    assert doc["without_libtag"]["hint"] == "run the program under `forensics run` (libtag) to have them"
    g = doc["glibc"]
    assert [a["kind"] for a in g["arenas"]] == ["main"], g["arenas"]
    # the counts are the reader's, and the victim's states are all there
    states = {st for _, _, _, st in case.facts.chunks}
    assert states == {"inuse", "tcache", "fastbin", "unsorted", "smallbin", "largebin", "mmapped"}
    assert states <= set(g["chunks"]), g["chunks"]
    assert g["chunks"]["mmapped"] == {"chunks": 1, "bytes": chunk_size(1 << 20)}
    assert g["chunks"]["fastbin"] == {"chunks": 1, "bytes": 32}
    # the 120-byte guards are the most common size in use
    guards = sum(1 for n, *_ in case.facts.chunks if n == "guard")
    assert g["top_sizes"]["by_count"][0] == {"size": 128, "usable": 120, "chunks": guards,
                                             "bytes": 128 * guards}


def test_whoowns_names_the_chunk_of_a_free_block(case, run_cli):
    # GIVEN the block that went to the large bin
    _, ptr, _, _ = case.facts.named("large")
    # WHEN whoowns asks for a byte inside it
    rc, doc = cli_json(run_cli, case, "whoowns", hex(ptr + 100), "--core", str(case.core))
    # THEN exit 0 and its chunk: start, usable size, state, bin and arena
    assert rc == 0
    c = doc["chunk"]
    assert (doc["owner"], doc["block"], c["start"], c["user"], c["size"], c["usable"], c["offset"],
            c["state"], c["bin_index"], c["arena_kind"], c["arena_threads"]) == (
        "heap", None, hex(ptr - 16), hex(ptr), 2016, 2008, 100, "largebin", 79, "main",
        [case.facts.pid])


def test_whoowns_of_the_mmapped_block(case, run_cli):
    _, ptr, size, _ = case.facts.named("mapped")
    rc, doc = cli_json(run_cli, case, "whoowns", hex(ptr), "--core", str(case.core))
    assert rc == 0
    c = doc["chunk"]
    assert (c["start"], c["size"], c["usable"], c["state"], c["arena"]) == (
        hex(ptr - 16), chunk_size(size), chunk_size(size) - 16, "mmapped", None)


# --------------------------------------------------------------- the damage --


def test_overflow_names_the_chunk_whose_size_was_overwritten(make_case, run_cli):
    case = make_case("overflow")
    assert "free(): invalid next size (normal)" in case.stderr
    b, a, c = case.facts.other["damaged"], case.facts.named("a")[1], case.facts.named("c")[1]
    # WHEN
    rc, doc = cli_json(run_cli, case, "inspect", str(case.core))
    assert rc == 0
    # THEN the one finding is b's size field, exactly what the overrun wrote
    (finding,) = doc["glibc"]["corruption"]
    assert (finding["kind"], finding["chunk"], finding["user"], finding["value"]) == (
        "bad-size", hex(b - 16), hex(b), "0x4141414141414141")
    # and the crash is explained: in free, glibc's message, chunk b named, a as the overrun
    m = doc["crash"]["malloc"]
    assert (m["call"], m["glibc_message"], m["chunk"]["start"], m["chunk"]["state"]) == (
        "free", "free(): invalid next size (normal)", hex(b - 16), "damaged")
    assert f"the block before it, {a:#x} (2008 usable bytes, in use)" in m["summary"], m["summary"]
    # the walk found its way again at c: b's extent is up to c's header
    from forensics.reader.dump import Dump

    with Dump.open(case.core, plain=True) as dump:
        heap = dump.glibc
        assert (heap.chunk_at(b).size, heap.chunk_at(b).raw_size, heap.chunk_at(c).start,
                heap.chunk_at(c).state) == (c - b, 0x4141414141414141, c - 16, "inuse")


def test_double_free_names_the_block_freed_twice(make_case, run_cli):
    case = make_case("double-free")
    assert "free(): double free detected in tcache 2" in case.stderr
    twice = case.facts.other["twice"]
    rc, doc = cli_json(run_cli, case, "inspect", str(case.core))
    assert rc == 0
    m = doc["crash"]["malloc"]
    assert (m["call"], m["glibc_message"], m["chunk"]["user"], m["chunk"]["state"],
            m["chunk"]["bin_index"], m["chunk"]["tcache_thread"]) == (
        "free", "free(): double free detected in tcache 2", hex(twice), "tcache", 3, case.facts.pid)
    assert doc["glibc"]["corruption"] == []


def test_tcache_next_pointer_written_after_free_is_found_and_traced(make_case, run_cli):
    case = make_case("tcache-uaf")
    assert "malloc(): unaligned tcache chunk detected" in case.stderr
    q, p = case.facts.other["damaged"], case.facts.named("p")[1]
    rc, doc = cli_json(run_cli, case, "inspect", str(case.core))
    assert rc == 0
    bad = {f["kind"]: f for f in doc["glibc"]["corruption"]}
    assert sorted(bad) == ["tcache-next", "tcache-orphan"], bad
    # the bin's head demangles to what the victim wrote; it came from q's next pointer
    assert (bad["tcache-next"]["chunk"], bad["tcache-next"]["value"]) == (hex(q - 16), "0x4141414141414141")
    # p, freed before q, is counted in the bin but no list reaches it any more
    assert bad["tcache-orphan"]["chunk"] == hex(p - 16)
    m = doc["crash"]["malloc"]
    assert (m["call"], m["glibc_message"], m["chunk"]["user"], m["chunk"]["state"]) == (
        "malloc", "malloc(): unaligned tcache chunk detected", hex(q), "inuse")


# ---------------------------------------------------------------- threads --


@pytest.fixture(scope="module")
def threads_case(build_victim, tmp_path_factory) -> Case:
    exe = build_victim("glibc_threads", instrument=False, extra_flags=("-O2",))
    work = tmp_path_factory.mktemp("glibc-threads")
    core, out, err = kernel_core(exe, work)
    return Case("threads", exe, core, parse(out), err, tmp_path_factory.mktemp("state"))


def test_each_threads_chunks_are_in_its_own_arena(threads_case):
    from forensics.reader.dump import Dump

    f = threads_case.facts
    assert sorted(f.threads) == [0, 1, 2, 3, 4], f.threads
    with Dump.open(threads_case.core, plain=True) as dump:
        heap = dump.glibc
        arenas = {}
        for i, ptr, size, state in [(int(n), p, s, st) for n, p, s, st in f.chunks]:
            c = heap.chunk_at(ptr)
            # THEN each chunk exact, a tcache one in its thread's tcache
            assert (c.start, c.size, c.state) == (ptr - 16, chunk_size(size), state), (i, hex(ptr), c)
            assert c.thread == (f.threads[i] if state == "tcache" else None), (i, hex(ptr), c)
            arenas.setdefault(i, set()).add(c.arena)
        # and every thread's chunks are in one arena, used by that thread alone
        for i, found in arenas.items():
            (arena,) = found
            assert (arena.main, arena.threads) == (i == 0, (f.threads[i],)), (i, arena)
        assert len({a.address for (a,) in arenas.values()}) == 5
        assert len(heap.arenas) == 5 and heap.findings == []
        # worker 4's arena spans two heap_info heaps, walked oldest first: the
        # first holds the malloc_state (2200 bytes), its chunks 16-aligned after it
        (arena4,) = arenas[4]
        assert len(arena4.heaps) == 2 and arena4.heaps[0][0] == arena4.address + 2208


def test_whoowns_names_a_thread_arena_and_its_thread(threads_case, run_cli):
    f = threads_case.facts
    _, ptr, size, _ = next(c for c in f.chunks if c[0] == "3" and c[3] == "inuse")
    rc, doc = cli_json(run_cli, threads_case, "whoowns", hex(ptr), "--core", str(threads_case.core))
    assert rc == 0
    c = doc["chunk"]
    assert (c["start"], c["size"], c["state"], c["arena_kind"], c["arena_threads"]) == (
        hex(ptr - 16), chunk_size(size), "inuse", "thread", [f.threads[3]])
    assert doc["region"]["name"] == f"heap of thread arena {c['arena']}"


# ------------------------------------------------------------ the layout --


def test_the_built_in_table_agrees_with_the_debug_file():
    """The table entry of this machine's libc, derived from its debug file,
    still says what the debug file says."""
    from forensics.core import elf
    from forensics.reader import glibc_layout as G

    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    with open(libc, "rb") as f:
        bid = elf.image_build_id(elf.file_reader(f))
    if bid is None or bid.hex() not in G.KNOWN_BUILDS:
        pytest.skip(f"{libc} is not a build in the table")
    debug = G._debug_file(bid, ())
    if debug is None:
        pytest.skip("no debug file for it (apt-get install libc6-dbg)")
    version, _ = G._libc_file_facts(libc, bid)
    from_debug = G.layout_from_debug(debug, libc, version)
    table = G.KNOWN_BUILDS[bid.hex()]
    from dataclasses import replace

    assert replace(from_debug, source=table.source) == table


def test_the_built_in_table_reads_a_core_as_the_debug_file_does(make_case):
    """Without a debug file the table's layout is used: on a real core it
    gives the same chunks, states, bins and findings."""
    import numpy as np

    from forensics.reader import glibc_layout as G
    from forensics.reader.dump import Dump
    from forensics.reader.glibc_walk import GlibcHeap

    case = make_case("tcache-uaf")
    with Dump.open(case.core, plain=True) as dump:
        heap = dump.glibc
        lay = heap.layout
        if lay.build_id not in G.KNOWN_BUILDS:
            pytest.skip(f"the core's libc {lay.build_id} is not a build in the table")
        table = G.KNOWN_BUILDS[lay.build_id].at(lay.libc_base, lay.libc_path, lay.build_id)
        fs = {t.tid: t.regs["fs_base"] for t in dump.threads}
        other = GlibcHeap(dump.mem, table, threads=fs)
        assert [f.message for f in other.findings] == [f.message for f in heap.findings]
        for name in ("start", "size", "state", "bin", "thread", "arena_ix"):
            assert np.array_equal(getattr(other, name), getattr(heap, name)), name


# --------------------------------------------------------- a real program --

MALLINFO_PROBE = r'''
import ctypes, os, signal
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                              "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MI2
junk = [bytearray(1000 + i) for i in range(2000)]   # malloc'd: the arena
big = bytearray(1 << 21)                            # mmapped
mi = libc.mallinfo2()
os.write(1, b"mallinfo2 %d %d %d %d\n" % (mi.arena, mi.uordblks, mi.hblks, mi.hblkhd))
os.kill(os.getpid(), signal.SIGABRT)
'''


def test_python3s_heap_agrees_with_its_own_mallinfo2(tmp_path):
    """Debian's python3, killed with SIGABRT right after printing glibc's
    mallinfo2(): the heap map's bytes in use (chunks in use and in tcaches:
    mallinfo counts those as allocated), its mmapped chunks and its arena
    bytes are glibc's own figures.  Nothing is malloc'd in between: the
    line is written with os.write, its small objects come from Python's
    own allocator."""
    import numpy as np

    from forensics.reader.dump import Dump
    from forensics.reader.glibc_walk import S as STATE

    python = "/usr/bin/python3"
    if not os.path.exists(python):
        pytest.skip(f"no {python}")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("PYTHON")}
    done = subprocess.run([python, "-c", MALLINFO_PROBE], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60, preexec_fn=_raise_soft_core_limit, check=False)
    assert done.returncode == -6, f"expected SIGABRT, got {done.returncode}: {done.stderr}"
    arena, uordblks, hblks, hblkhd = map(int, done.stdout.split()[1:])
    (core,) = [p for p in tmp_path.iterdir() if p.name.startswith("core")]
    with Dump.open(core, plain=True) as dump:
        heap = dump.glibc
        held = np.isin(heap.state, [STATE["inuse"], STATE["tcache"]])
        mapped = heap.state == STATE["mmapped"]
        assert (int(heap.size[held].sum()), int(mapped.sum()), int(heap.size[mapped].sum()),
                sum(a.system_mem for a in heap.arenas)) == (uordblks, hblks, hblkhd, arena)
        assert heap.findings == [] and heap.warnings == []
