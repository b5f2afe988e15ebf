"""The gdb `tag` commands, in real gdb (--batch -nx, and interactive through
pexpect), on a real libtag core and on a live process: they load from the
installed package, answer what the command line answers on the same core, and
fail with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forensics import libpath

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")

TIMEOUT = 180
MARK = "@@tag-test@@"


def _script() -> str:
    from forensics.gdb import SCRIPT

    return SCRIPT


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["XDG_STATE_HOME"] = str(tmp / "state")
    env.update(extra)
    return env


def cli(tmp: Path, *args: object) -> subprocess.CompletedProcess:
    """The forensics command line, as a user runs it (cwd outside the checkout)."""
    return subprocess.run([sys.executable, "-m", "forensics", *map(str, args)],
                          cwd=tmp, env=_env(tmp), capture_output=True, text=True, timeout=TIMEOUT, check=False)


def gdb_batch(tmp: Path, *commands: str, args: tuple = (), pre: tuple = (), env: dict | None = None,
              source: bool = True) -> tuple[subprocess.CompletedProcess, list[str]]:
    """gdb --batch -nx ARGS: sources the script, runs the pre commands, then the
    commands, each one's stdout split out by a marker."""
    argv = ["gdb", "--batch", "-nx", "-iex", "set debuginfod enabled off"]
    if source:
        argv += ["-ex", f"source {_script()}"]
    for c in pre:
        argv += ["-ex", c]
    for c in commands:
        argv += ["-ex", f"echo {MARK}\\n", "-ex", c]
    argv += ["-ex", f"echo {MARK}\\n"]  # what gdb prints on exit (detach, kill) comes after
    argv += [str(a) for a in args]
    result = subprocess.run(argv, cwd=tmp, env=env or _env(tmp), capture_output=True,
                            text=True, timeout=TIMEOUT, check=False)
    parts = result.stdout.split(MARK + "\n")[1:-1]
    assert len(parts) == len(commands), (
        f"expected {len(commands)} outputs, got {len(parts)}:\n{result.stdout}\n{result.stderr}")
    return result, parts


def cli_json(tmp: Path, *args: object) -> dict:
    result = cli(tmp, *args, "--json")
    assert result.stdout.startswith("{"), f"forensics {args} --json: exit {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def addresses(stdout: str) -> dict[str, int]:
    return {k: int(v, 16) for k, v in (line.split("=", 1) for line in stdout.splitlines()
                                       if "=0x" in line)}


def frames(block: dict, key: str) -> list[str | None]:
    return [f["function"] for f in block[key]]


@pytest.fixture(scope="module", autouse=True)
def gdb_python_matches() -> None:
    """gdb's embedded Python must be the installed package's minor version
    (numpy's compiled modules load into no other); the loader says so itself,
    tested below - the other tests need a gdb that can load it at all."""
    out = subprocess.run(["gdb", "--batch", "-nx", "-ex", "python import sys; print(*sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=TIMEOUT, check=False).stdout.split()
    if out != [str(sys.version_info[0]), str(sys.version_info[1])]:
        pytest.skip(f"gdb embeds Python {'.'.join(out) or '(none)'}, forensics is installed for "
                    f"{sys.version_info[0]}.{sys.version_info[1]}")


@pytest.fixture(scope="module")
def victim(build_victim) -> Path:
    return build_victim("gdb_victim")


@pytest.fixture(scope="module")
def snap(victim, tmp_path_factory) -> dict:
    """The double-free snapshot core of gdb_victim snap, and the printed addresses."""
    tmp = tmp_path_factory.mktemp("gdbsnap")
    result = subprocess.run(
        [sys.executable, "-m", "forensics", "run", "--dir", str(tmp / "snaps"), "--", str(victim), "snap"],
        cwd=tmp, env=_env(tmp, LIBTAG_CORE="self"), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert result.returncode == 0, f"expected gdb_victim snap to exit 0: {result.stderr}"
    assert "after the double free" in result.stdout, result.stdout
    cores = sorted((tmp / "snaps").glob("*-double-free/core*"))
    cores = [c for c in cores if c.name == "core" or c.name.startswith("core.") and c.suffix != ".npz"]
    assert len(cores) == 1, f"expected one double-free core, got {cores}"
    return {"tmp": tmp, "core": cores[0], "addr": addresses(result.stdout)}


# ---------------------------------------------------------------- on a core --


def test_whoowns_in_gdb_prints_what_the_cli_prints_on_the_same_core(snap, victim):
    tmp, core, addr = snap["tmp"], snap["core"], snap["addr"]
    session = addr["session"]
    # GIVEN the CLI's answers about the session block (held by the global g_session)
    want_json = cli_json(tmp, "whoowns", hex(session + 4), "--core", core)
    want_text = cli(tmp, "whoowns", hex(session + 4), "--core", core).stdout
    # WHEN gdb, with the script sourced, opens the same core and asks the same,
    # once by number and once by a gdb expression
    result, (as_json, as_text, by_expr) = gdb_batch(
        tmp, f"tag whoowns --json {session + 4:#x}", f"tag whoowns {session + 4:#x}",
        "tag whoowns --json (char *)g_session + 4", args=(victim, core))
    # THEN both forms are the CLI's, byte for byte
    assert json.loads(as_json) == want_json, f"gdb said {as_json}\nCLI said {want_json}"
    assert as_text == want_text, f"gdb said:\n{as_text}\nCLI said:\n{want_text}"
    assert json.loads(by_expr) == want_json, f"gdb said {by_expr}"
    # ... and that answer is the session block, live, from session_new, held by the global
    block = want_json["block"]
    assert (block["start"], block["size"], block["state"], block["offset"]) == (hex(session), 48, "live", 4)
    assert frames(block, "alloc_stack")[:2] == ["session_new", "main"], block["alloc_stack"]
    assert "global" in [r["in"] for r in want_json["referrers"]], want_json["referrers"]
    assert result.returncode == 0, f"expected gdb exit 0: {result.stderr}"


def test_inspect_in_gdb_is_the_cli_inspect_of_the_same_core(snap, victim):
    tmp, core, addr = snap["tmp"], snap["core"], snap["addr"]
    # GIVEN the CLI's inspect of the core
    want_json = cli_json(tmp, "inspect", "--top", "3", core)
    want_text = cli(tmp, "inspect", "--top", "3", core).stdout
    # WHEN gdb inspects it
    _, (as_json, as_text) = gdb_batch(tmp, "tag inspect --json --top 3", "tag inspect --top=3",
                                      args=(victim, core))
    # THEN the same document and the same text
    assert json.loads(as_json) == want_json, f"gdb said {as_json}\nCLI said {want_json}"
    assert as_text == want_text, f"gdb said:\n{as_text}\nCLI said:\n{want_text}"
    # ... which is the double free of `twice`, freed first by twice_free
    (anomaly,) = want_json["anomalies"]
    assert (anomaly["kind"], anomaly["address"]) == ("double-free", hex(addr["twice"])), anomaly
    assert frames(anomaly["block"], "free_stack")[:2] == ["twice_free", "main"], anomaly["block"]


def test_block_shows_a_freed_block_with_both_stacks(snap, victim):
    tmp, core, addr = snap["tmp"], snap["core"], snap["addr"]
    scratch = addr["scratch"]
    # GIVEN the CLI's view of the freed scratch block
    want = cli_json(tmp, "whoowns", hex(scratch + 8), "--core", core)["block"]
    # WHEN gdb asks `tag block` for an address inside it
    _, (as_json, as_text) = gdb_batch(tmp, f"tag block --json {scratch + 8:#x}", f"tag block {scratch + 8}",
                                      args=(victim, core))
    # THEN the block is the CLI's: freed, 200 bytes, offset 8, allocated by
    # scratch_fill, freed by scratch_drop
    assert as_json.startswith("{"), f"gdb said {as_json!r}: {_.stderr}"
    got = json.loads(as_json)
    assert got == want, f"gdb said {got}\nCLI said {want}"
    assert (got["start"], got["size"], got["state"], got["offset"]) == (hex(scratch), 200, "freed", 8)
    assert frames(got, "alloc_stack")[:2] == ["scratch_fill", "main"], got["alloc_stack"]
    assert frames(got, "free_stack")[:2] == ["scratch_drop", "main"], got["free_stack"]
    first = as_text.splitlines()[0]
    assert first == f"block {scratch:#x}  200 bytes  freed  offset 8", f"got {first!r}"


def test_a_heap_referrer_is_named_with_its_block(snap, victim):
    tmp, core, addr = snap["tmp"], snap["core"], snap["addr"]
    # GIVEN the list's second node, pointed to only by the first node's ->next
    # WHEN gdb asks who owns it
    _, (out,) = gdb_batch(tmp, f"tag whoowns --json {addr['list_next']:#x}", args=(victim, core))
    doc = json.loads(out)
    # THEN its referrer is the first node, at the start of its block
    heap_refs = [r for r in doc["referrers"] if r["in"] == "heap"]
    assert heap_refs == [{"address": hex(addr["list"]), "in": "heap", "block_start": hex(addr["list"]),
                          "interior": False, "thread": None, "module": None, "symbol": None}], doc


def test_errors_are_one_line_gdb_errors(snap, victim, tmp_path):
    tmp, core = snap["tmp"], snap["core"]
    # GIVEN the core in gdb
    # WHEN tag block is asked about a global, the NULL page, and with a bad option
    result, outs = gdb_batch(tmp, "tag block &g_session", "tag block 0", "tag inspect --bogus",
                             "tag whoowns no_such_symbol", args=(victim, core))
    # THEN each is one error line on stderr, nothing on stdout
    assert outs == ["", "", "", ""], f"expected no output, got {outs}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("tag ")]
    exe = os.path.basename(victim)
    g = _symbol_address(tmp, victim, core, "g_session")
    assert errors == [
        f"tag block: {g:#x} is in no tagged block: globals of {exe}, g_session (.bss) in {victim}",
        "tag block: 0x0 is in no tagged block: unmapped, NULL page",
        "tag inspect: unknown option --bogus (options: --json --debug-dir DIR --sysroot DIR --leaks --top N "
        "--blocks N --runtime --runtime-function PATTERN)",
        'tag whoowns: not an address: no_such_symbol: No symbol "no_such_symbol" in current context.',
    ], result.stderr
    # WHEN a batch gdb's last command is a failing tag command
    last = subprocess.run(["gdb", "--batch", "-nx", "-ex", f"source {_script()}", "-ex", "tag block 0",
                           str(victim), str(core)], cwd=tmp, env=_env(tmp), capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)
    # THEN gdb exits 1, as scripts expect of a failed command
    assert last.returncode == 1, f"expected gdb exit 1, got {last.returncode}: {last.stderr}"
    # WHEN gdb has neither a process nor a core
    result, (out,) = gdb_batch(tmp_path, "tag inspect")
    assert out == "", out
    # THEN it says what to do
    assert result.stderr.splitlines()[-1] == (
        "tag inspect: no process and no core: open a core (core-file CORE), run the program, or attach PID"
    ), result.stderr


def _symbol_address(tmp: Path, exe: Path, core: Path, name: str) -> int:
    _, (out,) = gdb_batch(tmp, f"print/x (long)&{name}", args=(exe, core), source=False)
    return int(out.split("=", 1)[1], 16)


def test_leaks_in_gdb_match_the_cli(snap, victim):
    tmp, core = snap["tmp"], snap["core"]
    # GIVEN a core with one leaked block (leak_make drops its only pointer)
    # WHEN gdb is asked for the leaks of the core
    result, (as_json, as_text) = gdb_batch(tmp, "tag leaks --json", "tag leaks", args=(victim, core))
    # THEN they are the CLI's inspect --leaks ones: the 64 bytes of leak_make
    want = cli_json(tmp, "inspect", "--leaks", core)["leaks"]
    got = json.loads(as_json)
    assert got == {"leaks": want}, f"gdb said {as_json}\nCLI said {want}"
    assert [(g["kind"], g["blocks"], g["bytes"], frames(g, "stack")[:2]) for g in got["leaks"]] == [
        ("definite", 1, 64, ["leak_make", "main"])], got
    assert "leak_make" in as_text, as_text
    # ... and tag inspect --leaks is the CLI's inspect --leaks, the verb's own option
    _, (both,) = gdb_batch(tmp, "tag inspect --json --leaks --top 3", args=(victim, core))
    assert json.loads(both) == cli_json(tmp, "inspect", "--leaks", "--top", "3", core), both


def test_the_loader_finds_the_package_through_the_users_python(snap, victim, tmp_path):
    tmp, core, addr = snap["tmp"], snap["core"], snap["addr"]
    # GIVEN the checkout's gdb_scripts/forensics_gdb.py (not inside site-packages:
    # the loader must ask FORENSICS_PYTHON where forensics is installed)
    script = Path(__file__).resolve().parents[2] / "gdb_scripts" / "forensics_gdb.py"
    if not script.exists():
        pytest.skip("no source checkout beside the tests")
    env = _env(tmp, FORENSICS_PYTHON=sys.executable)
    # WHEN gdb sources it and asks for a block
    result, (out, where) = gdb_batch(
        tmp, f"tag block --json {addr['session']:#x}",
        "python import forensics; print(forensics.__file__)",
        pre=(f"source {script}",), args=(victim, core), env=env, source=False)
    # THEN the commands work, from the installed package
    assert json.loads(out)["start"] == hex(addr["session"]), result.stderr
    import forensics

    assert where.strip() == forensics.__file__, f"gdb imported {where.strip()}"
    # WHEN FORENSICS_PYTHON names a python without forensics
    bad = tmp_path / "python3"
    bad.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no forensics here' >&2\nexit 1\n")
    bad.chmod(0o755)
    result, _ = gdb_batch(tmp, pre=(f"source {script}",), env=_env(tmp, FORENSICS_PYTHON=str(bad)),
                          source=False)
    # THEN one line says so
    assert result.stderr.strip() == (
        f"forensics: the tag commands are not loaded: {bad} cannot import forensics "
        f"(ModuleNotFoundError: no forensics here)"), result.stderr
    # WHEN FORENSICS_PYTHON names a python of another minor version than gdb's
    other = tmp_path / "python3.99"
    other.write_text("#!/bin/sh\necho '{\"path\": [], \"version\": [3, 99], \"pkg\": \"/nowhere/forensics\"}'\n")
    other.chmod(0o755)
    result, _ = gdb_batch(tmp, pre=(f"source {script}",), env=_env(tmp, FORENSICS_PYTHON=str(other)),
                          source=False)
    # THEN one line says which versions differ and what to do
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert result.stderr.strip() == (
        f"forensics: the tag commands are not loaded: {other} is Python 3.99 but gdb embeds Python {mine}: "
        f"install forensics for Python {mine} and set FORENSICS_PYTHON to that python"), result.stderr


# ------------------------------------------------------------ on a live one --


def test_live_process_in_gdb_answers_like_the_cli_on_its_gcore(victim, tmp_path):
    # GIVEN gdb_victim run under gdb with libtag preloaded, stopped in at_rest(1)
    gcore = tmp_path / "live.core"
    result, (live, text, _, from_core) = gdb_batch(
        tmp_path,
        "tag whoowns --json g_list->next", "tag block g_session", f"gcore {gcore}",
        "tag whoowns --json g_list->next",
        pre=("set startup-with-shell off", f"set environment LD_PRELOAD={libpath.lib_path()}",
             "break at_rest", "run"),
        args=("--args", victim, "steps"),
    )
    # WHEN the CLI reads the core gdb wrote of that stopped process
    doc = json.loads(live)
    want = cli_json(tmp_path, "whoowns", doc["address"], "--core", gcore)
    # THEN the live answer is the CLI's on the core: the list's second node,
    # 32 bytes from list_push, referred to by the first node
    # a gcore core has no time of its own (libtag did not take it): its ages
    # are unknown, the live process's are at the instant gdb answered
    assert want["block"]["age_s"] is None and doc["block"]["age_s"] >= 0, (doc["block"], want["block"])
    assert {**doc["block"], "age_s": None} == want["block"], f"live {doc['block']}\ncore {want['block']}"
    assert doc["referrers"] == want["referrers"], f"live {doc['referrers']}\ncore {want['referrers']}"
    assert (doc["owner"], doc["block"]["size"], doc["block"]["state"]) == ("heap", 32, "live")
    assert frames(doc["block"], "alloc_stack")[:2] == ["list_push", "main"], doc["block"]
    assert json.loads(from_core) == doc, "the snapshot changed while the process stayed stopped"
    assert "48 bytes  live  offset 0" in text.splitlines()[0], text
    assert result.returncode == 0, result.stderr


def test_attach_to_a_running_process_then_snapshot_it_after(victim, tmp_path):
    # GIVEN gdb_victim wait running under libtag (not under gdb)
    env = _env(tmp_path, LD_PRELOAD=str(libpath.lib_path()), LIBTAG_DIR=str(tmp_path / "snaps"))
    proc = subprocess.Popen([str(victim), "wait"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or not lines[-1].startswith("ready pid="):
            line = proc.stdout.readline()
            assert line, f"victim exited early: {lines}"
            lines.append(line.strip())
        addr = addresses("\n".join(lines))
        # WHEN gdb attaches, asks about the session block and detaches
        result, (out,) = gdb_batch(tmp_path, f"tag block --json {addr['session']:#x}",
                                   args=("-p", proc.pid))
        assert out.startswith("{"), f"gdb said {out!r}: {result.stderr}"
        got = json.loads(out)
        # ... and afterwards the CLI snapshots the (still running) process
        snapped = cli(tmp_path, "snapshot", "--dir", tmp_path / "snaps", "--json", proc.pid)
        assert snapped.returncode == 0, snapped.stderr
        core = json.loads(snapped.stdout)["core"]
        want = cli_json(tmp_path, "whoowns", hex(addr["session"]), "--core", core)
    finally:
        proc.stdin.close()
        proc.wait(timeout=TIMEOUT)
    # THEN gdb's block is the CLI's, and the process ran on after the detach
    # (its age is at the instant each answer was taken: the live one first)
    assert got["age_s"] <= want["block"]["age_s"], (got, want["block"])
    got["age_s"] = want["block"]["age_s"]
    assert got == want["block"], f"gdb said {got}\nCLI said {want['block']}"
    assert (got["size"], got["state"], frames(got, "alloc_stack")[:2]) == (48, "live", ["session_new", "main"])
    assert proc.returncode == 0, f"expected the victim to exit 0 after stdin closed, got {proc.returncode}"


def test_interactive_gdb_sees_the_block_freed_after_continue(victim, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    # GIVEN an interactive gdb running gdb_victim steps under libtag
    child = pexpect.spawn("gdb", ["-nx", "-q", "-iex", "set debuginfod enabled off", str(victim)],
                          env=_env(tmp_path, TERM="dumb"), cwd=str(tmp_path),
                          encoding="utf-8", timeout=60, dimensions=(50, 200))
    prompt = r"\(gdb\) "
    try:
        child.expect(prompt)
        for cmd in (f"source {_script()}", "set pagination off", "set startup-with-shell off",
                    f"set environment LD_PRELOAD={libpath.lib_path()}", "break at_rest"):
            child.sendline(cmd)
            child.expect(prompt)
        child.sendline("run steps")
        child.expect(r"session=(0x[0-9a-f]+)")
        session = int(child.match.group(1), 16)
        child.expect(r"at_rest \(step=(?:step@entry=)?1\)")
        child.expect(prompt)
        # WHEN the user asks about the session block at the first stop
        child.sendline("tag block g_session")
        child.expect(prompt)
        first = child.before
        # ... continues to the second stop (the session freed in between) and asks again
        child.sendline("continue")
        child.expect(r"at_rest \(step=(?:step@entry=)?2\)")
        child.expect(prompt)
        child.sendline(f"tag block {session:#x}")
        child.expect(prompt)
        second = child.before
        child.sendline("tag block 0")
        child.expect(prompt)
        error = child.before
    finally:
        child.sendline("kill")
        child.sendline("y")
        child.sendline("quit")
        child.expect(pexpect.EOF)
        child.close()
    # THEN first live, then freed by session_end - the stale snapshot was dropped
    assert f"block {session:#x}  48 bytes  live  offset 0" in first, first
    assert f"block {session:#x}  48 bytes  freed  offset 0" in second, second
    assert "freed by thread" in second and "session_end" in second, second
    # ... and an error is one line
    assert [line for line in error.splitlines() if line.strip()][-1].strip() == (
        "tag block: 0x0 is in no tagged block: unmapped, NULL page"), error
