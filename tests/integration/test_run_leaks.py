"""forensics run --leaks: the leak check at exit, on real victims under the
real libtag (tests/victims/leak_exit.c prints every block it makes, its size
and the line of its malloc).

GIVEN a program that loses blocks and exits
WHEN it runs under forensics run --leaks (with and without suppressions)
THEN the lost blocks are reported by allocation stack with their exact bytes,
and the exit status is 23 when definite or indirect leaks remain, else the
program's own.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

LEAK_STATUS = 23


@pytest.fixture(scope="module")
def victim(build_victim):
    return build_victim("leak_exit")


def run_leaks(run_cli, tmp_path, exe, *args, options=(), env=None):
    full_env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    full_env.update(env or {})
    return run_cli("run", "--dir", tmp_path / "snaps", "--leaks", *options, "--", exe, *args,
                   env=full_env)


def blocks(stdout: str) -> dict[str, list[tuple[int, int, int | None]]]:
    """{name: [(address, size, line)]} from the victim's "block" lines."""
    out: dict[str, list] = {}
    for m in re.finditer(r"^block (\S+) (0x[0-9a-f]+) (\d+)(?: line=(\d+))?$", stdout, re.M):
        out.setdefault(m.group(1), []).append(
            (int(m.group(2), 16), int(m.group(3)), int(m.group(4)) if m.group(4) else None))
    return out


def pids(stdout: str) -> list[int]:
    return [int(p) for p in re.findall(r"^pid=(\d+)$", stdout, re.M)]


def report_groups(stderr: str) -> list[tuple[str, str, str]]:
    """(kind, amount, first frame line) of every group the report printed."""
    return re.findall(r"^(definite|indirect) leak of (.+?), allocated at:\n\s+#0 (.+)$", stderr, re.M)


def test_a_leaking_program_gets_its_stacks_with_exact_bytes_and_exit_23(run_cli, tmp_path, victim):
    # GIVEN / WHEN
    result = run_leaks(run_cli, tmp_path, victim, "leak", options=("--json", tmp_path / "leaks.json"))
    # THEN
    assert result.returncode == LEAK_STATUS, f"expected exit 23, got {result.returncode}: {result.stderr}"
    made = blocks(result.stdout)
    rec_line = made["record"][0][2]
    tree_line = made["tree"][0][2]
    groups = report_groups(result.stderr)
    src = "leak_exit.c"
    assert [(k, amount, re.sub(r"^0x[0-9a-f]+\s+", "", frame)) for k, amount, frame in groups] == [
        ("definite", "300 bytes in 3 blocks", f"lose_records at {victim_source()}:{rec_line}"),
        ("definite", "48 bytes in 1 block (+80 bytes in 2 blocks lost through it)",
         f"lose_tree at {victim_source()}:{tree_line}"),
        ("indirect", "40 bytes in 1 block", f"lose_tree at {victim_source()}:{tree_line + 1}"),
        ("indirect", "40 bytes in 1 block", f"lose_tree at {victim_source()}:{tree_line + 2}"),
    ], result.stderr
    pid = pids(result.stdout)[0]
    assert (f"SUMMARY: pid {pid}: 348 bytes in 4 blocks definitely lost, "
            f"80 bytes in 2 blocks indirectly lost") in result.stderr, result.stderr
    assert src in result.stderr
    # the JSON document says the same, with the blocks the victim printed
    doc = json.loads((tmp_path / "leaks.json").read_text())
    mode = stat.S_IMODE(os.lstat(tmp_path / "leaks.json").st_mode)
    assert mode == 0o600, oct(mode)
    assert (doc["exit_status"], doc["status"], doc["leaked"], doc["unchecked"]) == (0, 23, True, [])
    (proc,) = doc["processes"]
    assert (proc["pid"], proc["reason"], proc["exe"]) == (pid, "exit", str(victim))
    assert proc["totals"] == {"definite": {"blocks": 4, "bytes": 348},
                              "indirect": {"blocks": 2, "bytes": 80},
                              "possible": {"blocks": 0, "bytes": 0}}, proc["totals"]
    records = next(g for g in proc["leaks"] if g["stack"][0]["function"] == "lose_records")
    assert sorted(int(a, 16) for a in records["examples"]) == sorted(a for a, _, _ in made["record"])
    tree = next(g for g in proc["leaks"] if g["kind"] == "definite" and g["stack"][0]["function"] == "lose_tree")
    assert (tree["examples"], tree["indirect_blocks"], tree["indirect_bytes"]) == (
        [hex(made["tree"][0][0])], 2, 80)
    config = made["config"][0][0]
    assert all(hex(config) not in g["examples"] for g in proc["leaks"]), "a block a global holds is no leak"


def victim_source() -> str:
    return str(Path(__file__).resolve().parents[1] / "victims" / "leak_exit.c")


def test_suppressions_drop_the_leaks_and_the_status_is_the_programs(run_cli, tmp_path, victim):
    # GIVEN a suppression file in LSan's form and the bare form, with a comment
    supp = tmp_path / "leaks.supp"
    supp.write_text("# our own leaks\nleak:lose_records\n^lose_t*e$   # the tree\n")
    # WHEN
    result = run_leaks(run_cli, tmp_path, victim, "leak",
                       options=("--suppress", supp, "--json", tmp_path / "leaks.json"))
    # THEN
    assert result.returncode == 0, f"expected the victim's own 0, got {result.returncode}: {result.stderr}"
    assert report_groups(result.stderr) == [], result.stderr
    pid = pids(result.stdout)[0]
    assert f"SUMMARY: pid {pid}: no leaks" in result.stderr, result.stderr
    assert "suppressed: 428 bytes in 6 blocks (lose_records: 3 blocks, ^lose_t*e$: 3 blocks)" in result.stderr
    doc = json.loads((tmp_path / "leaks.json").read_text())
    assert doc["processes"][0]["suppressed"]["patterns"] == [
        {"pattern": "lose_records", "blocks": 3, "bytes": 300},
        {"pattern": "^lose_t*e$", "blocks": 3, "bytes": 128}]


def test_a_program_that_leaks_nothing_exits_with_its_own_code(run_cli, tmp_path, victim):
    result = run_leaks(run_cli, tmp_path, victim, "clean", "7")
    assert result.returncode == 7, f"expected the victim's 7, got {result.returncode}: {result.stderr}"
    pid = pids(result.stdout)[0]
    assert f"SUMMARY: pid {pid}: no leaks" in result.stderr, result.stderr


def test_a_program_that_never_allocates_reads_without_warnings(run_cli, tmp_path, victim):
    # leak_exit with no argument prints its usage and returns 2 before any
    # malloc: libtag's stack table was never written, and a kernel core
    # leaves out a mapping never written to; the root node must be there
    result = run_leaks(run_cli, tmp_path, victim)
    assert result.returncode == 2, result.stderr
    assert "usage: leak_exit" in result.stderr
    assert "no leaks" in result.stderr, result.stderr
    assert "warning" not in result.stderr, result.stderr


def test_a_forked_child_gets_its_own_report(run_cli, tmp_path, victim):
    result = run_leaks(run_cli, tmp_path, victim, "fork")
    assert result.returncode == LEAK_STATUS, result.stderr
    parent, child = pids(result.stdout)
    made = blocks(result.stdout)
    # one report per process, the command's first
    heads = [int(p) for p in re.findall(r"^forensics: leak check of pid (\d+) ", result.stderr, re.M)]
    assert heads == [parent, child], result.stderr
    parent_part, child_part = result.stderr.split(f"leak check of pid {child} ")
    assert [(k, a) for k, a, _ in report_groups(parent_part)] == [("definite", "300 bytes in 3 blocks")]
    child_groups = report_groups(child_part)
    line = made["child"][0][2]
    assert [(k, a) for k, a, _ in child_groups] == [("definite", "60 bytes in 2 blocks")], child_part
    assert child_groups[0][2].endswith(f"lose_in_child at {victim_source()}:{line}"), child_groups


def test_a_program_ending_with_underscore_exit_is_said_unchecked(run_cli, tmp_path, victim):
    result = run_leaks(run_cli, tmp_path, victim, "_exit", "3")
    assert result.returncode == 3, f"expected the victim's 3, got {result.returncode}: {result.stderr}"
    pid = pids(result.stdout)[0]
    assert (f"forensics: warning: pid {pid} took no exit snapshot, so it was not checked for leaks"
            in result.stderr), result.stderr


def test_a_thread_still_running_at_exit_keeps_its_block_reachable(run_cli, tmp_path, victim):
    result = run_leaks(run_cli, tmp_path, victim, "thread", options=("--json", tmp_path / "l.json"))
    assert result.returncode == LEAK_STATUS, result.stderr
    held = blocks(result.stdout)["held"][0][0]
    doc = json.loads((tmp_path / "l.json").read_text())
    (proc,) = doc["processes"]
    assert proc["totals"]["definite"] == {"blocks": 3, "bytes": 300}, proc["totals"]
    assert all(hex(held) not in g["examples"] for g in proc["leaks"]), "the worker's block is reachable"


@pytest.mark.parametrize("content, message", [
    ("race:foo\n", "leaks.supp:1: unknown suppression type 'race': expected leak:PATTERN or PATTERN"),
    ("leak:ok\n\nleak:\n", "leaks.supp:3: empty suppression pattern"),
    (b"\xff\xfe\n", "run: the suppressions {path} are not text (byte 0 is not UTF-8)"),
])
def test_a_bad_suppression_file_is_one_line_and_exit_2_before_running(run_cli, tmp_path, victim,
                                                                       content, message):
    supp = tmp_path / "leaks.supp"
    if isinstance(content, bytes):
        supp.write_bytes(content)
    else:
        supp.write_text(content)
    result = run_leaks(run_cli, tmp_path, victim, "leak", options=("--suppress", supp))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    expected = message.format(path=supp)
    assert len(lines) == 1 and lines[0].startswith("forensics: error: ") and lines[0].endswith(expected), lines
    assert result.stdout == "", "the command must not run"


def test_a_missing_suppression_file_is_one_line(run_cli, tmp_path, victim):
    result = run_leaks(run_cli, tmp_path, victim, "leak", options=("--suppress", tmp_path / "none"))
    assert (result.returncode, result.stderr) == (
        2, f"forensics: error: run: cannot read the suppressions {tmp_path / 'none'}: "
           f"No such file or directory\n")


def test_suppress_without_leaks_is_a_usage_error(run_cli, tmp_path, victim):
    result = run_cli("run", "--suppress", "x", "--", victim, "leak")
    assert (result.returncode, result.stderr) == (2, "forensics: error: run: --suppress goes with --leaks\n")


def test_exit_snapshot_of_a_program_linked_with_libtag_a(build_victim, run_victim, run_cli, tmp_path):
    # GIVEN the victim linked with libtag.a (no preload) and LIBTAG_AT_EXIT=snapshot
    exe = build_victim("leak_exit", static_libtag=True)
    snaps = tmp_path / "snaps"
    done = run_victim(exe, "leak", preload=False, snap_dir=snaps, env={"LIBTAG_AT_EXIT": "snapshot"})
    assert done.returncode == 0, done.stderr
    # THEN the exit snapshot exists and holds the same leaks
    (snap,) = [d for d in snaps.iterdir() if d.name.endswith("-exit")]
    result = run_cli("inspect", snap / "core", "--leaks", "--json",
                     env={"XDG_STATE_HOME": str(tmp_path / "state")})
    doc = json.loads(result.stdout)
    assert doc["reason"] == "exit"
    definite = sorted((g["bytes"], g["blocks"]) for g in doc["leaks"] if g["kind"] == "definite")
    assert definite == [(48, 1), (300, 3)], doc["leaks"]
