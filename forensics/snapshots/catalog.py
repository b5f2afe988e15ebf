"""The catalog: every snapshot forensics took or found, in SQLite.

``$XDG_STATE_HOME/forensics/catalog.sqlite`` (default
``~/.local/state/forensics``; the folder 0700, the file 0600: it names cores,
and cores hold secrets).  One row per core; ``roots`` remembers the snapshot
folders forensics used (``run --dir``, a process's LIBTAG_DIR) so that
``forensics list`` can look there again for snapshots taken since.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from forensics.answers.documents import CatalogEntryDoc
from forensics.errors import InputError
from forensics.files import create_private, disk_bytes, ensure_private_dir, state_dir

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    core       TEXT NOT NULL UNIQUE,  -- absolute path of the core file
    dir        TEXT NOT NULL,         -- the snapshot directory holding it
    pid        INTEGER NOT NULL,      -- the traced process
    exe        TEXT,                  -- its executable; NULL = not known
    time       REAL,                  -- seconds since the epoch it was taken
    reason     TEXT NOT NULL,         -- on-demand, double-free, ..., crash
    pause_ms   REAL,                  -- how long the process was stopped; NULL = crash
    core_bytes INTEGER NOT NULL,      -- size of the core file
    summary    TEXT NOT NULL DEFAULT '{}'  -- JSON: seq, tid, threads_stopped, ...
);
CREATE TABLE IF NOT EXISTS roots (
    path TEXT PRIMARY KEY             -- a folder snapshot directories are made in
);
"""


@dataclass(frozen=True)
class Entry:
    id: int
    core: str
    dir: str
    pid: int
    exe: str | None
    time: float | None
    reason: str
    pause_ms: float | None
    core_bytes: int
    summary: dict[str, Any]

    def doc(self) -> CatalogEntryDoc:
        """The entry as ``forensics list --json`` gives it (docs/json.md):
        whether its core is still there, and its size on disk now."""
        return CatalogEntryDoc(**asdict(self), exists=os.path.exists(self.core),
                               disk_bytes=disk_bytes(self.core),
                               kind="crash" if self.reason == "crash" else "snapshot")


def catalog_path() -> Path:
    return state_dir() / "catalog.sqlite"


class Catalog:
    """The catalog database; opened (and created 0600) on first use."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else catalog_path()
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            ensure_private_dir(self.path.parent)
            try:
                create_private(self.path)
                db = sqlite3.connect(self.path, timeout=30)
                db.executescript(_SCHEMA)
            except (OSError, sqlite3.Error) as e:
                raise InputError(f"cannot open the catalog {self.path}: {e}") from None
            db.row_factory = sqlite3.Row
            self._db = db
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def record(self, *, core: str, pid: int, exe: str | None, time: float | None,
               reason: str, pause_ms: float | None, core_bytes: int,
               summary: dict[str, Any] | None = None, dir: str | None = None) -> dict:
        """Add (or refresh) the row of one core; returns it as a dict."""
        core = os.path.abspath(core)
        summary = dict(summary or {})
        d = dir or summary.get("dir") or os.path.dirname(core)
        summary.setdefault("dir", d)
        db = self._conn()
        try:
            with db:
                db.execute(
                    "INSERT INTO snapshots (core, dir, pid, exe, time, reason, pause_ms, "
                    "core_bytes, summary) VALUES (?,?,?,?,?,?,?,?,?) "
                    "ON CONFLICT(core) DO UPDATE SET dir=excluded.dir, pid=excluded.pid, "
                    "exe=COALESCE(excluded.exe, snapshots.exe), time=excluded.time, "
                    "reason=excluded.reason, pause_ms=excluded.pause_ms, "
                    "core_bytes=excluded.core_bytes, summary=excluded.summary",
                    (core, os.path.abspath(d), pid, exe, time, reason, pause_ms,
                     core_bytes, json.dumps(summary, sort_keys=True)),
                )
                db.execute("INSERT OR IGNORE INTO roots (path) VALUES (?)",
                           (os.path.dirname(os.path.abspath(d)),))
                row = db.execute("SELECT * FROM snapshots WHERE core = ?", (core,)).fetchone()
        except sqlite3.Error as e:
            raise InputError(f"cannot write the catalog {self.path}: {e}") from None
        return _entry(row).doc()

    def add_root(self, path: str | os.PathLike[str]) -> None:
        """Remember a folder that snapshot directories are made in."""
        db = self._conn()
        with db:
            db.execute("INSERT OR IGNORE INTO roots (path) VALUES (?)",
                       (os.path.abspath(os.fspath(path)),))

    def _query(self, sql: str):
        """Rows of a read; a catalog with another schema or damaged rows is a
        clear error naming the file, not an internal one."""
        try:
            return self._conn().execute(sql).fetchall()
        except sqlite3.Error as e:
            raise InputError(f"catalog {self.path} is damaged ({e}); move it aside and "
                             f"run forensics list to rebuild it from the snapshot dirs") from None

    def roots(self) -> list[str]:
        return [r["path"] for r in self._query("SELECT path FROM roots ORDER BY path")]

    def known_dirs(self) -> set[str]:
        return {r["dir"] for r in self._query("SELECT dir FROM snapshots")}

    def entries(self) -> list[Entry]:
        """Every row, oldest first."""
        rows = self._query("SELECT * FROM snapshots ORDER BY COALESCE(time, 0), id")
        return [e for e in (_entry(r) for r in rows) if e is not None]

    def newest(self) -> Entry | None:
        """The most recent snapshot whose core still exists, or None."""
        for e in reversed(self.entries()):
            if os.path.exists(e.core):
                return e
        return None


def _entry(row: sqlite3.Row) -> Entry | None:
    """A row as an Entry; None for a row whose fields have the wrong types
    (a damaged or foreign catalog), which is skipped."""
    try:
        summary = json.loads(row["summary"] or "{}")
    except (ValueError, TypeError):
        summary = {}
    if not isinstance(row["core"], str) or not isinstance(row["pid"], int) or not (
            row["time"] is None or isinstance(row["time"], (int, float))):
        return None
    return Entry(id=row["id"], core=row["core"], dir=row["dir"], pid=row["pid"],
                 exe=row["exe"], time=row["time"], reason=row["reason"],
                 pause_ms=row["pause_ms"], core_bytes=row["core_bytes"], summary=summary)


# Module-level conveniences over the default catalog.

def record(**fields: Any) -> CatalogEntryDoc:
    with Catalog() as c:
        return c.record(**fields)


def entries() -> list[Entry]:
    with Catalog() as c:
        return c.entries()


def newest() -> Entry | None:
    with Catalog() as c:
        return c.newest()
