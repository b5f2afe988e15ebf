"""`forensics attach PID`: libtag loaded into a process started without it
(forensics/snapshots/attach.py, libtag/src/life/attach.c).

tests/victims/attach_loop.c makes three blocks before the attach and keeps
a thread allocating and freeing the whole time.  After the attach: a new
block is libtag's, with its allocation stack; glibc's old blocks are freed,
reallocated and measured by glibc (no crash, no anomaly); a double free is
caught with both stacks; a snapshot goes through libtag; the process exits
0.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import forensics_test_support as S
import pytest


class Victim:
    def __init__(self, exe: Path, state: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env["XDG_STATE_HOME"] = str(state)  # where libtag, once attached, snapshots
        self.proc = subprocess.Popen([str(exe)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.old: list[int] = []
        while True:
            words = self.proc.stdout.readline().split()
            assert words, self.proc.stderr.read()
            if words[0] == "old":
                self.old.append(int(words[1], 16))
            elif words[0] == "usable":
                self.usable = int(words[1])
            elif words[0] == "lost":
                self.lost = int(words[1], 16)
            elif words[0] == "ready":
                break
        self.pid = self.proc.pid

    def ask(self, cmd: str) -> list[str]:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()


@pytest.fixture
def victim(build_victim, tmp_path):
    v = Victim(build_victim("attach_loop", instrument=False), tmp_path / "vstate")
    yield v
    if v.proc.poll() is None:
        v.proc.kill()
        v.proc.communicate(timeout=30)


@pytest.fixture
def cli(run_cli, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    return lambda *args: run_cli(*args, env={"XDG_STATE_HOME": str(state)})


def cli_json(cli, *args: str):
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_attach_then_both_kinds_of_block(victim, cli, tmp_path):
    churn_before = int(victim.ask("report")[1].split("=")[1])
    doc = cli_json(cli, "attach", str(victim.pid))
    assert doc["pid"] == victim.pid and doc["tid"] == victim.pid  # main waits in read()
    assert doc["rebound"] >= 4, doc  # the program's malloc, free, realloc, malloc_usable_size
    maps = Path(f"/proc/{victim.pid}/maps").read_text()
    assert "libtag" in maps

    # glibc's blocks from before: freed, reallocated, measured by glibc
    assert victim.ask("free_old") == ["freed"]
    words = victim.ask("realloc_old")
    assert words[0] == "realloc" and words[2] == "b", words
    grown = int(words[1], 16)
    assert victim.ask("usable_old") == ["usable", str(victim.usable)]
    # a new block comes from libtag's heap
    new = int(victim.ask("new")[1], 16)
    churn = int(victim.ask("report")[1].split("=")[1])
    assert churn > churn_before  # the churning thread ran on through the attach

    assert victim.ask("lose") == ["lost_after"]  # a libtag block lost

    snap = cli_json(cli, "snapshot", str(victim.pid))
    assert snap["method"] == "libtag", snap
    who = cli_json(cli, "whoowns", hex(new), "--core", snap["core"])
    assert who["owner"] == "heap" and who["block"]["state"] == "live", who
    assert who["block"]["size"] == 400
    functions = [f["function"] for f in who["block"]["alloc_stack"]]
    assert functions[:2] == ["make_after", "main"], functions

    # in the same core, the blocks from before are glibc's chunks: one in
    # use (its usable size as the program measured it), one grown by
    # glibc's realloc after the attach (5000 bytes: a chunk of 5008), one
    # freed by glibc's free after the attach (in the freeing thread's tcache)
    kept = cli_json(cli, "whoowns", hex(victim.old[2]), "--core", snap["core"])
    assert kept["owner"] == "heap" and kept["block"] is None and kept["libtag"] is True, kept
    assert (kept["chunk"]["state"], kept["chunk"]["usable"]) == ("inuse", victim.usable), kept
    assert kept["without_libtag"]["summary"].startswith("a block from before libtag was attached")
    big = cli_json(cli, "whoowns", hex(grown), "--core", snap["core"])
    assert (big["chunk"]["state"], big["chunk"]["size"], big["chunk"]["usable"]) == ("inuse", 5008, 5000)
    freed = cli_json(cli, "whoowns", hex(victim.old[0]), "--core", snap["core"])
    assert freed["chunk"]["state"] == "tcache" and freed["chunk"]["tcache_thread"] == victim.pid, freed
    # one answer over both kinds: libtag's blocks and glibc's map, and the
    # leaks of both - glibc's lost block by its usable size (1234 bytes: a
    # chunk of 1248), libtag's by their allocation stacks (the victim does
    # not keep the "new" block either)
    ins = cli_json(cli, "inspect", snap["core"], "--leaks")
    assert ins["libtag"] is True and ins["glibc"]["chunks"]["inuse"]["chunks"] >= 3, ins["glibc"]
    assert "without_libtag" not in ins
    definite = [g for g in ins["leaks"] if g["kind"] == "definite"]
    by_size = [(g["usable_size"], g["blocks"], g["examples"], g["stack_id"]) for g in definite
               if g["usable_size"] is not None]
    assert by_size == [(1240, 1, [hex(victim.lost)], None)], definite
    by_stack = [(g["bytes"], g["blocks"], [f["function"] for f in g["stack"]][:2]) for g in definite
                if g["usable_size"] is None]
    assert by_stack == [(400, 1, ["make_after", "main"]), (333, 1, ["lose_after", "main"])], definite

    # a double free after the attach is caught, with both stacks
    words = victim.ask("double")
    assert words[0] == "double"
    q = int(words[1], 16)
    snaps = tmp_path / "vstate" / "forensics" / "snapshots"
    # the anomaly's snapshot is the process's second (the first: on demand
    # above); its core is written while the victim runs on
    core = S.wait_core(snaps, victim.pid, seq=2, reason="double-free")
    ins = cli_json(cli, "inspect", str(core))
    (anomaly,) = ins["anomalies"]
    assert anomaly["kind"] == "double-free" and anomaly["address"] == hex(q), anomaly
    alloc = [f["function"] for f in anomaly["block"]["alloc_stack"]]
    assert alloc[:2] == ["make_double", "main"], alloc
    assert [f["function"] for f in anomaly["block"]["free_stack"]][:1] == ["main"]

    victim.proc.stdin.write("quit\n")
    victim.proc.stdin.flush()
    out, err = victim.proc.communicate(timeout=60)
    assert victim.proc.returncode == 0, err


def test_attach_refuses_a_process_that_runs_libtag(build_victim, cli, libtag_so, tmp_path):
    exe = build_victim("attach_loop", instrument=False)
    env = dict(os.environ, LD_PRELOAD=str(libtag_so), LIBTAG_DIR=str(tmp_path))
    proc = subprocess.Popen([str(exe)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        while proc.stdout.readline().strip() != "ready":
            pass
        done = cli("attach", str(proc.pid))
        assert done.returncode == 2
        assert done.stderr.strip() == (f"forensics: error: process {proc.pid} already runs "
                                       f"libtag: snapshot it (forensics snapshot {proc.pid})")
    finally:
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0


def test_attach_refuses_a_static_binary(tmp_path, cli):
    src = tmp_path / "s.c"
    src.write_text("#include <unistd.h>\nint main(void){pause();return 0;}\n")
    exe = tmp_path / "static_pause"
    built = subprocess.run(["gcc", "-static", "-O1", "-o", str(exe), str(src)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"no static glibc to link with: {built.stderr.strip()[:200]}")
    proc = subprocess.Popen([str(exe)])
    try:
        done = cli("attach", str(proc.pid))
        assert done.returncode == 2
        assert "has no glibc libc.so.6 mapped (a static binary" in done.stderr, done.stderr
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_attach_rebinds_a_librarys_table_and_keeps_the_programs_runpath(tmp_path, cli):
    # GIVEN a program linked with libtbl.so, whose data holds a pointer to
    # free (an R_X86_64_64 relocation), and a plugin in $ORIGIN/lib that it
    # dlopens by its bare name through its RUNPATH
    victims = Path(__file__).resolve().parent.parent / "victims"
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "tbl.c").write_text("#include <stdlib.h>\nvoid (*tbl_free)(void *) = free;\n"
                                    "void tbl_release(void *p) { tbl_free(p); }\n")
    (tmp_path / "plug.c").write_text("int plug_answer(void) { return 42; }\n")
    for name in ("tbl", "plug"):
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib / f"lib{name}.so"),
                        str(tmp_path / f"{name}.c")], check=True)
    exe = tmp_path / "attach_dl"
    subprocess.run(["gcc", "-g", "-O1", "-o", str(exe), str(victims / "attach_dl.c"),
                    f"-L{lib}", "-ltbl", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib"], check=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["XDG_STATE_HOME"] = str(tmp_path / "vstate")
    proc = subprocess.Popen([str(exe)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def ask(cmd: str) -> str:
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    try:
        assert proc.stdout.readline().strip() == "ready"
        # WHEN libtag is attached
        doc = cli_json(cli, "attach", str(proc.pid))
        assert doc["rebound"] > 0
        # THEN a libtag block freed through the library's own table goes to
        # libtag (glibc's free would abort on it), and the plugin is still
        # found through the program's RUNPATH
        assert ask("table") == "released"
        assert ask("plugin") == "plugin 42"
        assert ask("table") == "released"
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "anomaly" not in err and "invalid" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
