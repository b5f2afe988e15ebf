"""The crash signature, `forensics triage` and Sentry events
(forensics/answers/signature.py, triage.py, sentry.py).

tests/victims/triage_bugs.c has three bugs: a double free of make_node's
block, the same wrong free of make_other's block (another allocation site:
another bug), and a store through a NULL-page pointer.  Twenty cores of
them, from two binaries built alike, taken under libtag (its anomaly
snapshots and its crash cores), group into three; each group's newest core
answers with its block and stacks.  One Sentry event per core - a libtag
anomaly core, a libtag crash core, a kernel core without libtag - passes
Sentry's own event normalizer (the sentry-relay package) with no error,
and its frames are inspect's.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

NODE = "double-free | release | main | alloc: make_node | main"
OTHER = "double-free | release | main | alloc: make_other | main"
SEGV = "SIGSEGV | store_into | main"


@pytest.fixture(scope="module")
def cores(build_victim, tmp_path_factory):
    """Twenty cores of the three bugs: {"dir", "a", "b" (the two binaries),
    "pids": {(binary, bug): [pid...]}}."""
    a = build_victim("triage_bugs", instrument=False)
    # built alike: the same source and flags (a macro the source never reads)
    b = build_victim("triage_bugs", instrument=False, extra_flags=("-DTRIAGE_SECOND_BUILD",))
    assert a != b
    d = tmp_path_factory.mktemp("triage") / "cores"
    runs = [(a, "double")] * 4 + [(b, "double")] * 4 + [(a, "other")] * 3 + [(b, "other")] * 3 \
        + [(a, "segv")] * 6
    pids: dict[tuple[Path, str], list[int]] = {}
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["XDG_STATE_HOME"] = str(d.parent / "state")
    for exe, bug in runs:
        done = subprocess.run([sys.executable, "-m", "forensics", "run", "--dir", str(d), "--", str(exe),
                               bug], env=env, cwd=d.parent, capture_output=True, text=True, timeout=120)
        pid = int(done.stdout.split()[1])
        pids.setdefault((exe, bug), []).append(pid)
    found = sorted(d.glob("*/core"))
    assert len(found) == 20, (len(found), sorted(p.name for p in d.iterdir()))
    return {"dir": d, "a": a, "b": b, "pids": pids}


def cli_json(run_cli, *args: str) -> dict:
    done = run_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_twenty_cores_of_three_bugs_make_three_groups(cores, run_cli):
    doc = cli_json(run_cli, "triage", str(cores["dir"]))
    assert doc["cores"] == 20 and doc["unsigned"] == [] and doc["skipped"] == []
    # most cores first; of two groups of six, the one whose last core is newer
    # (the crashes were run last)
    assert [(g["signature"]["text"], g["count"]) for g in doc["groups"]] == [
        (NODE, 8), (SEGV, 6), (OTHER, 6)]
    node, segv, other = doc["groups"]
    # the same bug from two binaries built alike: one group, both programs
    a, b, pids = cores["a"], cores["b"], cores["pids"]
    assert node["processes"] == sorted(
        [{"exe": str(a), "pids": sorted(pids[(a, "double")])},
         {"exe": str(b), "pids": sorted(pids[(b, "double")])}], key=lambda p: p["exe"])
    assert node["first_time"] <= node["last_time"]
    assert node["example"] == node["cores"][-1] and len(node["cores"]) == 8
    # the group's answer: the block, its allocation and both frees
    ans = node["answer"]
    assert ans["kind"] == "double-free" and ans["block"]["size"] == 48
    assert [f["function"] for f in ans["block"]["alloc_stack"]][:2] == ["make_node", "main"]
    assert [f["function"] for f in ans["block"]["free_stack"]][:2] == ["release", "main"]
    assert [f["function"] for f in ans["stack"]][:2] == ["release", "main"]
    assert other["answer"]["block"]["size"] == 72
    assert (segv["answer"]["kind"], segv["answer"]["address"]) == ("SIGSEGV", "0x18")
    assert segv["answer"]["address_owner"]["note"] == "NULL page"
    # inspect --json carries the same signature
    ins = cli_json(run_cli, "inspect", node["example"])
    assert ins["signature"] == node["signature"]
    assert ins["signature"]["frames"] == ["release", "main"]
    assert ins["signature"]["alloc_frames"] == ["make_node", "main"]
    assert len(ins["signature"]["id"]) == 16 and ins["signature"]["version"] == 1


def test_triage_text_and_bad_input(cores, run_cli, tmp_path):
    done = run_cli("triage", str(cores["dir"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "20 cores, 3 groups"
    assert f"#1: 8 cores  {NODE}" in done.stdout
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "core").write_bytes(b"\x7fELF" + b"\0" * 60)  # an ELF header, cut short
    done = run_cli("triage", str(junk))
    assert done.returncode == 2
    assert done.stderr.startswith("forensics: error: triage: no core could be read (1 skipped; "), \
        done.stderr
    assert len(done.stderr.splitlines()) == 1


def _raise_soft_core_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


@pytest.mark.parametrize("which", ["anomaly", "crash", "plain"])
def test_sentry_event_passes_sentrys_normalizer(which, cores, run_cli, tmp_path):
    processing = pytest.importorskip("sentry_relay.processing")
    if which == "plain":
        # the kernel's core of the crash, without libtag
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        done = subprocess.run([str(cores["a"]), "segv"], cwd=tmp_path, env=env, capture_output=True,
                              timeout=60, preexec_fn=_raise_soft_core_limit)
        assert done.returncode == -11
        (core,) = [p for p in tmp_path.iterdir() if p.name.startswith("core")]
    else:
        reason = "double-free" if which == "anomaly" else "crash"
        core = sorted(cores["dir"].glob(f"*-{reason}/core"))[0]
    ins = cli_json(run_cli, "inspect", str(core))
    done = run_cli("inspect", str(core), "--sentry")
    assert done.returncode == 0, done.stderr
    event = json.loads(done.stdout)
    normal = processing.StoreNormalizer().normalize_event(event)
    assert "errors" not in normal and not normal.get("_meta"), (normal.get("errors"), normal.get("_meta"))
    (value,) = normal["exception"]["values"]
    if which == "anomaly":
        (a,) = ins["anomalies"]
        stack, kind, thread = a["stack"], "double-free", a["thread"]
        block = event["extra"]["forensics"]["block"]
        assert [f["function"] for f in block["alloc_stack"]][:2] == ["make_node", "main"]
    else:
        stack, kind, thread = ins["crash"]["stack"], "SIGSEGV", ins["crash"]["thread"]
        assert value["mechanism"]["meta"]["signal"]["number"] == 11
    assert value["type"] == kind and value["thread_id"] == thread
    # the frames are inspect's, outermost first as Sentry lists them
    frames = value["stacktrace"]["frames"]
    assert [(f["instruction_addr"], f.get("function"), f.get("lineno")) for f in frames] == [
        (f["address"], f["function"], f["line"]) for f in reversed(stack)]
    assert normal["fingerprint"] == [f"forensics-{ins['signature']['id']}"]
    assert normal["platform"] == "native" and normal["level"] == "fatal"
    crashed = [t for t in normal["threads"]["values"] if t["crashed"]]
    assert [t["id"] for t in crashed] == [thread]
    # every module with its build-id: the program's own among them
    images = {i["code_file"]: i for i in normal["debug_meta"]["images"]}
    program = ins["process"]["exe"]
    assert program in (str(cores["a"]), str(cores["b"]))
    exe = images[program]
    build_id = subprocess.run(["readelf", "-n", program], capture_output=True, text=True,
                              check=True).stdout.split("Build ID: ")[1].split()[0]
    assert exe["code_id"] == build_id
