"""List the snapshots in the catalog.

    forensics list [--json]

Looks first in the snapshot folders forensics knows (the default
$XDG_STATE_HOME/forensics/snapshots and every --dir or LIBTAG_DIR it has
used) for snapshots taken since, and catalogs the complete ones.  --json
prints an array, oldest first, of {"core", "pid", "exe", "time", "reason",
"pause_ms", "core_bytes", "dir", "exists", "summary", "id"}.
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
    rows = []
    for e in entries:
        when = _dt.datetime.fromtimestamp(e.time).strftime("%Y-%m-%d %H:%M:%S") if e.time else "?"
        pause = f"{e.pause_ms:.2f}" if e.pause_ms is not None else "-"
        missing = "" if e.to_json()["exists"] else " (deleted)"
        rows.append((when, e.pid, os.path.basename(e.exe) if e.exe else "?", e.reason, pause,
                     f"{e.core_bytes / 1e6:.1f}", e.core + missing))
    t = text.table(None, ["time", "pid", "exe", "reason", "pause ms", "MB", "core"], rows)
    t.columns[-1].overflow = "fold"  # a path cut short is useless: fold it
    t.columns[-1].no_wrap = False
    out.print(t, soft_wrap=not out.is_terminal)
    return 0
