"""inspect and whoowns refuse bad input with exit 2 and ONE line
``forensics: error: ...`` on stderr - no traceback, nothing on stdout - and
whoowns answers "no block" with exit 1.

Every input is real and made per run without a compiler: a libtag core of
`sleep` (sleep under LD_PRELOAD of the packaged libtag, asked for an
on-demand snapshot with SIGUSR2), gdb's gcore of a plain `sleep` (skipped
without gdb), cuts of the libtag core, /bin/sleep itself, a directory, an
empty file and a text file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from forensics import libpath
from forensics.snapshots import snapdir

SLEEP = shutil.which("sleep") or "/bin/sleep"
VERBS = ["inspect", "whoowns"]


def argv(verb: str, core: os.PathLike | str) -> list[str]:
    return ["inspect", str(core)] if verb == "inspect" else ["whoowns", "0x1000", "--core", str(core)]


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def assert_one_error(result, *needles: str) -> str:
    """exit 2, stdout empty, exactly one stderr line starting 'forensics: error: '
    that names every needle; returns that line."""
    lines = stderr_lines(result)
    assert result.returncode == 2, (
        f"expected exit 2, got {result.returncode}: {result.stdout!r} {result.stderr!r}")
    assert len(lines) == 1, f"expected exactly 1 line on stderr, got {lines!r}"
    assert lines[0].startswith("forensics: error: "), f"expected 'forensics: error: ', got {lines[0]!r}"
    assert "Traceback" not in result.stderr, f"expected no traceback, got {result.stderr!r}"
    for needle in needles:
        assert needle in lines[0], f"expected {needle!r} in the error, got {lines[0]!r}"
    assert result.stdout == "", f"expected nothing on stdout, got {result.stdout!r}"
    return lines[0]


@pytest.fixture
def cli(run_cli, tmp_path):
    """run_cli with a private XDG_STATE_HOME (no catalog, no symbol cache of the user)."""
    state = tmp_path / "state"

    def run(*args: str, env: dict[str, str] | None = None):
        return run_cli(*args, env={"XDG_STATE_HOME": str(state), **(env or {})})

    return run


@pytest.fixture(scope="module")
def libtag_core(tmp_path_factory) -> Path:
    """A real libtag core: `sleep 60` under libtag, snapshotted on demand."""
    snaps = tmp_path_factory.mktemp("sleep-snaps")
    snaps.chmod(0o700)
    env = dict(os.environ, LD_PRELOAD=str(libpath.lib_path()), LIBTAG_DIR=str(snaps),
               LIBTAG_CORE="self")
    proc = subprocess.Popen([SLEEP, "60"], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not catches(proc.pid, signal.SIGUSR2):  # libtag's constructor has run
            assert time.monotonic() < deadline, "sleep under libtag never caught SIGUSR2"
            time.sleep(0.02)
        proc.send_signal(signal.SIGUSR2)
        while not list(snaps.glob(f"*-{proc.pid}-1-on-demand")):
            assert time.monotonic() < deadline, f"no snapshot dir in {snaps}"
            time.sleep(0.02)
        snap = snapdir.wait_complete(next(snaps.glob(f"*-{proc.pid}-1-on-demand")), 60)
        core = snapdir.find_core(snap.path)
        assert core is not None, f"expected a core in {snap.path}"
        return core
    finally:
        proc.kill()
        proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def plain_gcore(tmp_path_factory) -> Path:
    """gdb's gcore of a `sleep` that never loaded libtag."""
    if shutil.which("gcore") is None:
        pytest.skip("gcore (gdb) is not installed")
    workdir = tmp_path_factory.mktemp("gcore")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen([SLEEP, "60"], env=env)
    try:
        time.sleep(0.2)  # let it exec
        prefix = workdir / "gcore"
        subprocess.run(["gcore", "-o", str(prefix), str(proc.pid)], capture_output=True,
                       timeout=120, check=True)
        return Path(f"{prefix}.{proc.pid}")
    finally:
        proc.kill()
        proc.wait(timeout=10)


def catches(pid: int, sig: int) -> bool:
    """Whether pid has a handler for sig (SigCgt of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    return False


def cut(src: Path, dst: Path, size: int) -> Path:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(size))
    return dst


# ------------------------------------------------------------ not a core --


@pytest.mark.parametrize("verb", VERBS)
def test_missing_core(verb, cli, tmp_path):
    missing = tmp_path / "no-such-core"
    # WHEN
    result = cli(*argv(verb, missing))
    # THEN
    line = assert_one_error(result, str(missing))
    assert line == f"forensics: error: no such core: {missing}", line


@pytest.mark.parametrize("verb", VERBS)
def test_empty_file(verb, cli, tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    line = assert_one_error(cli(*argv(verb, empty)), str(empty))
    assert line == f"forensics: error: empty file: {empty} is 0 bytes", line


@pytest.mark.parametrize("verb", VERBS)
def test_text_file(verb, cli, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a core\n")
    line = assert_one_error(cli(*argv(verb, text)), str(text))
    assert line == f"forensics: error: not an ELF file: {text} (magic b'hell')", line


@pytest.mark.parametrize("verb", VERBS)
def test_elf_executable(verb, cli):
    exe = os.path.realpath(SLEEP)
    assert_one_error(cli(*argv(verb, exe)), f"not a core file: {exe}", "ET_DYN")


@pytest.mark.parametrize("verb", VERBS)
def test_directory(verb, cli, tmp_path):
    folder = tmp_path / "a-dir"
    folder.mkdir()
    line = assert_one_error(cli(*argv(verb, folder)))
    assert line == f"forensics: error: not a regular file: {folder} is a directory", line


def test_core_of_a_process_without_libtag_is_read_from_glibc(cli, plain_gcore):
    # WHEN inspect reads gcore's core of a sleep that never loaded libtag
    result = cli("inspect", str(plain_gcore))
    # THEN it answers from glibc's heap (tests/integration/test_glibc_heap.py
    # checks those answers), saying what is unknown without libtag
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    assert "reason on-demand" in result.stdout, result.stdout
    assert ("no libtag: allocation and free stacks, times and threads are unknown - run the "
            "program under `forensics run` for them") in result.stdout, result.stdout


def test_whoowns_without_libtag_says_what_an_unmapped_address_is(cli, plain_gcore):
    # WHEN whoowns asks about 0x1000 in that core
    result = cli(*argv("whoowns", plain_gcore))
    # THEN exit 1: no chunk holds it, and nothing is mapped there
    assert result.returncode == 1, f"expected exit 1, got {result.returncode}: {result.stderr}"
    assert result.stdout.splitlines()[:2] == ["0x1000: unmapped", "  in no mapping of the process"], (
        result.stdout)


def test_trend_refuses_a_core_without_libtag_and_says_why(cli, plain_gcore):
    # (diff compares two such cores by chunk size: test_glibc_diff.py; report
    # draws them: test_glibc_report.py)
    line = assert_one_error(cli("trend", str(plain_gcore), str(plain_gcore)))
    assert line == (f"forensics: error: trend: {plain_gcore} is a core without libtag: trend follows "
                    f"allocation stacks, which only libtag records; diff (by chunk size) and report "
                    f"take such cores"), line


def test_report_of_a_core_without_libtag_is_written(cli, plain_gcore, tmp_path):
    # WHEN report is given gcore's core of sleep, which never loaded libtag
    page = tmp_path / "r.html"
    result = cli("report", str(plain_gcore), "-o", str(page))
    # THEN the page is written from glibc's heap, and says it has no stacks
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    assert result.stdout.startswith(f"wrote {page}: 1 snapshot(s), "), result.stdout
    assert result.stdout.rstrip().endswith("without libtag: no stacks"), result.stdout


# ---------------------------------------------------------- truncated cores --


def test_the_uncut_libtag_core_is_read(cli, libtag_core):
    # sanity for the cuts below: the whole core answers
    result = cli("inspect", str(libtag_core))
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    assert "reason on-demand" in result.stdout, result.stdout


@pytest.mark.parametrize("verb", VERBS)
def test_core_cut_inside_its_program_headers(verb, cli, libtag_core, tmp_path):
    short = cut(libtag_core, tmp_path / "core.cut", 200)
    assert_one_error(cli(*argv(verb, short)), f"truncated core: {short} is 200 bytes")


@pytest.mark.parametrize("verb", VERBS)
def test_core_cut_before_libtag_control_block(verb, cli, libtag_core, tmp_path):
    # GIVEN the first 4 KiB past the headers and notes only: no segment data
    from forensics.core import Core

    with Core(libtag_core) as core:
        first_data = min(s.offset for s in core.segments if s.dumped)
    short = cut(libtag_core, tmp_path / "core.cut", first_data)
    # THEN it is refused: nothing of libtag can be read
    assert_one_error(cli(*argv(verb, short)), f"no libtag control block in core {short}",
                     "truncated core")


def test_core_cut_in_its_last_segment_gives_a_partial_answer_and_a_warning(cli, libtag_core,
                                                                            tmp_path):
    # GIVEN the core without its last page (the end of the last segment)
    size = libtag_core.stat().st_size
    short = cut(libtag_core, tmp_path / "core.cut", size - 4096)
    # WHEN
    result = cli("inspect", "--json", str(short))
    # THEN the heap is still read, and the document warns of the missing bytes
    import json

    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    doc = json.loads(result.stdout)
    assert doc["reason"] == "on-demand", doc["reason"]
    assert len(doc["warnings"]) == 1 and "lacks 4096 bytes" in doc["warnings"][0], doc["warnings"]
    assert result.stderr == "", f"expected nothing on stderr with --json, got {result.stderr!r}"


# ---------------------------------------------------------- bad addresses --


@pytest.mark.parametrize("text", ["0xzz", "12abc", "", "0x", "-5", "0x10000000000000000",
                                  " 0x10", "0x1.5", "ten"])
def test_bad_address_string(text, cli, libtag_core):
    result = cli("whoowns", text, "--core", str(libtag_core))
    line = assert_one_error(result, "argument ADDR: ", repr(text))
    assert line.endswith("see 'forensics whoowns --help'"), line


@pytest.mark.parametrize("text,value", [("0x1000", "0x1000"), ("4096", "0x1000"),
                                        ("0X1000", "0x1000"), ("0", "0x0")])
def test_good_address_strings_in_no_block_exit_1(text, value, cli, libtag_core):
    # WHEN an address in no tagged block (the NULL page, the page above it)
    result = cli("whoowns", text, "--core", str(libtag_core), "--json")
    # THEN exit 1, the address printed back as hex, owner unmapped
    import json

    assert result.returncode == 1, f"expected exit 1, got {result.returncode}: {result.stderr}"
    doc = json.loads(result.stdout)
    assert (doc["address"], doc["owner"], doc["block"], doc["referrers"]) == (value, "unmapped", None, [])
    assert doc["note"] == ("NULL page" if value == "0x0" else "in no mapping of the process"), doc


# ------------------------------------------------------------ bad sources --


def test_whoowns_with_an_empty_catalog(cli):
    line = assert_one_error(cli("whoowns", "0x1000"))
    assert line.startswith("forensics: error: no snapshot in the catalog: give --core CORE "
                           "or --pid PID"), line


def test_whoowns_pid_of_no_process(cli):
    # a pid above the kernel's pid_max cannot exist
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert_one_error(cli("whoowns", "0x1000", "--pid", str(pid_max + 1)),
                     f"no process with pid {pid_max + 1}")


def test_whoowns_pid_of_a_process_without_libtag(cli):
    # a process without libtag is snapshot by ptrace (test_ptrace_snapshot.py),
    # and the address is answered in that core: 0x1000 is in no mapping
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen([SLEEP, "60"], env=env)
    try:
        time.sleep(0.2)
        result = cli("whoowns", "0x1000", "--pid", str(proc.pid))
        assert proc.poll() is None, "sleep must run on"
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[0].endswith(f"-{proc.pid}-1-on-demand/core (a new snapshot of pid {proc.pid})")
    assert lines[1] == "0x1000: unmapped", lines


@pytest.mark.parametrize("pid", ["0", "-3", "abc"])
def test_whoowns_bad_pid_string(pid, cli):
    assert_one_error(cli("whoowns", "0x1000", "--pid", pid), f"not a process id: {pid!r}")


@pytest.mark.parametrize("top", ["0", "x"])
def test_inspect_bad_top(top, cli, libtag_core):
    assert_one_error(cli("inspect", str(libtag_core), "--top", top), "argument --top")
