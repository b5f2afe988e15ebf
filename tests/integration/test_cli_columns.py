"""Human output at 80 columns: a path is never broken across lines.

GIVEN a snapshot in a folder whose path alone is longer than 80 characters
WHEN list, inspect and whoowns print for a person with COLUMNS=80 (a pipe, as
a terminal that narrow would)
THEN every path their --json names (the core, source files, modules) appears
whole on one line of the human output.
"""

from __future__ import annotations

import json
import re


def _paths(doc) -> set[str]:
    """Every path a JSON document names that the human form prints: core
    paths, and each frame's source file (its module when it has none)."""
    out: set[str] = set()
    if isinstance(doc, dict):
        if "address" in doc and "function" in doc and "module" in doc:  # a frame
            where = doc["file"] or doc["module"]
            return {where} if where and "/" in where else set()
        for k, v in doc.items():
            if k == "core" and isinstance(v, str):
                out.add(v)
            else:
                out |= _paths(v)
    elif isinstance(doc, list):
        for v in doc:
            out |= _paths(v)
    return out


def test_list_inspect_and_whoowns_keep_every_path_on_one_line(build_victim, run_cli, tmp_path):
    exe = build_victim("leak_exit")
    deep = tmp_path / ("a-folder-with-a-long-name-" * 2) / "snapshots-of-the-leak-exit-victim"
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "80"}
    ran = run_cli("run", "--dir", deep, "--leaks", "--", exe, "leak", env=env)
    assert ran.returncode == 23, ran.stderr
    record = int(re.search(r"^block record (0x[0-9a-f]+) 100", ran.stdout, re.M).group(1), 16)
    (core,) = [str(d / "core") for d in deep.iterdir()]
    assert len(core) > 80
    checks = [
        (("list",), ("list", "--json")),
        (("inspect", core, "--leaks"), ("inspect", core, "--leaks", "--json")),
        (("whoowns", hex(record), "--core", core), ("whoowns", hex(record), "--core", core, "--json")),
        (("whoowns", hex(record)), ("whoowns", hex(record), "--json")),
    ]
    for human_args, json_args in checks:
        human = run_cli(*human_args, env=env)
        doc = json.loads(run_cli(*json_args, env=env).stdout)
        paths = _paths(doc)
        assert core in paths, (human_args, paths)
        if "--core" in human_args:
            paths.discard(core)  # the user named it: whoowns does not repeat it
        lines = human.stdout.splitlines()
        for p in paths:
            # a path is printed whole on one line, or (a frame the human
            # output leaves out: libtag's own, or past the frame limit) not at
            # all - never its end on a line of its own
            whole = any(p in line for line in lines)
            assert whole or p[-16:] not in human.stdout, \
                f"{human_args}: {p} is not whole on a line:\n{human.stdout}"
        assert core in human.stdout or "--core" in human_args, human.stdout
    # the leak report of run --leaks itself
    for p in (core, str(exe)):
        assert any(p in line for line in ran.stderr.splitlines()), ran.stderr
