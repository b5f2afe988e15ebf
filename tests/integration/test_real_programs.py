"""Real programs under libtag, none written here: same output, a readable
mid-run snapshot, zero anomalies.

GIVEN python3 running a workload, sqlite3 running a script, git serving a
repository's objects (``git cat-file --batch``) and the brotli command-line
tool built from the brotli sdist on PyPI with -finstrument-functions,
WHEN each runs once without libtag and once with it (LD_PRELOAD, LIBTAG_DIR),
being sent SIGUSR2 halfway - after the first half of its input, while it
waits for the rest with its heap full of its working state -
THEN it exits the same with byte-identical stdout, libtag logged nothing but
the snapshot, the snapshot directory holds that one on-demand snapshot, and
``forensics inspect`` reads its core: reason on-demand, no anomalies, no
warnings, the process's own pid.

Each program runs twice more on a smaller input with LIBTAG_GUARD_RATE=1:
every block it allocates (up to the guard pool's cap) is guarded, and it
must still give the same output, with no anomaly and guarded blocks in its
core.

Each program is found or built per module; sqlite3 is installed by .ci/run;
the brotli sdist is fetched by .ci/run (pip download) into
$FORENSICS_SDIST_DIR (default ~/.cache/forensics/sdists) and the brotli test
skips, saying so, when it is not there (tests fetch nothing themselves).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from forensics import libpath
import forensics_test_support as S

TIMEOUT = 120  # seconds for any one program run
BROTLI_SDIST = "brotli-1.2.1.tar.gz"
SDIST_DIR = Path(os.environ.get("FORENSICS_SDIST_DIR",
                                Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                / "forensics" / "sdists"))


@dataclass
class Outcome:
    code: int
    out: bytes
    err: str
    pid: int


def _waiting_on_stdin(pid: int) -> bool:
    """Is pid's main thread blocked in read(0, ...)?  (/proc/PID/syscall:
    "0 0x0 ..." = system call 0, read, on fd 0.)"""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return len(fields) > 1 and fields[0] == "0" and fields[1] == "0x0"


def run_program(argv: list[str], first: bytes, rest: bytes, tmp: Path, *, libtag: bool,
                env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[Outcome, Path | None]:
    """Run argv, feed it `first`, wait until it waits for more input, (with
    libtag: snapshot it with SIGUSR2 and wait for the core), feed `rest`,
    and let it finish.  Returns the outcome and the core (None without libtag)."""
    full = dict(os.environ)
    full.update(env or {})
    snap_dir = None
    tag = "tag" if libtag else "plain"
    if libtag:
        snap_dir = tmp / "snaps"
        snap_dir.mkdir(mode=0o700)
        full["LD_PRELOAD"] = f"{libpath.lib_path()} {full.get('LD_PRELOAD', '')}".strip()
        full["LIBTAG_DIR"] = str(snap_dir)
        full["LIBTAG_CORE"] = "self"
    out_path, err_path = tmp / f"out-{tag}", tmp / f"err-{tag}"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, env=full, cwd=cwd)
        try:
            proc.stdin.write(first)
            proc.stdin.flush()
            deadline = time.monotonic() + TIMEOUT
            while not _waiting_on_stdin(proc.pid):
                assert proc.poll() is None, f"{argv[0]} exited early: {err_path.read_text()}"
                assert time.monotonic() < deadline, f"{argv[0]} never waited for more input"
                time.sleep(0.02)
            core = None
            if libtag:
                os.kill(proc.pid, signal.SIGUSR2)
                core = S.wait_core(snap_dir, proc.pid)
            proc.stdin.write(rest)
            proc.stdin.close()
            code = proc.wait(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if libtag:
        assert [d.name for d in snap_dir.iterdir()] == [core.parent.name], "more than the one snapshot"
    return Outcome(code, out_path.read_bytes(), err_path.read_text(errors="replace"), proc.pid), core


# LIBTAG_GUARD_RATE of the runs under libtag -> (the test's input scale)
RATES = {"0": 1.0, "1": 0.1}


def check_same_and_clean(argv, first, rest, tmp: Path, run_cli, *, rate: str = "0",
                         env: dict[str, str] | None = None, **kw) -> dict:
    plain, _ = run_program(argv, first, rest, tmp, libtag=False, env=env, **kw)
    tagged, core = run_program(argv, first, rest, tmp, libtag=True,
                               env={**(env or {}), "LIBTAG_GUARD_RATE": rate}, **kw)
    # the same program, the same result
    assert (tagged.code, tagged.out) == (plain.code, plain.out), tagged.err
    # libtag said nothing but where the snapshot went
    libtag_lines = [ln for ln in tagged.err.splitlines() if ln.startswith("libtag")]
    assert [ln.split(" -> ")[0] for ln in libtag_lines] == ["libtag: snapshot 1 (on-demand)"], tagged.err
    assert [ln for ln in tagged.err.splitlines() if not ln.startswith("libtag")] == plain.err.splitlines()
    # and the core reads cleanly
    r = run_cli("inspect", "--json", str(core), env={"XDG_STATE_HOME": str(tmp / "state")}, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["reason"], doc["anomalies"], doc["counters"]["anomalies"], doc["warnings"]) == \
        ("on-demand", [], 0, []), doc["warnings"]
    assert doc["process"]["pid"] == tagged.pid
    # at rate 1 every block is guarded until the pool is full
    assert (doc["counters"]["guard_rate"], doc["counters"]["guard_slots_used"] > 0) == \
        (int(rate), rate == "1"), doc["counters"]
    return doc


# --------------------------------------------------------------- the programs --

PY_WORKLOAD = r"""
import hashlib, json, sys
def build(n):
    table = {}
    for i in range(n):
        key = f"k{i:06d}"
        table[key] = {"i": i, "sq": i * i, "tags": [str(i % 7), str(i % 11)], "blob": "x" * (i % 97)}
    return table
table = build(N)
text = json.dumps(table, sort_keys=True)
print("built", len(table), hashlib.sha256(text.encode()).hexdigest(), flush=True)
sys.stdin.readline()
for i in range(0, N, 3):
    del table[f"k{i:06d}"]
again = json.loads(json.dumps(table, sort_keys=True))
print("after", len(again), sum(v["sq"] for v in again.values()) % 1000003)
print(hashlib.sha256(json.dumps(again, sort_keys=True).encode()).hexdigest())
"""


@pytest.mark.parametrize("rate", list(RATES))
def test_python3_workload(rate, run_cli, tmp_path):
    # GIVEN python3 (the interpreter running these tests) building and
    # serialising a 60000-entry table (6000 at guard rate 1), with
    # PYTHONMALLOC=malloc so every object is a libtag block
    n = int(60000 * RATES[rate])
    argv = [sys.executable, "-s", "-c", f"N = {n}\n" + PY_WORKLOAD]
    # WHEN it runs plain and under libtag, snapshotted while it waits for a line
    doc = check_same_and_clean(argv, b"", b"go\n", tmp_path, run_cli, rate=rate,
                               env={"PYTHONMALLOC": "malloc"})
    # THEN (checked above) same output, no anomalies; the heap holds the table's objects
    assert doc["heap"]["live_blocks"] > n


SQL_FIRST = b"""
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, payload BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000)
INSERT INTO t SELECT x, 'name-' || x, x % 37, zeroblob(x % 200) FROM c;
CREATE INDEX t_grp ON t(grp, name);
SELECT count(*), sum(length(payload)) FROM t;
"""
SQL_REST = b"""
DELETE FROM t WHERE id % 3 = 0;
SELECT grp, count(*), min(name), max(name) FROM t GROUP BY grp ORDER BY grp;
SELECT group_concat(name, ',') FROM (SELECT name FROM t WHERE grp = 5 ORDER BY name LIMIT 20);
PRAGMA integrity_check;
"""


@pytest.mark.parametrize("rate", list(RATES))
def test_sqlite3_script(rate, run_cli, tmp_path):
    # GIVEN the sqlite3 shell (Debian package) on an in-memory database of
    # 20000 rows (2000 at guard rate 1)
    sqlite3 = shutil.which("sqlite3")
    if sqlite3 is None:
        pytest.skip("sqlite3 is not installed (.ci/run installs it: apt-get install sqlite3)")
    first = SQL_FIRST.replace(b"20000", b"%d" % int(20000 * RATES[rate]))
    # WHEN it runs the script plain and under libtag, snapshotted between its halves
    check_same_and_clean([sqlite3, ":memory:"], first, SQL_REST, tmp_path, run_cli, rate=rate)
    # THEN (checked in check_same_and_clean) the same output and a clean core


def _make_repo(repo: Path, commits: int) -> list[str]:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True,
                              capture_output=True, text=True).stdout

    repo.mkdir()
    git("init", "-q", "-b", "main")
    for i in range(commits):
        for j in range(5):
            (repo / f"f{j}.txt").write_text("".join(f"line {k} of {i}/{j}\n" for k in range(i * 20 + j)))
        git("add", "-A")
        git("commit", "-q", "-m", f"commit {i}")
    return git("rev-list", "--objects", "--all").split()[::1]


@pytest.mark.parametrize("rate", list(RATES))
def test_git_cat_file_batch(rate, run_cli, tmp_path):
    # GIVEN git and a repository of 30 commits of 5 growing files (3 at
    # guard rate 1)
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    objects = [w for w in _make_repo(tmp_path / "repo", int(30 * RATES[rate])) if len(w) == 40]
    half = len(objects) // 2
    first = "".join(f"{o}\n" for o in objects[:half]).encode()
    rest = "".join(f"{o}\n" for o in objects[half:]).encode()
    # WHEN git cat-file --batch prints every object, plain and under libtag,
    # snapshotted when it has served half of them
    argv = [shutil.which("git"), "-C", str(tmp_path / "repo"), "cat-file", "--batch"]
    check_same_and_clean(argv, first, rest, tmp_path, run_cli, rate=rate)
    # THEN (checked in check_same_and_clean) the same bytes and a clean core


@pytest.fixture(scope="module")
def brotli_tool(tmp_path_factory) -> Path:
    sdist = SDIST_DIR / BROTLI_SDIST
    if not sdist.is_file():
        pytest.skip(f"{sdist} is not there: .ci/run fetches it with "
                    f"'pip download --no-binary :all: --no-deps brotli==1.2.1 -d {SDIST_DIR}'")
    work = tmp_path_factory.mktemp("brotli")
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    src = work / BROTLI_SDIST.removesuffix(".tar.gz") / "c"
    exe = work / "brotli"
    sources = sorted(str(p) for d in ("common", "dec", "enc") for p in (src / d).glob("*.c"))
    cmd = ["gcc", "-g", "-O1", "-fno-omit-frame-pointer", "-finstrument-functions",
           f"-I{src / 'include'}", *sources, str(src / "tools" / "brotli.c"), "-lm", "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return exe


def _text(n: int) -> bytes:
    return b"".join(b"%d: the quick brown fox %d jumps over %x lazy dogs\n" % (i, i * i, i * 7919 % 65536)
                    for i in range(n))


@pytest.mark.parametrize("rate", list(RATES))
def test_brotli_built_with_instrumentation(rate, brotli_tool, run_cli, tmp_path):
    # GIVEN the brotli tool built from its sdist with -finstrument-functions,
    # and 60000 lines of text (6000 at guard rate 1)
    data = _text(int(60000 * RATES[rate]))
    half = len(data) // 2
    # WHEN it compresses from stdin at quality 9, plain and under libtag,
    # snapshotted when it has read half of its input
    doc = check_same_and_clean([str(brotli_tool), "-c", "-q", "9", "-w", "22"], data[:half], data[half:],
                               tmp_path, run_cli, rate=rate)
    # THEN (checked in check_same_and_clean) the same compressed bytes, a clean core,
    # and the encoder's blocks carry full instrumented stacks from brotli's main
    assert any(f["function"] == "main" and (f["file"] or "").endswith("tools/brotli.c")
               for s in doc["top_stacks"] for f in s["stack"]), doc["top_stacks"]
    # AND what it wrote decompresses, under libtag too, to the input
    packed = (tmp_path / "out-tag").read_bytes()
    env = {**os.environ, "LD_PRELOAD": str(libpath.lib_path()), "LIBTAG_DIR": str(tmp_path / "snaps"),
           "LIBTAG_GUARD_RATE": rate}
    back = subprocess.run([str(brotli_tool), "-d", "-c"], input=packed, capture_output=True,
                          env=env, timeout=TIMEOUT)
    assert (back.returncode, back.stdout == data, back.stderr) == (0, True, b"")
