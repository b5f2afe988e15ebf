"""List the snapshots in the catalog.

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
"disk_bytes", "dir", "exists", "summary", "id"}.
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


def main(args: argparse.Namespace) -> int:
    from forensics.output import text  # deferred, start-up time: rich
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

    if args.json:
        text.print_json([e.doc() for e in entries])
        return 0
    out = text.out_console()
    if not entries:
        out.print("no snapshots in the catalog yet: take one with "
                  "`forensics snapshot PID` or `forensics run -- CMD`; a process you "
                  "preloaded by hand writes to its LIBTAG_DIR (libtag logs each snapshot's "
                  "path): `forensics list --dir DIR`", markup=False, soft_wrap=True)
        return 0
    for e in entries:
        doc = e.doc()
        when = _dt.datetime.fromtimestamp(e.time).strftime("%Y-%m-%d %H:%M:%S") if e.time else "?"
        pause = f"paused {e.pause_ms:.2f} ms" if e.pause_ms is not None else "not paused"
        size = (text.core_size_text(e.core_bytes, doc.disk_bytes) if doc.exists
                else "deleted")
        exe = os.path.basename(e.exe) if e.exe else "?"
        # two lines: the facts, then the core's path alone, never broken
        text.say(f"#{e.id}  {when}  pid {e.pid} {exe}  {e.reason}  {pause}  {size}")
        text.say(f"    {e.core}")
    return 0
