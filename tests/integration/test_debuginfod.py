"""A stripped binary's frames named from a debuginfod server, by build-id,
only when DEBUGINFOD_URLS points at one; a server that is down is one
warning and module+0xOFFSET frames, never a hang or a traceback.

Real parts: tests/victims/split_debug.c built -O2 -g with a build-id and
split as distributions split packages (``objcopy --only-keep-debug``, then
``strip --strip-all``), its libtag snapshot, and Debian's ``debuginfod``
(elfutils; .ci/run installs it) started here on a free port over a folder
holding only the debug file (``-F``, a database in the test's folder),
asked through http://127.0.0.1:PORT.  (Debian 12's debuginfod has no
option to listen on loopback alone; the port is free, and the server lives
as long as the module's tests.)
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import forensics_test_support as S
from forensics.core import elf

FUNCS = ["allocate_in_leaf", "middle", "main", "_start"]  # split_debug.c's block stack, innermost first
HELD_SIZE = 72


def build_id(path: Path) -> str:
    with open(path, "rb") as f:
        bid = elf.file_build_id(f)
    assert bid is not None, f"expected {path} to have a GNU build-id"
    return bid.hex()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Victim:
    exe: Path
    core: Path
    debug: Path
    bid: str


@pytest.fixture(scope="module")
def victim(build_victim, run_victim, tmp_path_factory) -> Victim:
    """split_debug stripped, its debug file alone in a folder, and its snapshot."""
    work = tmp_path_factory.mktemp("debuginfod")
    built = build_victim("split_debug", instrument=False, extra_flags=["-O2", "-Wl,--build-id"])
    v = Victim()
    v.exe = work / "bin" / "split_debug"
    v.exe.parent.mkdir()
    shutil.copy2(built, v.exe)
    served = work / "served"
    served.mkdir()
    v.debug = served / "split_debug.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(v.exe), str(v.debug)], check=True)
    subprocess.run(["strip", "--strip-all", str(v.exe)], check=True)
    v.bid = build_id(v.exe)
    assert build_id(v.debug) == v.bid
    snaps = work / "snaps"
    snaps.mkdir(mode=0o700)
    done = run_victim(v.exe, snap_dir=snaps)
    assert done.returncode == 0, done.stderr
    pid = int(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("pid ")))
    v.core = S.wait_core(snaps, pid)
    return v


@pytest.fixture(scope="module")
def server(victim, tmp_path_factory):
    """Debian's debuginfod serving victim's debug file: its URL."""
    exe = shutil.which("debuginfod")
    if exe is None:
        pytest.skip("debuginfod is not installed (.ci/run installs Debian's debuginfod)")
    work = tmp_path_factory.mktemp("server")
    port = free_port()
    proc = subprocess.Popen([exe, "-F", "-d", str(work / "db.sqlite"), "-p", str(port), "-t", "0",
                             "-g", "0", "-c", "1", str(victim.debug.parent)],
                            stdout=subprocess.DEVNULL, stderr=open(work / "log", "wb"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:  # up, and the folder scanned: the debug file is served
            assert proc.poll() is None, (work / "log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/buildid/{victim.bid}/debuginfo", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, f"debuginfod did not serve the file: {(work / 'log').read_text()}"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def inspect(run_cli, victim: Victim, tmp_path: Path, **env: str) -> dict:
    full = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "DEBUGINFOD_URLS": "", **env}
    done = run_cli("inspect", "--json", str(victim.core), env=full, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


def held(doc: dict, exe: Path) -> list[dict]:
    stacks = [s["stack"] for s in doc["top_stacks"] if (s["bytes"], s["blocks"]) == (HELD_SIZE, 1)]
    assert len(stacks) == 1, doc["top_stacks"]
    return [f for f in stacks[0] if f["module"] == str(exe)]


def test_frames_are_named_only_when_debuginfod_urls_points_at_the_server(run_cli, victim, server,
                                                                         tmp_path):
    # WITHOUT DEBUGINFOD_URLS: the stripped binary's frames are module+offset
    doc = inspect(run_cli, victim, tmp_path / "a")
    assert [f["function"] for f in held(doc, victim.exe)] == [None] * 4
    # WITH it: named from the server's debug file, kept as elfutils keeps it
    cache = tmp_path / "debuginfod_cache"
    doc = inspect(run_cli, victim, tmp_path / "b", DEBUGINFOD_URLS=server,
                  DEBUGINFOD_CACHE_PATH=str(cache))
    stack = held(doc, victim.exe)
    assert [f["function"] for f in stack] == FUNCS, stack
    assert [Path(f["file"]).name for f in stack[:3]] == ["split_debug.c"] * 3, stack
    assert not [w for w in doc["warnings"] if "debuginfod" in w], doc["warnings"]
    kept = cache / victim.bid / "debuginfo"
    assert kept.read_bytes() == victim.debug.read_bytes()
    assert (kept.stat().st_mode & 0o777, kept.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    # the default cache is $XDG_CACHE_HOME/debuginfod_client, as elfutils'
    inspect(run_cli, victim, tmp_path / "c", DEBUGINFOD_URLS=server)
    assert (tmp_path / "c" / "xdg" / "debuginfod_client" / victim.bid / "debuginfo").is_file()


def test_a_server_that_is_down_is_one_warning_and_module_offsets(run_cli, victim, tmp_path):
    # GIVEN DEBUGINFOD_URLS naming a port nothing listens on (a stopped server)
    url = f"http://127.0.0.1:{free_port()}"
    doc = inspect(run_cli, victim, tmp_path, DEBUGINFOD_URLS=url, DEBUGINFOD_TIMEOUT="5",
                  DEBUGINFOD_CACHE_PATH=str(tmp_path / "cache"))
    # THEN the frames are module+offset, and one warning says why
    stack = held(doc, victim.exe)
    assert [f["function"] for f in stack] == [None] * 4
    assert all(f["module_offset"].startswith("0x") for f in stack), stack
    assert [w for w in doc["warnings"] if "debuginfod" in w] == [
        f"debuginfod server {url} did not answer (Connection refused); the frames of modules "
        f"without a local debug file are shown as module+offset"]
