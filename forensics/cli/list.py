"""List the snapshots in the catalog.

    forensics list [--json]

Looks first in the snapshot folders forensics knows (the default
$XDG_STATE_HOME/forensics/snapshots and every --dir or LIBTAG_DIR it has
used) for snapshots taken since, and catalogs the complete ones.  Each
snapshot is two lines: its catalog number, time, pid, executable, reason,
pause and size on disk (and the apparent size of a sparse core), then its
core's path.  --json prints an array, oldest first, of {"core", "pid", "exe",
"time", "reason", "pause_ms", "core_bytes", "disk_bytes", "dir", "exists",
"summary", "id"}.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os

from forensics.cli import _args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.json_flag(parser)


def main(args: argparse.Namespace) -> int:
    from forensics.files import default_snapshot_dir
    from forensics.output import text
    from forensics.snapshots import snapdir
    from forensics.snapshots.catalog import Catalog

    with Catalog() as cat:
        roots = {str(default_snapshot_dir()), *cat.roots()}
        for root in sorted(roots):
            try:
                snapdir.scan_and_record(root, catalog=cat)
            except Exception:  # an unreadable folder must not hide the catalog
                continue
        entries = cat.entries()

    if args.json:
        text.print_json([e.to_json() for e in entries])
        return 0
    out = text.out_console()
    if not entries:
        out.print("no snapshots in the catalog yet: take one with "
                  "`forensics snapshot PID` or `forensics run -- CMD`", markup=False, soft_wrap=True)
        return 0
    for e in entries:
        doc = e.to_json()
        when = _dt.datetime.fromtimestamp(e.time).strftime("%Y-%m-%d %H:%M:%S") if e.time else "?"
        pause = f"paused {e.pause_ms:.2f} ms" if e.pause_ms is not None else "not paused"
        size = (text.core_size_text(e.core_bytes, doc["disk_bytes"]) if doc["exists"]
                else "deleted")
        exe = os.path.basename(e.exe) if e.exe else "?"
        # two lines: the facts, then the core's path alone, never broken
        text.say(f"#{e.id}  {when}  pid {e.pid} {exe}  {e.reason}  {pause}  {size}")
        text.say(f"    {e.core}")
    return 0
