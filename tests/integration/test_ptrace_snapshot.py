"""`forensics snapshot PID` of a process that was never started under libtag:
the fork by ptrace (forensics/snapshots/ptrace.py, corefile.py).

tests/victims/plain_threads.c runs without libtag: known blocks (one kept,
one freed, one leaked), a thread blocked in read(), one in nanosleep(), one
computing.  The snapshot must hold every thread with its registers (each
stack reaches its thread function), glibc's answers for the blocks, and
leave the process exactly as it was: no EINTR, no handler run, no child
left, still answering.  Each refusal leaves the process untouched.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

THREADS = ("reader", "sleeper", "spinner")


class Victim:
    def __init__(self, exe: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.proc = subprocess.Popen([str(exe), *args], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.blocks: dict[str, tuple[int, int]] = {}
        self.tids: dict[str, int] = {}
        while True:
            line = self.proc.stdout.readline()
            assert line, f"victim ended before 'ready': {self.proc.stderr.read()}"
            words = line.split()
            if words[0] == "block":
                self.blocks[words[1]] = (int(words[2], 16), int(words[3]))
            elif words[0] == "thread":
                self.tids[words[1]] = int(words[2])
            elif words[0] == "ready":
                break
        assert sorted(self.tids) == sorted(THREADS)
        self.pid = self.proc.pid

    def report(self) -> dict[str, int]:
        self.proc.stdin.write("report\n")
        self.proc.stdin.flush()
        words = self.proc.stdout.readline().split()
        assert words[0] == "report", words
        return {k: int(v) for k, v in (w.split("=") for w in words[1:])}

    def children(self) -> list[str]:
        out = []
        for t in os.listdir(f"/proc/{self.pid}/task"):
            with open(f"/proc/{self.pid}/task/{t}/children") as f:
                out += f.read().split()
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            assert self.proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def plain_exe(build_victim) -> Path:
    return build_victim("plain_threads", instrument=False)


@pytest.fixture
def victim(plain_exe):
    v = Victim(plain_exe)
    yield v
    v.close()


@pytest.fixture
def cli(run_cli, tmp_path):
    """run_cli with the catalog and the default snapshot directory in tmp_path."""
    state = tmp_path / "state"
    state.mkdir()
    return lambda *args: run_cli(*args, env={"XDG_STATE_HOME": str(state)})


def cli_json(cli, *args: str) -> dict:
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_snapshot_of_a_process_without_libtag(victim, cli, tmp_path):
    before = victim.report()
    snap = cli_json(cli, "snapshot", str(victim.pid), "--dir", str(tmp_path / "snaps"))
    assert snap["method"] == "ptrace"
    assert snap["reason"] == "on-demand"
    assert snap["pid"] == victim.pid
    assert snap["threads_stopped"] == 4
    assert snap["pause_ms"] > 0 and snap["reap_ms"] is not None
    core = Path(snap["core"])
    assert stat.S_IMODE(core.stat().st_mode) == 0o600
    assert stat.S_IMODE(core.parent.stat().st_mode) == 0o700
    comm = Path(f"/proc/{victim.pid}/comm").read_text().strip()
    assert core.parent.name == f"{comm}-{victim.pid}-1-on-demand"

    # the process runs on as it was: no signal handler ran, no system call
    # failed with EINTR, no child left for it to see, and it still answers
    after = victim.report()
    assert after["eintr"] == 0 and after["handlers"] == 0 and after["children"] == 0, after
    assert after["spins"] > before["spins"]
    assert victim.children() == []

    doc = cli_json(cli, "inspect", str(core), "--leaks")
    assert doc["libtag"] is False and doc["reason"] == "on-demand" and doc["crash"] is None
    stacks = {t["tid"]: [f["function"] for f in t["stack"]] for t in doc["threads"]}
    assert sorted(stacks) == sorted([victim.pid, *victim.tids.values()])
    for name, tid in victim.tids.items():
        assert f"{name}_main" in stacks[tid], (name, stacks[tid])
    assert "main" in stacks[victim.pid]
    assert "__read" in stacks[victim.tids["reader"]]

    kept, kept_size = victim.blocks["kept"]
    who = cli_json(cli, "whoowns", hex(kept), "--core", str(core))
    assert who["chunk"]["usable"] == kept_size and who["chunk"]["state"] == "inuse", who["chunk"]
    assert [r["symbol"] for r in who["referrers"]] == ["kept_block"]
    freed, _ = victim.blocks["freed"]
    who = cli_json(cli, "whoowns", hex(freed), "--core", str(core))
    assert who["chunk"]["state"] == "tcache" and who["chunk"]["usable"] == 200, who["chunk"]

    leaked, _ = victim.blocks["leaked"]
    definite = [g for g in doc["leaks"] if g["kind"] == "definite"]
    assert [g["examples"] for g in definite] == [[hex(leaked)]]
    assert definite[0]["usable_size"] == 792  # malloc(777): an 800-byte chunk

    listed = cli_json(cli, "list")
    assert str(core) in [e["core"] for e in listed]


def test_gdb_reads_every_thread(victim, cli, tmp_path, plain_exe):
    import shutil

    if shutil.which("gdb") is None:
        pytest.skip("gdb is not installed")
    snap = cli_json(cli, "snapshot", str(victim.pid), "--dir", str(tmp_path))
    done = subprocess.run(["gdb", "-batch", "-nx", "-ex", "thread apply all bt", str(plain_exe),
                           snap["core"]], capture_output=True, text=True, timeout=120)
    for name, tid in victim.tids.items():
        block = done.stdout.split(f"(LWP {tid})")[1].split("\nThread ")[0]
        assert f"{name}_main" in block, done.stdout


def _untouched(victim: Victim) -> None:
    r = victim.report()
    assert r["eintr"] == 0 and r["handlers"] == 0 and r["children"] == 0, r
    assert victim.children() == []


def _refused(cli, pid: int, dest: Path) -> str:
    done = cli("snapshot", str(pid), "--dir", str(dest))
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("forensics: error: "), done.stderr
    assert not any(dest.glob("*/core")), list(dest.iterdir()) if dest.exists() else None
    return lines[0]


_PTRACE_SEIZE = 0x4206
_TRACER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
r = libc.ptrace(0x4206, int(sys.argv[1]), None, None)
print("seized" if r == 0 else f"error {ctypes.get_errno()}", flush=True)
sys.stdin.read()
"""


def test_a_process_another_tracer_holds_is_refused(victim, cli, tmp_path):
    tracer = subprocess.Popen([sys.executable, "-c", _TRACER, str(victim.pid)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert tracer.stdout.readline().strip() == "seized"
        line = _refused(cli, victim.pid, tmp_path)
        assert f"process {victim.pid} is already traced by pid {tracer.pid}" in line, line
    finally:
        tracer.communicate("", timeout=30)
    _untouched(victim)


def test_a_seccomp_filter_that_forbids_fork_is_refused(plain_exe, cli, tmp_path):
    v = Victim(plain_exe, "seccomp")
    try:
        if os.geteuid() == 0:
            line = _refused(cli, v.pid, tmp_path)
            assert "seccomp filter does not let clone through" in line, line
        else:
            line = _refused(cli, v.pid, tmp_path)
            assert "runs under a seccomp filter: only CAP_SYS_ADMIN" in line, line
        assert v.proc.poll() is None
        _untouched(v)
    finally:
        v.close()


def test_a_stopped_process_is_refused(victim, cli, tmp_path):
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while "T" not in Path(f"/proc/{victim.pid}/stat").read_text().split(")")[1][:3]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        line = _refused(cli, victim.pid, tmp_path)
        assert f"process {victim.pid} is stopped" in line, line
        assert "kill -CONT" in line
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    _untouched(victim)


def test_a_zombie_is_refused(cli, tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "import os, sys\npid = os.fork()\n"
                               "if pid == 0:\n    os._exit(0)\nprint(pid, flush=True)\n"
                               "sys.stdin.readline()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}/stat").read_text().split(")")[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        line = _refused(cli, child, tmp_path)
        assert line == f"forensics: error: no process with pid {child} (it has exited and is a zombie)"
    finally:
        parent.communicate("", timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another uid")
def test_another_users_process_without_cap_sys_ptrace_is_refused(run_cli, tmp_path):
    # root whose bounding set lacks CAP_SYS_PTRACE (as in a container) may
    # not trace a process of another uid: the kernel refuses PTRACE_SEIZE
    sleeper = subprocess.Popen(["sleep", "120"], user=65534, group=65534)
    try:
        done = subprocess.run(["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", "--",
                               sys.executable, "-m", "forensics", "snapshot", str(sleeper.pid),
                               "--dir", str(tmp_path / "snaps")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr == (f"forensics: error: no permission to trace pid {sleeper.pid}: it runs as "
                               f"uid 65534 and you are root without CAP_SYS_PTRACE (a container's or "
                               f"a capability bounding set's rule); run forensics as uid 65534, or "
                               f"with CAP_SYS_PTRACE\n"), done.stderr
        state = Path(f"/proc/{sleeper.pid}/stat").read_text().split(")")[1].split()[0]
        assert state == "S" and sleeper.poll() is None  # untouched, still asleep
        assert not (tmp_path / "snaps").exists() or not any((tmp_path / "snaps").glob("*/core"))
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)


def test_a_process_outside_the_callers_user_namespace_is_refused(tmp_path):
    # forensics run from a user namespace of its own (root there) may not
    # trace a process of the namespace above it
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True,
                               text=True, timeout=30)
        if probe.returncode != 0:
            pytest.skip(f"this machine does not let an unprivileged user namespace be made: "
                        f"{probe.stderr.strip()}")
        done = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-m", "forensics",
                               "snapshot", str(sleeper.pid), "--dir", str(tmp_path / "snaps")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr == (f"forensics: error: no permission to trace pid {sleeper.pid}: it runs in "
                               f"another user namespace; run forensics inside its namespace (nsenter -t "
                               f"{sleeper.pid} -U -m -p) or from the one that owns it\n"), done.stderr
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)


def test_yamas_ptrace_scope_is_named(run_cli, tmp_path):
    path = Path("/proc/sys/kernel/yama/ptrace_scope")
    if not path.exists():
        pytest.skip("this kernel has no Yama LSM (/proc/sys/kernel/yama is absent), and "
                    "ptrace_scope is a machine-wide setting the tests never change")
    scope = path.read_text().strip()
    if scope == "0" or os.geteuid() == 0:
        pytest.skip(f"Yama's ptrace_scope is {scope} and the tests run as uid {os.geteuid()}: "
                    f"nothing refuses a trace here, and the tests never change the setting")
    # an unprivileged caller and a process that is not its child: refused by Yama
    sleeper = subprocess.Popen(["setsid", "sleep", "120"])
    try:
        done = run_cli("snapshot", str(sleeper.pid), "--dir", str(tmp_path / "snaps"))
        assert done.returncode == 2, done.stderr
        assert f"no permission to trace pid {sleeper.pid}: Yama's ptrace_scope is {scope}" \
            in done.stderr, done.stderr
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)


_PY_LOOP = """
import ctypes, sys, threading, time
buf = bytearray(b"p" * 100000)
addr = ctypes.addressof((ctypes.c_char * 1).from_buffer(buf))
stop = threading.Event()
def worker():
    items = []
    while not stop.is_set():
        items.append(str(len(items)) * 10)
        if len(items) > 10000:
            items.clear()
threading.Thread(target=worker, name="churn").start()
print(f"buffer {addr:#x}", flush=True)
sys.stdin.readline()
stop.set()
"""


def test_debians_python3_without_libtag(cli, tmp_path):
    # GIVEN Debian's python3 (not preloaded) allocating in a loop in a thread,
    # and a bytearray of 100000 bytes whose buffer address it printed
    py = "/usr/bin/python3"
    if not os.access(py, os.X_OK):
        pytest.skip("Debian's python3 is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC")}
    env["PYTHONMALLOC"] = "malloc"  # every object a glibc chunk
    proc = subprocess.Popen([py, "-c", _PY_LOOP], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        words = proc.stdout.readline().split()
        assert words[0] == "buffer", words
        buf = int(words[1], 16)
        # WHEN forensics snapshot PID, no flags
        snap = cli_json(cli, "snapshot", str(proc.pid), "--dir", str(tmp_path / "s"))
        assert snap["method"] == "ptrace" and snap["threads_stopped"] == 2, snap
        assert proc.poll() is None
        # THEN whoowns names the bytearray's chunk, in use, 100001 bytes or more
        who = cli_json(cli, "whoowns", hex(buf), "--core", snap["core"])
        assert who["owner"] == "heap" and who["chunk"]["state"] == "inuse", who
        assert who["chunk"]["usable"] >= 100001 and who["chunk"]["offset"] == 0, who["chunk"]
        doc = cli_json(cli, "inspect", snap["core"])
        assert doc["heap"]["live_blocks"] > 10000, doc["heap"]
        assert len(doc["threads"]) == 2
    finally:
        proc.communicate("\n", timeout=60)
    assert proc.returncode == 0


def test_snapshots_while_threads_are_being_created(build_victim, cli, tmp_path):
    # GIVEN a thread that creates and joins threads without pause: some
    # snapshots stop it inside clone, which must finish before the fork
    exe = build_victim("spawn_loop", instrument=False)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen([str(exe)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        # WHEN it is snapshot 12 times
        for i in range(12):
            snap = cli_json(cli, "snapshot", str(proc.pid), "--dir", str(tmp_path / "s"))
            assert snap["method"] == "ptrace" and snap["threads_stopped"] >= 2, snap
            os.unlink(snap["core"])
        proc.stdin.write("report\n")
        proc.stdin.flush()
        words = dict(w.split("=") for w in proc.stdout.readline().split()[1:])
        # THEN every thread it created ran once, no create or join failed,
        # and it exits as it should
        assert int(words["spawned"]) > 0 and words["errors"] == "0", words
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
