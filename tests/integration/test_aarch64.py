"""The aarch64 subset: plain (no libtag) aarch64 programs, cross-compiled
here with Debian's aarch64-linux-gnu-gcc and run under qemu-aarch64-static
(qemu-user writes their cores: ``qemu_PROG_DATE_PID.core`` in the working
directory), read by forensics on this x86_64 machine as it reads an x86_64
core - and compared with gdb-multiarch.

- glibc_damage (tests/victims/glibc_damage.c, -O2, a PIE): the three
  damages glibc's checks abort on; inspect explains each crash in malloc or
  free as on x86_64 (tests/integration/test_glibc_heap.py), whoowns names a
  chunk, its bin and its arena.
- a64_worker (tests/victims/a64_worker.c, -O2, not a PIE so that gdb can
  place it: qemu dumps no read-only code, and gdb finds a PIE's load
  address only from its first page): a write through a null pointer three
  calls deep in a worker thread; the stack is gdb-multiarch's ``bt``; with
  ``-mbranch-protection=standard`` under ``qemu -cpu max`` the saved return
  addresses are signed (PAC) and the stack is the same, stripped.

What qemu-user cannot do that a kernel does (docs/aarch64.md): its cores
hold no NT_FILE, NT_SIGINFO, NT_ARM_TLS or read-only code (the reader finds
modules from the loader's list under --sysroot, and thread pointers from
glibc's descriptors); ptrace stops the emulator, with its x86_64
registers, not the program, so `forensics snapshot --ptrace` and
`forensics attach` stay tested on x86_64.

libtag cross-built for aarch64 and preloaded (its sections below say what
qemu changes there): the malloc family's semantics; a double free's three
stacks and a guarded use-after-free in an -O2 C++ program with PAC; leaks
at exit and whoowns; then x86_64's own victims, cross-compiled: eight
threads' exact counters and tags (lt_threads), every other anomaly kind
with its stacks (snap_anomaly, heap_damage, mismatch), the crash hook's
core of an -O2 worker thread against gdb-multiarch's bt (uw_crash), a
running process snapshot by `forensics snapshot PID` with its threads and
every printed block (heap_threads), the tag commands in gdb-multiarch, and
retention paths with and without libtag (slab_chain).

Each test skips, saying which, when the cross compiler, qemu-aarch64-static
or the aarch64 libc is not installed (.ci/run installs them).
"""

from __future__ import annotations

import json
import os
import re
import resource
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import forensics_test_support as S
from forensics import libpath

VICTIMS = Path(__file__).resolve().parents[1] / "victims"
SYSROOT = "/usr/aarch64-linux-gnu"
CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64-static"


def _missing() -> str | None:
    for tool, pkg in ((CC, "gcc-aarch64-linux-gnu"), (QEMU, "qemu-user-static")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {pkg})"
    if not os.path.isfile(f"{SYSROOT}/lib/libc.so.6"):
        return f"no aarch64 libc at {SYSROOT} (apt-get install libc6-dev-arm64-cross)"
    return None


SKIP = _missing()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def _raise_soft_core_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def cross_build(out: Path, name: str, *flags: str) -> Path:
    exe = out / f"{name}{'-'.join(['', *[re.sub(r'[^a-z0-9]', '', f) for f in flags]])}"
    cmd = [CC, "-g", "-pthread", *flags, "-o", str(exe), str(VICTIMS / f"{name}.c")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"$ {' '.join(cmd)}\n{done.stderr}"
    return exe


def qemu_core(exe: Path, work: Path, *args: str, cpu: str | None = None,
              signal: int = 6) -> tuple[Path, str, str]:
    """Run exe under qemu-aarch64-static in work until it dies of signal;
    (qemu's core of it, stdout, stderr).  qemu-user also dumps itself (an
    x86_64 core) after writing the program's: a directory named ``core``
    in work - this machine's core_pattern - keeps that one from being
    written (the kernel cannot create it), without touching any setting."""
    (work / "core").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    cmd = [QEMU, *(["-cpu", cpu] if cpu else []), "-L", SYSROOT, str(exe), *args]
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=_raise_soft_core_limit, check=False)
    assert done.returncode == -signal, f"expected signal {signal}, got {done.returncode}: {done.stderr}"
    (core,) = [p for p in work.iterdir() if p.name.startswith("qemu_") and p.name.endswith(".core")]
    os.chmod(core, 0o600)  # qemu writes it 0644; cores hold secrets
    return core, done.stdout, done.stderr


def facts(stdout: str) -> tuple[dict[str, int], dict[str, tuple[int, int, str]]]:
    """({word: value} of the two-word lines, {chunk name: (ptr, size, state)})."""
    other, chunks = {}, {}
    for line in stdout.splitlines():
        w = line.split()
        if w and w[0] == "chunk":
            chunks[w[1]] = (int(w[2], 16), int(w[3]), w[4])
        elif len(w) == 2:
            other[w[0]] = int(w[1], 0)
    return other, chunks


def cli_json(run_cli, tmp: Path, *args: str) -> dict:
    done = run_cli(*args, "--sysroot", SYSROOT, "--json", env={"XDG_STATE_HOME": str(tmp)}, timeout=300)
    assert done.returncode in (0, 1), f"exit {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


@dataclass
class Case:
    core: Path
    out: str
    err: str
    other: dict
    chunks: dict


@pytest.fixture(scope="module")
def damage(tmp_path_factory):
    made: dict[str, Case] = {}
    exe = None

    def make(mode: str) -> Case:
        nonlocal exe
        if exe is None:
            exe = cross_build(tmp_path_factory.mktemp("a64"), "glibc_damage", "-O2")
        if mode not in made:
            core, out, err = qemu_core(exe, tmp_path_factory.mktemp(f"a64-{mode}"), mode)
            made[mode] = Case(core, out, err, *facts(out))
        return made[mode]

    return make


# ----------------------------------------------------- glibc's heap, damaged --


def test_the_core_is_an_aarch64_one_read_with_its_registers(damage):
    from forensics.core import Core

    case = damage("overflow")
    with Core.open(case.core) as core:
        (t,) = core.threads
        assert (core.arch.name, t.tid, core.siginfo.signo, set(t.regs) >= {"x29", "x30", "sp", "pc"}) == (
            "aarch64", case.other["pid"], 6, True)


def test_overflow_in_free_is_explained_as_on_x86_64(damage, run_cli, tmp_path):
    case = damage("overflow")
    assert "free(): invalid next size (normal)" in case.err
    b, a = case.other["damaged"], case.chunks["a"][0]
    doc = cli_json(run_cli, tmp_path, "inspect", str(case.core))
    (finding,) = doc["glibc"]["corruption"]
    assert (finding["kind"], finding["chunk"], finding["user"], finding["value"]) == (
        "bad-size", hex(b - 16), hex(b), "0x4141414141414141")
    m = doc["crash"]["malloc"]
    assert (m["call"], m["glibc_message"], m["chunk"]["start"], m["chunk"]["state"]) == (
        "free", "free(): invalid next size (normal)", hex(b - 16), "damaged")
    assert f"the block before it, {a:#x} (2008 usable bytes, in use)" in m["summary"], m["summary"]
    # the victim's own frame is on the crash stack, with its line
    main = [f for f in doc["crash"]["stack"] if f["function"] == "main"]
    assert main and main[0]["file"].endswith("glibc_damage.c"), doc["crash"]["stack"]


def test_double_free_names_the_block_and_its_tcache_thread(damage, run_cli, tmp_path):
    case = damage("double-free")
    assert "free(): double free detected in tcache 2" in case.err
    doc = cli_json(run_cli, tmp_path, "inspect", str(case.core))
    m = doc["crash"]["malloc"]
    # tcache_thread: the thread whose tcache holds it, found through the
    # thread pointer qemu's core does not hold (reader/threadptr.py)
    assert (m["call"], m["chunk"]["user"], m["chunk"]["state"], m["chunk"]["bin_index"],
            m["chunk"]["tcache_thread"]) == ("free", hex(case.other["twice"]), "tcache", 3, case.other["pid"])


def test_tcache_next_pointer_written_after_free_is_found(damage, run_cli, tmp_path):
    case = damage("tcache-uaf")
    assert "malloc(): unaligned tcache chunk detected" in case.err
    q, p = case.other["damaged"], case.chunks["p"][0]
    doc = cli_json(run_cli, tmp_path, "inspect", str(case.core))
    bad = {f["kind"]: f for f in doc["glibc"]["corruption"]}
    assert sorted(bad) == ["tcache-next", "tcache-orphan"], bad
    assert (bad["tcache-next"]["chunk"], bad["tcache-next"]["value"], bad["tcache-orphan"]["chunk"]) == (
        hex(q - 16), "0x4141414141414141", hex(p - 16))
    m = doc["crash"]["malloc"]
    assert (m["call"], m["glibc_message"], m["chunk"]["user"]) == (
        "malloc", "malloc(): unaligned tcache chunk detected", hex(q))


def test_every_chunk_has_its_state_and_whoowns_names_the_large_one(damage, run_cli, tmp_path):
    from forensics.reader.dump import Dump
    from forensics.reader.symbols import SymbolOptions

    case = damage("double-free")
    with Dump.open(case.core, plain=True, symbols=SymbolOptions((), SYSROOT)) as dump:
        heap = dump.glibc
        got = {n: (heap.chunk_at(p).start, heap.chunk_at(p).state) for n, (p, _, _) in case.chunks.items()}
    assert got == {n: (p - 16, st) for n, (p, _, st) in case.chunks.items()}
    ptr = case.chunks["large"][0]
    doc = cli_json(run_cli, tmp_path, "whoowns", hex(ptr + 100), "--core", str(case.core))
    c = doc["chunk"]
    assert (doc["owner"], c["start"], c["size"], c["usable"], c["offset"], c["state"], c["bin_index"],
            c["arena_kind"], c["arena_threads"]) == (
        "heap", hex(ptr - 16), 2016, 2008, 100, "largebin", 79, "main", [case.other["pid"]])


# -------------------------------------------- a worker thread's -O2 crash --


def gdb_bt(exe: Path, core: Path) -> list[str]:
    """The function of each frame of gdb-multiarch's bt, innermost first."""
    done = subprocess.run(["gdb-multiarch", "-nx", "-q", "-batch", "-ex", f"set sysroot {SYSROOT}",
                           "-ex", "bt", str(exe), str(core)], capture_output=True, text=True, timeout=120)
    bt = done.stdout[done.stdout.rindex("#0 "):]  # gdb prints frame 0 once on loading the core
    return re.findall(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+) \(", bt, re.M)


@pytest.fixture(scope="module", params=[(), ("-mbranch-protection=standard",)], ids=["plain", "pac"])
def worker(request, tmp_path_factory):
    flags = request.param
    exe = cross_build(tmp_path_factory.mktemp("a64w"), "a64_worker", "-O2", "-no-pie", *flags)
    core, out, _ = qemu_core(exe, tmp_path_factory.mktemp("a64w-run"), cpu="max" if flags else None,
                             signal=11)
    return exe, core, facts(out)[0], bool(flags)


def test_the_worker_threads_stack_is_gdbs(worker, run_cli, tmp_path):
    exe, core, other, pac = worker
    doc = cli_json(run_cli, tmp_path, "inspect", str(core))
    crash = doc["crash"]
    assert (crash["signal"], crash["thread"]) == ("SIGSEGV", other["thread"])
    ours = [f["function"] for f in crash["stack"]]
    assert ours[:4] == ["crash_here", "middle", "outer", "worker"], ours
    theirs = gdb_bt(exe, core) if shutil.which("gdb-multiarch") else []
    if not pac:
        # gdb's bt, frame for frame (gdb's "??" is a frame in libc's
        # stripped code, which forensics gives as module+offset)
        assert theirs == [f or "??" for f in ours], (theirs, ours)
    else:
        # gdb-multiarch stops at the first signed return address of a core
        # that has no PAC mask note (qemu writes none): forensics goes on
        assert theirs[:2] == ours[:2], (theirs, ours)


def test_pac_signed_return_addresses_are_stripped(worker):
    from forensics.reader.dump import Dump
    from forensics.reader.symbols import SymbolOptions

    exe, core, other, pac = worker
    with Dump.open(core, plain=True, symbols=SymbolOptions((), SYSROOT)) as dump:
        t = dump.thread(other["thread"])
        steps = dump.thread_steps(t)
        pcs = {s.pc for s in steps}
        mask = dump.unwinder.ptr_mask
        # the stack holds signed words whose address part is a frame's pc
        raw = dump.mem.read(t.sp, 512)
        words = [int.from_bytes(raw[i:i + 8], "little") for i in range(0, 512, 8)]
        signed = [w for w in words if w & ~mask and (w & mask) in pcs]
    if pac:
        assert signed, f"no PAC-signed return address on the stack (mask {mask:#x})"
    else:  # the unsigned build: every return address is plain
        assert signed == [], [hex(w) for w in signed]


def test_whoowns_names_main_arenas_and_the_worker_arenas_blocks(worker, run_cli, tmp_path):
    exe, core, other, _ = worker
    doc = cli_json(run_cli, tmp_path, "whoowns", hex(other["held"] + 8), "--core", str(core))
    c = doc["chunk"]
    assert (c["user"], c["size"], c["state"], c["arena_kind"]) == (hex(other["held"]), 4016, "inuse", "main")
    doc = cli_json(run_cli, tmp_path, "whoowns", hex(other["worker"]), "--core", str(core))
    c = doc["chunk"]
    assert (c["user"], c["size"], c["state"], c["arena_kind"], c["arena_threads"]) == (
        hex(other["worker"]), 208, "inuse", "thread", [other["thread"]])


# ------------------------------------------- libtag, cross-built, preloaded --
# build/aarch64/libtag/libtag.so (.ci/run builds it:
#   cmake -S . -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake)
# or FORENSICS_LIBTAG_AARCH64.  The victim runs through the aarch64 loader
# with no -L: qemu's -L prefix also redirects every absolute path the
# program opens (libtag's snapshot directory would land in the sysroot),
# so the modules' paths in libtag's cores are real ones, read without
# --sysroot.  Under qemu-user:
# - libtag writes its cores itself (LIBTAG_CORE=self): a fork child's
#   abort is dumped by qemu under its own name, not as core_pattern's;
# - RLIMIT_AS is capped at 16 GiB, so libtag reserves a 4 GiB heap region,
#   not its 1 TiB: qemu tracks every guest page of a reservation, which
#   takes it ~8 s for 1 TiB and as long to unmap (a kernel takes no time);
# - the snapshot's fork child is a SIGCHLD child (qemu refuses others).
# The shadow stack's cases (-finstrument-functions) are test_aarch64_shadow.py's.
ROOT = Path(__file__).resolve().parents[2]
LOADER = f"{SYSROOT}/lib/ld-linux-aarch64.so.1"
CXX = "aarch64-linux-gnu-g++"


def _libtag_a64() -> Path:
    return Path(os.environ.get("FORENSICS_LIBTAG_AARCH64") or ROOT / "build/aarch64/libtag/libtag.so")


def _libtag_missing() -> str | None:
    if shutil.which(CXX) is None:
        return f"{CXX} is not installed (apt-get install g++-aarch64-linux-gnu)"
    if not _libtag_a64().is_file():
        return (f"no aarch64 libtag at {_libtag_a64()}: cmake -S . -B build/aarch64 "
                "-DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake && cmake --build build/aarch64")
    return None


def _cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, resource.RLIM_INFINITY))


def lines_of(src: Path) -> dict[str, int]:
    """{name: line} of the source's ``// LINE name`` markers."""
    return {m.group(1): src.read_text().count("\n", 0, m.start()) + 1
            for m in re.finditer(r"// LINE ([a-z-]+)", src.read_text())}


def _a64_command(exe: Path, work: Path, args, libtag: bool, pac: bool,
                 env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of exe ARGS under qemu: a64_run's."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("LIBTAG_") and k != "LD_PRELOAD"}
    if libtag:
        (work / "snaps").mkdir(mode=0o700, exist_ok=True)
        # guarded sampling off unless asked, as conftest.py sets it for every
        # x86_64 victim: a block it picks at random is caught by its guard
        # page, not where the test looks (lt_threads' tag checks missed one
        # guarded block of 400 in most runs)
        e.update(LD_PRELOAD=str(_libtag_a64()), LIBTAG_DIR=str(work / "snaps"), LIBTAG_CORE="self",
                 LIBTAG_GUARD_RATE="0")
    e.update(env)
    cmd = [QEMU, *(["-cpu", "max"] if pac else []), LOADER, "--library-path", f"{SYSROOT}/lib",
           str(exe), *args]
    return cmd, e


def a64_run(exe: Path, work: Path, *args: str, libtag: bool = True, pac: bool = False,
            **env: str) -> subprocess.CompletedProcess:
    """exe under qemu (``-cpu max`` where pac), through the aarch64 loader,
    libtag preloaded (where libtag) with its snapshots in work/snaps."""
    cmd, e = _a64_command(exe, work, args, libtag, pac, env)
    return subprocess.run(cmd, cwd=work, env=e, capture_output=True, text=True, timeout=180,
                          preexec_fn=_cap_address_space, check=False)


def only_core(work: Path, reason: str) -> Path:
    """The core of the one snapshot in work/snaps, once it is complete: the
    fork child of an anomaly's or an on-demand snapshot may still be
    writing it when the program has exited."""
    from forensics.snapshots import snapdir

    (d,) = list((work / "snaps").iterdir())
    assert d.name.endswith(f"-1-{reason}"), d.name
    snapdir.wait_complete(d, 120)
    return d / "core"


def frames(stack: list[dict]) -> list[tuple[str | None, int | None]]:
    return [(f["function"], f["line"]) for f in stack]


@pytest.fixture(scope="module")
def lt_victim(tmp_path_factory):
    """a64_libtag.cc at -O2 with -mbranch-protection=standard (PAC), and
    its LINE markers."""
    if (why := _libtag_missing()):
        pytest.skip(why)
    src = VICTIMS / "a64_libtag.cc"
    exe = tmp_path_factory.mktemp("a64lt") / "a64_libtag"
    cmd = [CXX, "-O2", "-g", "-mbranch-protection=standard", "-o", str(exe), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return exe, lines_of(src)


def test_libtag_keeps_the_malloc_familys_semantics(tmp_path):
    # GIVEN lt_semantics (every malloc-family edge case, printed), built for aarch64
    if (why := _libtag_missing()):
        pytest.skip(why)
    exe = cross_build(tmp_path, "lt_semantics", "-O2")
    # WHEN run under qemu with and without libtag
    plain = a64_run(exe, tmp_path, libtag=False)
    tagged = a64_run(exe, tmp_path)
    assert plain.returncode == tagged.returncode == 0, (plain.stderr, tagged.stderr)

    # THEN every line but the "usable" ones (glibc rounds up) is the same
    def kept(out: str) -> list[str]:
        return [line for line in out.splitlines() if not line.startswith("usable ")]

    assert kept(tagged.stdout) == kept(plain.stdout)
    assert len(kept(plain.stdout)) > 50, plain.stdout


def test_libtag_names_a_double_frees_three_stacks_with_pac(lt_victim, run_cli, tmp_path):
    # GIVEN the -O2 C++ victim with signed return addresses, under -cpu max
    exe, line = lt_victim
    # WHEN it deletes a block twice (libtag snapshots and lets it run on)
    run = a64_run(exe, tmp_path, "double-free", pac=True)
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "survived", run.stderr
    other, _ = facts(run.stdout)
    doc = cli_json_plain(run_cli, tmp_path, "inspect", str(only_core(tmp_path, "double-free")))
    # THEN libtag's own aarch64 core names the block and its three stacks,
    # each a function and line of the victim, then main
    [a] = doc["anomalies"]
    b = a["block"]
    assert (a["kind"], a["thread"], int(b["start"], 16), b["size"], b["alloc_kind"]) == (
        "double-free", other["pid"], other["block"], 48, "new")
    assert frames(b["alloc_stack"])[:1] == [("make_node(long)", line["alloc"])], b["alloc_stack"]
    assert frames(b["free_stack"])[:1] == [("retire(Node*)", line["free"])], b["free_stack"]
    assert frames(a["stack"])[:1] == [("retire_again(Node*)", line["free-again"])], a["stack"]
    for stack in (b["alloc_stack"], b["free_stack"], a["stack"]):
        assert stack[1]["function"] == "main", stack


def test_libtag_catches_a_guarded_use_after_free_at_the_instruction(lt_victim, run_cli, tmp_path):
    # GIVEN every block guarded
    exe, line = lt_victim
    # WHEN the victim reads a deleted object in a leaf function (its return
    # address only in x30)
    run = a64_run(exe, tmp_path, "uaf", pac=True, LIBTAG_GUARD_RATE="1")
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "survived", run.stderr
    other, _ = facts(run.stdout)
    # ... reading libtag's free pattern (the slot was opened for it)
    assert other["value"] == 0xfd
    doc = cli_json_plain(run_cli, tmp_path, "inspect", str(only_core(tmp_path, "use-after-free")))
    # THEN the fault is a read at the block, at the instruction, in the leaf,
    # then its caller
    [a] = doc["anomalies"]
    assert (a["kind"], a["access"], int(a["address"], 16), a["block"]["guarded"], a["block"]["state"]) == (
        "use-after-free", "read", other["block"], True, "freed")
    assert (frames(a["stack"])[0], a["stack"][1]["function"]) == (
        ("peek(Node const*)", line["peek"]), "main"), a["stack"]
    assert a["pc"] == a["stack"][0]["address"]
    assert frames(a["block"]["free_stack"])[:1] == [("retire(Node*)", line["free"])]


def test_libtag_finds_the_leaks_at_exit_and_whoowns_the_kept_block(lt_victim, run_cli, tmp_path):
    # GIVEN a snapshot at exit
    exe, line = lt_victim
    run = a64_run(exe, tmp_path, "leak", LIBTAG_AT_EXIT="snapshot")
    assert run.returncode == 0, run.stderr
    lost = [int(w.split()[1], 16) for w in run.stdout.splitlines() if w.startswith("lost ")]
    kept = int(run.stdout.split("kept ")[1].split()[0], 16)
    core = only_core(tmp_path, "exit")
    # WHEN forensics looks for leaks
    doc = cli_json_plain(run_cli, tmp_path, "inspect", str(core), "--leaks")
    # THEN the three lost blocks are one definite leak of lose(), 303 bytes
    [leak] = [x for x in doc["leaks"] if x["kind"] == "definite"]
    assert (leak["blocks"], leak["bytes"], frames(leak["stack"])[0]) == (
        3, 100 + 101 + 102, ("lose(unsigned long)", line["lose"])), leak
    assert sorted(int(x, 16) for x in leak["examples"]) == sorted(lost)
    # ... and whoowns names the reachable one, live, from lose()
    who = cli_json_plain(run_cli, tmp_path, "whoowns", hex(kept + 8), "--core", str(core))
    assert (who["owner"], int(who["block"]["start"], 16), who["block"]["size"], who["block"]["offset"],
            who["block"]["state"], frames(who["block"]["alloc_stack"])[0]) == (
        "heap", kept, 200, 8, "live", ("lose(unsigned long)", line["lose"]))


def cli_json_plain(run_cli, tmp: Path, *args: str) -> dict:
    """forensics --json on a core whose modules have their real paths."""
    done = run_cli(*args, "--json", env={"XDG_STATE_HOME": str(tmp)}, timeout=300)
    assert done.returncode in (0, 1), f"exit {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


# ------------------------------------- libtag under qemu: x86_64's victims --
# The victims of the x86_64 tests, cross-compiled as build_victim builds
# them (-O1 -fno-omit-frame-pointer, libtag's headers; without
# -finstrument-functions: test_aarch64_shadow.py has the shadow stack's
# cases), preloaded with the aarch64 libtag, and asked the same.

@pytest.fixture(scope="module")
def a64_victim(tmp_path_factory):
    """build(name, *flags, cxx=False) -> the realpath of tests/victims/<name>.c
    (.cc) cross-compiled, once per module for each set of flags."""
    if (why := _libtag_missing()):
        pytest.skip(why)
    out = tmp_path_factory.mktemp("a64v")
    built: dict[tuple, Path] = {}

    def build(name: str, *flags: str, cxx: bool = False) -> Path:
        if (name, flags) not in built:
            exe = out / f"{name}-{len(built)}"
            cmd = [CXX if cxx else CC, "-g", "-O1", "-pthread", "-fno-omit-frame-pointer",
                   f"-I{libpath.include_dir()}", *flags, "-o", str(exe), str(VICTIMS / f"{name}.{'cc' if cxx else 'c'}")]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"$ {' '.join(cmd)}\n{done.stderr}"
            built[name, flags] = Path(os.path.realpath(exe))
        return built[name, flags]

    return build


def kv(stdout: str) -> dict[str, str]:
    """The victim's key=value lines."""
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def in_exe(stack: list[dict], exe: Path) -> list[str]:
    """The victim's own functions of a stack, innermost first, through main
    (test_heap_damage's functions())."""
    names = [f["function"] for f in stack if f["module"] == str(exe)]
    return names[:names.index("main") + 1] if "main" in names else names


def libtag_stats(stderr: str) -> dict[str, str]:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("libtag: stats "))
    return dict(w.split("=", 1) for w in line.split()[2:])


def test_libtag_threads_keep_exact_counters_and_tags(a64_victim, tmp_path):
    # GIVEN lt_threads: 8 threads churning malloc/calloc/realloc/free, with
    # frees of each other's blocks, counting what they did themselves
    exe = a64_victim("lt_threads")
    # WHEN it runs under qemu with libtag
    run = a64_run(exe, tmp_path, LIBTAG_QUIET="1")
    assert run.returncode == 0, run.stderr
    pairs = {m["key"]: (int(m["got"]), int(m["want"])) for m in
             re.finditer(r"^(?P<key>.*) got=(?P<got>-?\d+) want=(?P<want>-?\d+)$", run.stdout, re.M)}
    lines = run.stdout.splitlines()
    # THEN each thread's record holds exactly what the thread counted, its
    # kept blocks carry its tid, and the frees it made for its neighbour
    # are recorded as freed by it, allocated by them (test_libtag_threads.py)
    for i in range(8):
        for field in ("allocs", "frees", "alloc_bytes", "free_bytes"):
            got, want = pairs[f"thread {i} {field}"]
            assert got == want, (i, field, got, want)
        assert pairs[f"thread {i} allocs"][1] - pairs[f"thread {i} frees"][1] == 50
        assert f"thread {i} exited=1" in lines
        assert f"thread {i} handoff freed_ok=200 want=200" in lines
        assert f"thread {i} kept tags_ok=50 content_ok=50 want=50" in lines
    for key in ("total allocs", "total frees", "total live_blocks", "total live_bytes"):
        got, want = pairs[key]
        assert got == want, key
    assert (pairs["total workers_live_blocks"], pairs["threads_new"], pairs["anomalies"]) == (
        (400, 400), (8, 8), (0, 0))


# ---------------------------------------------------------- every anomaly --
# double-free and a guarded use-after-free are a64_libtag's (above); here
# the others, each with the stacks the x86_64 tests assert.


def anomaly_run(exe: Path, work: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """exe ARGS with LIBTAG_ON_ANOMALY=snapshot: it runs on to "survived",
    leaving one anomaly snapshot; (the run, that anomaly's document)."""
    run = a64_run(exe, work, *args, LIBTAG_ON_ANOMALY="snapshot", LIBTAG_QUARANTINE="4096",
                  LIBTAG_STATS="1")
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "survived", (run.stdout, run.stderr)
    (d,) = list((work / "snaps").iterdir())
    kind = d.name.split("-1-", 1)[1]
    done = subprocess.run([sys.executable, "-m", "forensics", "inspect", str(only_core(work, kind)), "--json"],
                          cwd=work, env={**os.environ, "XDG_STATE_HOME": str(work / "state")},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    [a] = doc["anomalies"]
    assert (a["kind"], doc["counters"]["anomalies"], libtag_stats(run.stderr)["anomalies"]) == (kind, 1, "1")
    return run, {**a, "pid": doc["process"]["pid"]}


@pytest.mark.parametrize("case", ["invalid-free-stack", "invalid-free-interior"])
def test_invalid_free_names_the_pointer_and_the_freeing_stack(case, a64_victim, tmp_path):
    # GIVEN free() of a stack address, and of a pointer 32 bytes into a block
    exe = a64_victim("snap_anomaly")
    run, a = anomaly_run(exe, tmp_path, case)
    address, fn = int(kv(run.stdout)["address"], 16), f"do_{case.replace('-', '_')}"
    # THEN one invalid-free of exactly that pointer, by main, detected in
    # the function that called free()
    assert (a["kind"], int(a["address"], 16), a["thread"]) == ("invalid-free", address, a["pid"])
    assert in_exe(a["stack"], exe) == [fn, "main"], a["stack"]
    # ... inside no block, or 32 bytes into the live 128-byte block it
    # allocated itself
    b = a["block"]
    if case == "invalid-free-stack":
        assert b is None, b
    else:
        assert (int(b["start"], 16), b["size"], b["offset"], b["state"], b["thread"]) == (
            address - 32, 128, 32, "live", a["pid"])
        assert in_exe(b["alloc_stack"], exe) == [fn, "main"], b["alloc_stack"]


def test_heap_overflow_into_the_next_block_is_the_block_befores(a64_victim, tmp_path):
    # GIVEN 100 bytes written past a 64-byte block, over the next block's tag
    exe = a64_victim("heap_damage")
    run, a = anomaly_run(exe, tmp_path, "overflow-neighbour", "p-first")
    f = kv(run.stdout)
    block, tid = int(f["block"], 16), int(f["tid"])
    # THEN a heap-overflow at its first byte past the end, the bytes written,
    # the block's allocation stack and the free that found it
    assert (a["kind"], int(a["address"], 16), a["offset"], a["written"]) == (
        "heap-overflow", block + 64, 64, S.overwritten(f["written"], 0x42).hex())
    b = a["block"]
    assert (int(b["start"], 16), b["size"], b["thread"]) == (block, 64, tid)
    assert in_exe(b["alloc_stack"], exe) == ["alloc_victim", "main"], b["alloc_stack"]
    assert in_exe(a["stack"], exe) == ["free_victim", "main"], a["stack"]
    # ... and neither block went back to the heap
    assert libtag_stats(run.stderr)["damaged_leaked"] == "2", run.stderr


def test_heap_underflow_is_the_byte_before_the_block(a64_victim, tmp_path):
    # GIVEN p[-1] = 0x41 on a live 40-byte block, then free(p)
    exe = a64_victim("heap_damage")
    run, a = anomaly_run(exe, tmp_path, "underflow")
    f = kv(run.stdout)
    block, tid = int(f["block"], 16), int(f["tid"])
    # THEN a heap-underflow at p - 1, found by that free
    assert (a["kind"], int(a["address"], 16), a["offset"], a["written"], a["thread"]) == (
        "heap-underflow", block - 1, -1, "41", tid)
    b = a["block"]
    assert (int(b["start"], 16), b["size"], b["state"], b["thread"], b["alloc_kind"]) == (
        block, 40, "live", tid, "malloc")
    assert in_exe(b["alloc_stack"], exe) == ["alloc_victim", "main"], b["alloc_stack"]
    assert in_exe(a["stack"], exe) == ["free_victim", "main"], a["stack"]
    assert libtag_stats(run.stderr)["damaged_leaked"] == "1", run.stderr


def test_write_after_free_by_another_thread_has_three_stacks(a64_victim, tmp_path):
    # GIVEN a 120-byte block freed by main, 0x5a written at offset 24 by
    # another thread, then enough frees to push it out of the quarantine
    exe = a64_victim("heap_damage")
    run, a = anomaly_run(exe, tmp_path, "uaf", "24", "other", "evict")
    f = kv(run.stdout)
    block, tid, free_tid = int(f["block"], 16), int(f["tid"]), int(f["free_tid"])
    # THEN a use-after-free at the written byte, with who allocated and who
    # freed it, and the eviction that found it
    assert (a["kind"], int(a["address"], 16), a["offset"], a["written"]) == (
        "use-after-free", block + 24, 24, "5a")
    b = a["block"]
    assert (int(b["start"], 16), b["size"], b["state"], b["thread"], b["free_thread"]) == (
        block, 120, "freed", tid, free_tid)
    assert in_exe(b["alloc_stack"], exe)[:2] == ["alloc_victim", "uaf"], b["alloc_stack"]
    assert in_exe(b["free_stack"], exe)[:2] == ["free_victim", "uaf"], b["free_stack"]
    assert in_exe(a["stack"], exe)[:1] == ["churn"], a["stack"]


def test_new_released_by_free_is_a_mismatch_with_both_stacks(a64_victim, tmp_path):
    # GIVEN new long, released with free()
    exe = a64_victim("mismatch", cxx=True)
    run, a = anomaly_run(exe, tmp_path, "new-free")
    f = kv(run.stdout)
    block, tid = int(f["block"], 16), int(f["tid"])
    # THEN an alloc-dealloc-mismatch naming both calls and their stacks
    assert (a["kind"], int(a["address"], 16), a["dealloc"], a["thread"]) == (
        "alloc-dealloc-mismatch", block, "free", tid)
    b = a["block"]
    assert (int(b["start"], 16), b["size"], b["alloc_kind"], b["thread"]) == (block, 8, "new", tid)
    assert in_exe(b["alloc_stack"], exe)[:2] == ["alloc_victim", "main"], b["alloc_stack"]
    assert in_exe(a["stack"], exe)[:2] == ["release_victim", "main"], a["stack"]
    # ... and the block was released all the same
    assert f["live_delta"] == "0", run.stdout


# ------------------------------------------------ the crash hook's core --

FAULT = 0xDEAD0000  # uw_crash.c's FAULT_ADDR


def gdb_threads_bt(exe: Path, core: Path) -> dict[int, list[tuple[int | None, str]]]:
    """gdb-multiarch's ``thread apply all bt`` of a core with its modules
    at their real paths: {tid: [(address or None, function or "??")]}."""
    argv = ["gdb-multiarch", "--batch", "-nx", "-iex", "set debug-file-directory /nonexistent",
            "-iex", "set debuginfod enabled off", "-iex", "set backtrace past-main on",
            str(exe), str(core), "-ex", "thread apply all bt"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180).stdout
    bts: dict[int, list] = {}
    tid = None
    for line in out.splitlines():
        if m := re.match(r"^Thread \d+ \(.*LWP (\d+)\)", line):
            tid = int(m[1])
            bts[tid] = []
        elif tid is not None and (m := re.match(r"^#\d+\s+(?:(0x[0-9a-f]+) in )?(\S+) \(", line)):
            bts[tid].append((int(m[1], 16) if m[1] else None, m[2]))
    return bts


@pytest.mark.parametrize("omit", [False, True], ids=["frame-records", "omit-frame-pointer"])
def test_a_worker_threads_crash_core_has_gdbs_stack(omit, a64_victim, run_cli, tmp_path):
    from forensics.core import Core
    from forensics.reader import abi
    from forensics.reader.control import Control
    from forensics.reader.memory import CoreMemory

    if shutil.which("gdb-multiarch") is None:
        pytest.skip("gdb-multiarch is not installed (apt-get install gdb-multiarch)")
    # GIVEN uw_crash at -O2, as gcc builds it for aarch64 (every non-leaf
    # function keeps its frame record) or without frame pointers: a worker
    # thread writes to FAULT two calls deep (not a PIE: gdb places a PIE by
    # AT_ENTRY, and qemu's /proc/self/auxv, which libtag's core copies,
    # does not hold it)
    exe = a64_victim("uw_crash", "-O2", *(["-fomit-frame-pointer"] if omit else []), "-no-pie")
    # WHEN it dies under libtag: the crash hook writes the core
    run = a64_run(exe, tmp_path, "thread")
    assert run.returncode == -11, run.stderr
    core = only_core(tmp_path, "crash")
    with Core(core) as c:
        control = Control(CoreMemory(c))
        crash = control.fields.crash
        sig, tid, address = int(crash.signal), int(crash.tid), int(crash.address)
        frames = control.raw_stack(int(crash.stack))
    # THEN its crash record is SIGSEGV at FAULT in the worker, with the
    # faulting pc and then return addresses
    assert (sig, address) == (11, FAULT)
    assert [k for _, k in frames] == [abi.TAG_FRAME_SIGNAL] + [abi.TAG_FRAME_CALL] * (len(frames) - 1)
    gdb = gdb_threads_bt(exe, core)[tid]
    if not omit:
        # ... the frames of gdb-multiarch's bt of that thread, address for
        # address (without frame records libtag's walk, which follows them
        # past the first frame, skips the callers that keep none: only the
        # reader's CFI unwind below is gdb's there)
        assert [p for p, _ in frames] == [a for a, _ in gdb], (frames, gdb)
    # AND inspect's crashing thread is that one, its stack gdb's, function
    # for function (gdb's "??" is libc's stripped code, module+offset here)
    doc = cli_json_plain(run_cli, tmp_path, "inspect", str(core))
    c = doc["crash"]
    assert (c["signal"], c["thread"], int(c["address"], 16)) == ("SIGSEGV", tid, FAULT)
    assert tid != doc["process"]["pid"]
    ours = [f["function"] or "??" for f in c["stack"]]
    assert ours == [fn for _, fn in gdb], (ours, gdb)
    assert ours[:3] == ["crash_here", "deeper", "worker"], ours


# ------------------------- a running process: a snapshot by request, threads --


@dataclass
class Running:
    exe: Path
    pid: int
    blocks: list[tuple[int, int, int, str, str]]  # (address, size, tid, state, caller) as printed
    dangling: int
    snapshot: subprocess.CompletedProcess  # forensics snapshot PID --json
    refused: dict[str, subprocess.CompletedProcess]  # --ptrace, --signal RTMIN+3
    run: subprocess.CompletedProcess  # the victim, after its stdin closed
    work: Path

    @property
    def tids(self) -> set[int]:
        return {b[2] for b in self.blocks}


def _cli(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forensics", *args], cwd=work, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "XDG_STATE_HOME": str(work / "state")})


@pytest.fixture(scope="module")
def running(a64_victim, tmp_path_factory):
    """heap_threads (main and three workers, every block printed) running
    under qemu with libtag, waiting on its stdin: `forensics snapshot PID`
    asks it for a snapshot (and --ptrace and a real-time --signal are
    asked too), then its stdin closes and it exits."""
    exe = a64_victim("heap_threads")
    work = tmp_path_factory.mktemp("a64run")
    proc = a64_popen(exe, work, "wait", LIBTAG_QUARANTINE="1500")
    try:
        out = []
        while not out or out[-1] != "ready":
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            line = proc.stdout.readline() if ready else ""
            assert line, f"heap_threads stopped before 'ready': {out} {proc.stderr.read() if not ready else ''}"
            out.append(line.strip())
        pid = int(out[0].split()[1])
        snapshot = _cli(work, "snapshot", str(pid), "--json")
        refused = {how: _cli(work, "snapshot", str(pid), *how.split())
                   for how in ("--ptrace", "--signal RTMIN+3")}
        stdout, stderr = proc.communicate(input="", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    blocks = [(int(w[1], 16), int(w[2]), int(w[3]), w[4], w[5]) for w in map(str.split, out) if w[0] == "block"]
    dangling = next(int(w[1], 16) for w in map(str.split, out) if w[0] == "dangling")
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "\n".join(out) + "\n" + stdout, stderr)
    return Running(exe, pid, blocks, dangling, snapshot, refused, done, work)


def a64_popen(exe: Path, work: Path, *args: str, **env: str) -> subprocess.Popen:
    """a64_run's command, started with pipes to talk to it."""
    cmd, e = _a64_command(exe, work, args, True, False, env)
    return subprocess.Popen(cmd, cwd=work, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_cap_address_space)


def test_a_running_process_is_snapshot_by_request_and_runs_on(running):
    # GIVEN the running victim  WHEN forensics snapshot PID asked it
    snap = running.snapshot
    assert snap.returncode == 0, snap.stderr
    doc = json.loads(snap.stdout)
    # THEN libtag in it took an on-demand snapshot into its own directory
    # (asked by its LIBTAG_SIGNAL, SIGUSR2: qemu-user gives host signal n to
    # the program as n - 2, so libtag's request signal SIGRTMAX-1 has no
    # host number - sent, it arrived as SIGRTMIN+27 and ended the program)
    (d,) = list((running.work / "snaps").iterdir())
    assert (doc["pid"], doc["method"], doc["reason"], doc["seq"], doc["handed_over"], doc["dir"], doc["core"]) == (
        running.pid, "libtag", "on-demand", 1, False, str(d), str(d / "core"))
    assert d.name.endswith(f"-{running.pid}-1-on-demand"), d.name
    # ... and the asks it cannot serve were refused, each in one line, nothing sent
    emulated = f"forensics: error: pid {running.pid} runs aarch64 code under an emulator"
    assert running.refused["--ptrace"].stderr == (
        f"{emulated}: ptrace would stop and fork the emulator, not the program; leave out "
        f"--ptrace (libtag in it takes the snapshot)\n")
    assert running.refused["--signal RTMIN+3"].stderr == (
        f"{emulated}, which renumbers real-time signals: libtag's request signal cannot reach "
        f"it, nor --signal 37; nothing was sent.  Ask it by a standard signal it handles "
        f"(--signal USR2)\n")
    assert [r.returncode for r in running.refused.values()] == [2, 2]
    # AND the program ran on to its end, snapshot once
    assert running.run.returncode == 0, running.run.stderr
    assert [ln for ln in running.run.stderr.splitlines() if ln.startswith("libtag: snapshot")] == [
        f"libtag: snapshot 1 (on-demand) -> {d}"], running.run.stderr


def test_the_snapshot_has_every_thread_and_every_printed_block(running):
    from forensics.reader.dump import Dump

    core = running.work / "snaps"
    (core,) = [d / "core" for d in core.iterdir()]
    src = (VICTIMS / "heap_threads.c").read_text()
    wait_line = src.count("\n", 0, src.index("while (read(0, buf")) + 1
    with Dump.open(core) as dump:
        # THEN the threads are the four the victim printed blocks of
        assert {t.tid for t in dump.threads} == running.tids and len(running.tids) == 4
        # ... main (which took SIGUSR2) reading its stdin in main's loop
        main = [(f.function, f.line) for f in dump.thread_frames(dump.thread(running.pid))
                if f.module == str(running.exe)]
        assert main[0] == ("main", wait_line), main
        # ... and every printed block is found with its size, state, thread
        # and stacks, freed ones with the thread that freed them
        for addr, size, tid, state, who in running.blocks:
            b = dump.heap.block_at(addr)
            assert (b.start, b.size, b.state, b.thread) == (addr, size, state, tid), (hex(addr), b)
            assert [f.function for f in dump.stack(b.alloc_stack)][:3] == ["alloc_node", "make_record", who]
            if state == "freed":
                assert b.free_thread == tid
                assert [f.function for f in dump.stack(b.free_stack)][:2] == ["release_record", who]


def test_the_tag_commands_in_gdb_multiarch_answer_as_the_command_line(running):
    from forensics.gdb import SCRIPT

    if shutil.which("gdb-multiarch") is None:
        pytest.skip("gdb-multiarch is not installed (apt-get install gdb-multiarch)")
    embedded = subprocess.run(["gdb-multiarch", "--batch", "-nx", "-ex",
                               "python import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=120).stdout.split()
    if embedded != [str(v) for v in sys.version_info[:2]]:
        pytest.skip(f"gdb-multiarch embeds Python {'.'.join(embedded) or '(none)'}, forensics is "
                    f"installed for {sys.version_info[0]}.{sys.version_info[1]}")
    (core,) = [d / "core" for d in (running.work / "snaps").iterdir()]
    # GIVEN the command line's answers on the aarch64 snapshot
    want_inspect = json.loads(_cli(running.work, "inspect", str(core), "--top", "3", "--json").stdout)
    want_block = json.loads(_cli(running.work, "whoowns", hex(running.dangling + 4), "--core", str(core),
                                 "--json").stdout)["block"]
    # WHEN gdb-multiarch opens the core with the tag commands loaded
    mark = "@@a64@@"
    argv = ["gdb-multiarch", "--batch", "-nx", "-iex", "set debuginfod enabled off", "-ex", f"source {SCRIPT}"]
    for c in ("tag inspect --json --top 3", f"tag block --json {running.dangling + 4:#x}"):
        argv += ["-ex", f"echo {mark}\\n", "-ex", c]
    argv += ["-ex", f"echo {mark}\\n", str(running.exe), str(core)]
    # (FORENSICS_PYTHON: the loader takes the package this test imports)
    done = subprocess.run(argv, cwd=running.work, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XDG_STATE_HOME": str(running.work / "state"),
                               "FORENSICS_PYTHON": sys.executable})
    parts = done.stdout.split(mark + "\n")[1:-1]
    assert len(parts) == 2, (done.stdout, done.stderr)
    # THEN they answer as the command line does, on the same core
    assert json.loads(parts[0]) == want_inspect
    assert json.loads(parts[1]) == want_block
    # ... which is the dangling pointer's block: freed by main, 100 bytes
    assert (want_block["start"], want_block["size"], want_block["state"], want_block["free_thread"]) == (
        hex(running.dangling), 100, "freed", running.pid)


# ------------------------------------------------------- retention paths --


@dataclass
class Retained:
    exe: Path
    facts: dict[str, list[int]]
    core: Path

    def __getitem__(self, key: str) -> int:
        return self.facts[key][0]


def slab_facts(stdout: str) -> dict[str, list[int]]:
    return {w[0]: [int(v, 0) for v in w[1:]] for w in map(str.split, stdout.splitlines()) if w}


@pytest.fixture(scope="module", params=["libtag", "glibc"])
def retained(request, a64_victim, tmp_path_factory):
    """slab_chain (test_whoowns_retention.py): under libtag its on-demand
    snapshot from inside hold_on_stack; without it qemu's core of its
    SIGABRT there, read from glibc's heap."""
    exe = a64_victim("slab_chain")
    work = tmp_path_factory.mktemp(f"a64retain-{request.param}")
    if request.param == "libtag":
        run = a64_run(exe, work)
        assert run.returncode == 0, run.stderr
        core = only_core(work, "on-demand")
    else:
        core, out, _ = qemu_core(exe, work, "abort")
        run = subprocess.CompletedProcess([], 0, out, "")
    return Retained(exe, slab_facts(run.stdout), core)


def who(run_cli, tmp: Path, r: Retained, addr: int) -> dict:
    args = ("whoowns", hex(addr), "--core", str(r.core))
    return cli_json_plain(run_cli, tmp, *args) if r.core.name == "core" else cli_json(run_cli, tmp, *args)


def test_a_slab_is_kept_alive_by_a_global_through_the_table(retained, run_cli, tmp_path):
    r = retained
    # WHEN whoowns is asked about a word inside the slab
    doc = who(run_cli, tmp_path, r, r["slab"] + 200)
    # THEN one root: the global registry in the victim's .bss, through the
    # table's slot at offset 48 (glibc's chunk: 136 usable bytes for 128)
    table = 128 if r.core.name == "core" else 136
    assert doc["retainers"] == [{
        "root": {"kind": "global", "address": hex(r["registry"]), "thread": None, "register": None,
                 "module": str(r.exe), "symbol": "registry", "section": ".bss", "function": None,
                 "interior": False},
        "path": [{"address": hex(r["slot"]), "block_start": hex(r["table"]), "size": table, "offset": 48,
                  "interior": False}],
    }], doc["retainers"]
    # ... and the slab's 63 free-list links into itself are no referrers
    assert (doc["retainer_count"], doc["self_referrers"], doc["referrer_count"]) == (1, 63, 1), doc


def test_a_block_held_by_a_local_is_kept_by_its_frame(retained, run_cli, tmp_path):
    r = retained
    doc = who(run_cli, tmp_path, r, r["stack_block"])
    # THEN the root is that stack word of the main thread, in hold_on_stack
    assert [(x["root"]["kind"], int(x["root"]["address"], 16), x["root"]["thread"], x["root"]["function"],
             x["path"]) for x in doc["retainers"]] == [
        ("stack", r["stack_slot"], r["main_tid"], "hold_on_stack", [])], doc["retainers"]


def test_a_leaked_block_is_kept_alive_by_nothing(retained, run_cli, tmp_path):
    r = retained
    doc = who(run_cli, tmp_path, r, r["leaked"])
    assert (doc["retainers"], doc["retainer_count"], doc["retainers_depth_limited"]) == ([], 0, False), doc
