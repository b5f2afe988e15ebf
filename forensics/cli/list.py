"""List the snapshots in the catalog and the cores systemd-coredump holds.

    forensics list [--dir DIR]... [--json]

Looks first in the snapshot folders forensics knows for snapshots taken
since, and catalogs the complete ones: the default
$XDG_STATE_HOME/forensics/snapshots, every --dir or LIBTAG_DIR it has used,
the snapshot folder of every running process under libtag whose memory it
can read (a process preloaded by hand, a daemon), and each --dir given here
(remembered from then on).  Each snapshot is two lines: its catalog number,
time, pid, executable, reason, pause and size on disk (and the apparent size
of a sparse core), then its core's path.  --json prints an array, oldest
first, of {"core", "pid", "exe", "time", "reason", "pause_ms", "core_bytes",
"disk_bytes", "dir", "exists", "summary", "id", "source", "libtag", "kind",
"compression", "signal", "corefile"}.

Beside them, the cores systemd-coredump holds (where core_pattern pipes
crashes to it): its folder (FORENSICS_COREDUMP_DIR, default
/var/lib/systemd/coredump, each file's user.coredump.* attributes) and
coredumpctl's records (FORENSICS_COREDUMPCTL, default coredumpctl on PATH;
empty: not run).  Each line says what the core is: libtag's or a plain
program's, a crash or a snapshot, and its compression; `--coredump PID` or
`--coredump PROGRAM` opens the newest of them in any verb (triage: all of
them).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os

from forensics.cli import _args
from forensics.errors import InputError
from forensics.files import default_snapshot_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="DIR", action="append", default=[],
                        help="also look in DIR (a LIBTAG_DIR of a process forensics did not "
                             "start), and remember it; may be given more than once")
    _args.json_flag(parser)


def _live_roots() -> set[str]:
    """The snapshot folders of the running processes under libtag whose
    memory we may read (from libtag's control block in each)."""
    import psutil  # deferred, start-up time: psutil

    from forensics.snapshots.handoff import read_control  # deferred, start-up time: psutil, pyelftools, sqlite3
    from forensics.snapshots.take import libtag_loaded  # deferred, start-up time: psutil, pyelftools, sqlite3

    out: set[str] = set()
    for p in psutil.process_iter():
        try:
            if p.pid == os.getpid() or not libtag_loaded(p.pid):
                continue
            ctl = read_control(p.pid)
        except Exception:  # gone, not ours, another ABI: skip it  # noqa: BLE001
            continue
        if ctl is not None and ctl.dir:
            seen = f"/proc/{p.pid}/root{ctl.dir}"
            try:
                if os.path.samefile(seen, ctl.dir):
                    out.add(ctl.dir)
            except OSError:
                continue
    return out


def _what(path: str | None, catalog: bool) -> dict:
    """What the core at path is, from its notes alone (a compressed core is
    decompressed only as far as its notes): "libtag" - the process had
    libtag's shared object mapped, or (a catalog snapshot) libtag took the
    core itself; false for a core forensics took from outside a process
    without it, or a crash of one (a program linked with libtag.a crashing
    under systemd-coredump reads false here: inspect tells) - and
    "compression"; nulls when the core cannot be read."""
    from forensics.core.core import read_notes
    from forensics.errors import ForensicsError

    if path is None:
        return {"libtag": None, "compression": None}
    try:
        notes, raw, packed = read_notes(path)
    except (ForensicsError, OSError, ValueError):
        return {"libtag": None, "compression": None}
    mapped = any(m.path and os.path.basename(m.path).split(".")[0] == "libtag"
                 for m in notes.mappings)
    from forensics.core.notes import FORENSICS_NOTE

    taken_by_forensics = any(n.name == FORENSICS_NOTE for n in raw)
    return {"libtag": mapped or (catalog and not taken_by_forensics), "compression": packed}


def _catalog_doc(e):
    from dataclasses import replace

    doc = e.doc()
    return replace(doc, **_what(e.core if doc.exists else None, True))


def _coredump_doc(c):
    from forensics.answers.documents import CatalogEntryDoc
    from forensics.core.notes import signal_name
    from forensics.files import disk_bytes

    try:
        size = os.stat(c.path).st_size if c.path else None
    except OSError:
        size = None
    return CatalogEntryDoc(
        id=None, core=c.path, dir=os.path.dirname(c.path) if c.path else None,
        pid=c.pid, exe=c.exe or c.comm, time=c.time, reason="crash",
        pause_ms=None, core_bytes=size, summary={"comm": c.comm, "uid": c.uid, "boot_id": c.boot_id,
                                                 "from": c.source},
        exists=size is not None, disk_bytes=disk_bytes(c.path) if c.path else None,
        source="systemd-coredump", kind="crash",
        signal=signal_name(c.signal) if c.signal else None, corefile=c.corefile,
        **_what(c.path, False))


def main(args: argparse.Namespace) -> int:
    from forensics.output import text  # deferred, start-up time: rich
    from forensics.output.jsonout import print_json  # deferred, start-up time: the documents
    from forensics.snapshots import snapdir  # deferred, start-up time: psutil, pyelftools, sqlite3
    from forensics.snapshots.catalog import Catalog  # deferred, start-up time: psutil, pyelftools, sqlite3

    with Catalog() as cat:
        for d in args.dir:
            if not os.path.isdir(d):
                raise InputError(f"{d} is not a directory")
            cat.add_root(d)
        roots = {str(default_snapshot_dir()), *cat.roots(), *_live_roots()}
        for root in sorted(roots):
            try:
                snapdir.scan_and_record(root, catalog=cat)
            except Exception:  # an unreadable folder must not hide the catalog
                continue
        entries = cat.entries()
    from forensics.snapshots.coredumps import coredumps

    docs = [_catalog_doc(e) for e in entries] + [_coredump_doc(c) for c in coredumps()]
    docs.sort(key=lambda d: d.time or 0.0)  # oldest first, both kinds together

    if args.json:
        print_json(docs)
        return 0
    out = text.out_console()
    if not docs:
        out.print("no snapshots in the catalog yet: take one with "
                  "`forensics snapshot PID` or `forensics run -- CMD`; a process you "
                  "preloaded by hand writes to its LIBTAG_DIR (libtag logs each snapshot's "
                  "path): `forensics list --dir DIR`", markup=False, soft_wrap=True)
        return 0
    for doc in docs:
        when = (_dt.datetime.fromtimestamp(doc.time).strftime("%Y-%m-%d %H:%M:%S")
                if doc.time else "?")
        size = (text.core_size_text(doc.core_bytes, doc.disk_bytes) if doc.exists
                else "deleted" if doc.core else f"no core file ({doc.corefile})")
        exe = os.path.basename(doc.exe) if doc.exe else "?"
        what = {True: "libtag", False: "plain", None: "unreadable"}[doc.libtag]
        if doc.compression:
            size += f", {doc.compression}"
        if doc.source == "catalog":
            pause = f"paused {doc.pause_ms:.2f} ms" if doc.pause_ms is not None else "not paused"
            head = f"#{doc.id}  {when}  pid {doc.pid} {exe}  {what} {doc.reason}  {pause}"
        else:
            head = (f"coredump  {when}  pid {doc.pid} {exe}  {what} crash "
                    f"{doc.signal or ''}".rstrip())
        # two lines: the facts, then the core's path alone, never broken
        text.say(f"{head}  {size}")
        if doc.core:
            text.say(f"    {doc.core}")
    return 0
