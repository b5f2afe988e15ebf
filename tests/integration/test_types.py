"""What a block is without its stacks: C++ classes by vtable
(forensics/reader/types.py), in a process without libtag (its core taken
by ptrace) and in one under libtag.

tests/victims/plain_objects.cc holds a Session (kept in a global), a
Connection (derived from Session; its only pointer dropped: a leak), a
net::Packet, a struct without virtual functions, and the characters of
two std::strings (40 and 100 long: blocks of 41 and 101 bytes, one held by
a string object in a block, one by a global), and prints their addresses.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest


def _start(exe, env):
    proc = subprocess.Popen([str(exe)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    addrs = {}
    while True:
        words = proc.stdout.readline().split()
        assert words, "victim ended before 'ready'"
        if words[0] == "ready":
            return proc, addrs
        addrs[words[0]] = int(words[1], 16)


@pytest.fixture
def cli(run_cli, tmp_path):
    state = tmp_path / "state"
    state.mkdir()

    def run(*args):
        done = run_cli(*args, "--json", env={"XDG_STATE_HOME": str(state)})
        assert done.returncode in (0, 1), done.stderr
        return json.loads(done.stdout)
    return run


@pytest.mark.parametrize("preload", [False, True], ids=["without-libtag", "libtag"])
def test_blocks_are_named_by_their_class(preload, build_victim, cli, libtag_so, tmp_path):
    exe = build_victim("plain_objects", cxx=True, instrument=False)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env.update(LD_PRELOAD=str(libtag_so), LIBTAG_DIR=str(tmp_path / "snaps"))
    proc, addrs = _start(exe, env)
    try:
        snap = cli("snapshot", str(proc.pid), "--dir", str(tmp_path / "snaps"))
    finally:
        proc.communicate("", timeout=60)
    assert snap["method"] == ("libtag" if preload else "ptrace"), snap
    core = snap["core"]

    expected = {"session": "Session", "connection": "Connection", "packet": "net::Packet",
                "plain": None, "string": "std::string buffer", "motd": "std::string buffer"}
    for name, cls in expected.items():
        who = cli("whoowns", hex(addrs[name] + 8), "--core", core)  # inside the object
        assert who["owner"] == "heap", who
        assert who["type"] == cls, (name, who["type"])

    doc = cli("inspect", core, "--leaks")
    types = {t["type"]: (t["blocks"], t["bytes"]) for t in doc["types"]}
    # each class one live block (the leaked Connection is still live)
    for cls in ("Session", "Connection", "net::Packet"):
        assert cls in types and types[cls][0] == 1, (cls, doc["types"])
    # the two strings' characters: 41 and 101 bytes under libtag; without
    # it glibc's usable sizes (chunks of 64 and 112: 56 and 104 usable)
    assert types["std::string buffer"] == (2, 142 if preload else 160), doc["types"]
    leaked = [g for g in doc["leaks"] if hex(addrs["connection"]) in g["examples"]]
    assert len(leaked) == 1 and leaked[0]["kind"] == "definite", doc["leaks"]
    assert leaked[0]["type"] == "Connection"
