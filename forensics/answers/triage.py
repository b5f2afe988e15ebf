"""``forensics triage``: many cores grouped by crash signature
(forensics/answers/signature.py), one group per bug - how many cores, when
the first and the last were taken, which programs and hosts, the newest
example core and what it says about the block (docs/json.md, "triage").

Each core is read as ``inspect`` reads it (its anomalies and crash; no top
stacks, no leak scan), so a group's answer is inspect's: the anomaly's
block with its allocation and free stacks, or the crash's address and what
holds it.  A core that cannot be read is listed with its one-line reason
and the others go on; one without an anomaly or a crash (a snapshot taken
on demand) has no signature and is counted apart.
"""

from __future__ import annotations

import datetime as _dt
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from forensics.answers.documents import CrashDoc, InspectDoc, SignatureDoc
from forensics.answers.signature import event_time, subject
from forensics.errors import ForensicsError

TRIAGE_VERSION = 1

# What a file that holds a core starts with: an ELF header, or a stream
# of one of the compressors systemd-coredump uses.
_MAGICS = (b"\x7fELF", b"\x28\xb5\x2f\xfd", b"\x04\x22\x4d\x18", b"\xfd7zXZ\x00")


def core_files(paths: Iterable[str]) -> tuple[list[str], list[dict[str, str]]]:
    """(the cores named by *paths*, in order: a file as given, a directory's
    files that start as a core does, by path - each file once, however many
    times it is named; [{path, error}] for a path that is neither).
    Symbolic links are not followed (a core holds the memory of a process:
    no link planted in a shared folder leads here)."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    bad: list[dict[str, str]] = []

    def add(path: str, st: os.stat_result) -> None:
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            found.append(path)

    for p in paths:
        try:
            st = os.lstat(p)
        except OSError as e:
            bad.append({"path": p, "error": f"cannot read {p}: {e.strerror}"})
            continue
        if stat.S_ISLNK(st.st_mode):
            bad.append({"path": p, "error": f"{p} is a symbolic link: not followed"})
        elif stat.S_ISDIR(st.st_mode):
            for path, sub in sorted(_walk(p)):
                add(path, sub)
        elif stat.S_ISREG(st.st_mode):
            add(p, st)
        else:
            bad.append({"path": p, "error": f"{p} is not a file or a directory"})
    return found, bad


def _walk(top: str) -> Iterator[tuple[str, os.stat_result]]:
    for root, dirs, files in os.walk(top, followlinks=False):
        dirs.sort()
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    continue
                with open(path, "rb") as f:
                    head = f.read(6)
            except OSError:
                continue
            if head.startswith(_MAGICS):
                yield path, st


@dataclass
class _Core:
    path: str
    time: float  # seconds since the epoch: the anomaly's or crash's, else the file's
    pid: int
    exe: str | None
    host: str | None
    doc: InspectDoc


@dataclass
class _Group:
    signature: SignatureDoc
    cores: list[_Core] = field(default_factory=list)


def _host_of(path: str) -> str | None:
    """The host a core came from, where the file says it: the extended
    attribute systemd-coredump sets on the cores it stores; else None."""
    try:
        return os.getxattr(path, "user.coredump.hostname", follow_symlinks=False).decode(
            errors="replace") or None
    except (OSError, AttributeError):
        return None


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _answer(doc: InspectDoc) -> dict[str, Any]:
    """What the newest core of a group says about the bug: the anomaly
    (kind, address, its block with the three stacks) or the crash (signal,
    address, summary, what holds the address).  Its stack, block and
    address_owner are the inspect document's own (typed: to_json prints
    them, output.text reads their attributes)."""
    crash = subject(doc.anomalies, doc.crash)
    if not isinstance(crash, CrashDoc):  # an anomaly
        a = crash
        return {"kind": a.kind, "address": a.address, "summary": None,
                "stack": a.stack, "block": a.block, "address_owner": None}
    owner = crash.address_owner
    return {"kind": crash.signal, "address": crash.address, "summary": crash.summary,
            "stack": crash.stack, "block": owner.block if owner is not None else None,
            "address_owner": owner}


def triage(paths: Iterable[str], inspect: Callable[[str], InspectDoc],
           progress: Callable[[int, int, str], None] | None = None,
           skipped: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """The triage document of the cores *paths* names (files, directories):
    inspect(path) gives a core's inspect document (or raises a
    ForensicsError, whose message is kept as that core's reason); skipped:
    crashes known to have no core to read ({path: None, error}: those
    systemd-coredump no longer holds), listed first among the skipped."""

    cores, bad = core_files(paths)
    skipped = [*skipped, *bad]
    groups: dict[str, _Group] = {}
    unsigned: list[str] = []
    for i, path in enumerate(cores):
        if progress is not None:
            progress(i, len(cores), path)
        try:
            doc = inspect(path)
        except ForensicsError as e:
            skipped.append({"path": path, "error": e.message})
            continue
        sig = doc.signature
        if sig is None:
            unsigned.append(path)
            continue
        g = groups.setdefault(sig.id, _Group(sig))
        # when: as libtag recorded it, else the file's time (the kernel
        # writes a crash core as the process dies)
        when = event_time(doc.anomalies, doc.crash, os.stat(path).st_mtime)
        g.cores.append(_Core(path, when, int(doc.process.pid or 0), doc.process.exe, _host_of(path), doc))
    if progress is not None:
        progress(len(cores), len(cores), "")
    out = []
    for g in groups.values():
        g.cores.sort(key=lambda c: (c.time, c.path))
        newest = g.cores[-1]
        programs: dict[str | None, list[int]] = {}
        for c in g.cores:
            programs.setdefault(c.exe, []).append(c.pid)
        out.append({
            "id": g.signature.id,
            "signature": g.signature,
            "count": len(g.cores),
            "first_time": _iso(g.cores[0].time),
            "last_time": _iso(newest.time),
            "processes": [{"exe": exe, "pids": sorted(set(pids))} for exe, pids in sorted(
                programs.items(), key=lambda kv: kv[0] or "")],
            "hosts": sorted({c.host for c in g.cores if c.host}),
            "example": newest.path,
            "cores": [c.path for c in g.cores],
            "answer": _answer(newest.doc),
        })
    # the most cores first; among equals the most recent, then by id
    out.sort(key=lambda g: g["id"])
    out.sort(key=lambda g: g["last_time"], reverse=True)
    out.sort(key=lambda g: -g["count"])
    return {"version": TRIAGE_VERSION, "cores": len(cores), "groups": out, "unsigned": unsigned,
            "skipped": skipped}


__all__ = ["TRIAGE_VERSION", "core_files", "triage"]
