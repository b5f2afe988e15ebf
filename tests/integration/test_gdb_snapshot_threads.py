"""gdb on a snapshot core, on both core paths: every thread of the program
has its registers, so `thread apply all bt` and `info registers` work in each.

A snapshot's core is written by a fork child of one thread.  libtag's own
writer (LIBTAG_CORE=self) puts an NT_PRSTATUS per thread from the registers
each thread saved before the fork; a kernel-written core (LIBTAG_CORE=kernel)
holds only the child, and forensics completes it (reader/complete.py) the
first time it sees the core complete.

GIVEN tests/victims/gdb_threads.c: three threads parked in park_alpha,
park_beta and park_gamma (their tids printed), the main thread taking the
snapshot from take_snapshot_here()
WHEN gdb opens the core
THEN each thread's backtrace runs through its own function.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time

import pytest

import forensics_test_support as S

pytestmark = pytest.mark.skipif(not S.have_gdb(), reason="gdb is not installed")

FUNCTIONS = {"alpha": "park_alpha", "beta": "park_beta", "gamma": "park_gamma", "main": "take_snapshot_here"}


@pytest.fixture(scope="module")
def victim(build_victim):
    return build_victim("gdb_threads", instrument=False)


def take(victim, tmp_path, core_path: str) -> tuple[dict[str, int], "os.PathLike", int]:
    """Run the victim; ({name: tid}, snapshot dir, pid)."""
    snaps = tmp_path / "snaps"
    result = subprocess.run([str(victim)], env=S.victim_env(core_path, snaps), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "snapshot rc=0" in result.stdout, result.stdout
    tids = {m.group(1): int(m.group(2))
            for m in re.finditer(r"^(?:thread )?(\w+) tid=(\d+)$", result.stdout, re.M)}
    assert set(tids) == set(FUNCTIONS), result.stdout
    return tids, snaps, tids["main"]


def gdb(exe, core, *commands: str) -> subprocess.CompletedProcess:
    argv = ["gdb", "--batch", "-nx", "-iex", "set debuginfod enabled off", str(exe), str(core)]
    for c in commands:
        argv += ["-ex", c]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def per_thread(out: str) -> dict[int, str]:
    """{LWP: all the text gdb printed for it} from `thread apply all ...` commands."""
    parts = re.split(r"^Thread \d+ \(.*?LWP (\d+)\)\):$", out, flags=re.M)
    out_: dict[int, str] = {}
    for i in range(1, len(parts) - 1, 2):
        out_[int(parts[i])] = out_.get(int(parts[i]), "") + parts[i + 1]
    return out_


def check_every_thread(victim, core, tids: dict[str, int]) -> None:
    result = gdb(victim, core, "thread apply all bt", "thread apply all info registers rip rsp")
    text = result.stdout + result.stderr
    assert "Couldn't find general-purpose registers" not in text, text
    assert "<unavailable>" not in text, text
    assert ".reg-xstate" not in text, text
    threads = per_thread(result.stdout)
    assert set(tids.values()) <= set(threads), f"gdb's threads {sorted(threads)} lack some of {tids}"
    for name, tid in tids.items():
        section = threads[tid]
        assert f" in {FUNCTIONS[name]} () " in section, f"thread {name} ({tid}):\n{section}"
        assert re.search(r"^rip\s+0x[0-9a-f]+", section, re.M), f"thread {name} ({tid}) rip:\n{section}"
        assert re.search(r"^rsp\s+0x[0-9a-f]+", section, re.M), f"thread {name} ({tid}) rsp:\n{section}"


@pytest.mark.parametrize("core_path", S.CORE_PATHS)
def test_thread_apply_all_bt_on_a_snapshot_core(victim, tmp_path, core_path):
    tids, snaps, pid = take(victim, tmp_path, core_path)
    core = S.wait_core(snaps, pid)  # as forensics waits for it (and completes it)
    assert stat.S_IMODE(os.lstat(core).st_mode) == 0o600
    check_every_thread(victim, core, tids)
    # the snapshot's own thread is gdb's current thread
    first = gdb(victim, core, "info threads").stdout
    assert re.search(rf"^\* 1 .*LWP {tids['main']}\)", first, re.M), first


def _wait_written(snaps, pid) -> "os.PathLike":
    """The kernel's core once its writer exited and its size settled, without
    letting forensics complete it."""
    from forensics.snapshots import snapdir

    deadline = time.monotonic() + 60
    last = -1
    while time.monotonic() < deadline:
        dirs = list(snaps.glob(f"*-{pid}-1-on-demand"))
        if dirs:
            done, core = snapdir.is_complete(snapdir.list_dirs(snaps)[0])
            if done and core is not None:
                size = core.stat().st_size
                if size == last:
                    return core
                last = size
        time.sleep(0.05)
    raise AssertionError("the snapshot core was not written")


@pytest.mark.skipif(S.kernel_core_skip_reason() is not None, reason=S.kernel_core_skip_reason() or "")
def test_forensics_completes_a_kernel_core_but_never_through_a_symlink(victim, tmp_path, run_cli):
    # GIVEN a kernel-written snapshot core forensics has not seen yet
    tids, snaps, pid = take(victim, tmp_path, "kernel")
    core = _wait_written(snaps, pid)
    before = gdb(victim, core, "thread apply all bt").stdout + gdb(victim, core, "thread apply all bt").stderr
    assert "Couldn't find general-purpose registers" in before, "the kernel's core names only the child"
    size = core.stat().st_size
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    # WHEN forensics is given a symlink to it
    link = tmp_path / "link-to-core"
    os.symlink(core, link)
    run_cli("inspect", link, "--json", env=env)
    # THEN the core is left as it was
    assert core.stat().st_size == size
    # WHEN forensics opens the core itself
    result = run_cli("inspect", core, "--json", env=env)
    assert result.returncode == 0, result.stderr
    # THEN gdb finds every thread's registers, and the file stays 0600
    assert core.stat().st_size > size
    assert stat.S_IMODE(os.lstat(core).st_mode) == 0o600
    check_every_thread(victim, core, tids)


@pytest.mark.skipif(S.kernel_core_skip_reason() is not None, reason=S.kernel_core_skip_reason() or "")
def test_a_verb_parses_the_core_once_and_completes_it_from_that_parse(victim, tmp_path, monkeypatch,
                                                                      capsys):
    from forensics.cli.main import main
    from forensics.core.core import Core
    from forensics.reader import abi

    # GIVEN a kernel-written snapshot core forensics has not seen yet
    tids, snaps, pid = take(victim, tmp_path, "kernel")
    core = _wait_written(snaps, pid)
    size = core.stat().st_size
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    # (each parse of a core file and each search for the control block is
    # counted; what they do is left as it is)
    parses, finds = [], []
    parse, find = Core._parse, abi.find_control
    monkeypatch.setattr(Core, "_parse", lambda self: (parses.append(self.path), parse(self))[1])
    monkeypatch.setattr(abi, "find_control", lambda mem: (finds.append(1), find(mem))[1])
    # WHEN whoowns --core reads it the first time
    assert main(["whoowns", "0x1000", "--core", str(core), "--json"]) == 1  # the NULL page: no block
    # THEN the control block was found once, and the core parsed once, then
    # once more after the completion appended every thread's notes to it
    assert (len(finds), parses) == (1, [str(core), str(core)]), (finds, parses)
    assert core.stat().st_size > size
    # WHEN whoowns --core reads it again
    parses.clear(), finds.clear()
    assert main(["whoowns", "0x1000", "--core", str(core), "--json"]) == 1
    # THEN one parse, one search: the completed core is left as it is
    assert (len(finds), parses) == (1, [str(core)]), (finds, parses)
    capsys.readouterr()
    check_every_thread(victim, core, tids)
