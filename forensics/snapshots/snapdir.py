"""Snapshot directories as libtag writes them, and waiting for their cores.

libtag (libtag/src/snapshot/snapshot.c) makes one directory per snapshot::

    <dir>/<comm>-<pid>-<seq>-<reason>[-N]/
        core        the core (or core.<pid>, as the kernel's core_pattern says)
        info        key=value lines the traced process writes after its fork:
                    pid, child, seq, reason, tid, threads_stopped, pause_ns,
                    fork_ns, time_ms (crash dirs: pid, child=0, seq, reason, tid)
        error       one line, when the snapshot child failed (e.g. disk full)

The core is complete once the process that writes it has exited: the fork
child named by ``child=`` (a zombie until libtag reaps it at the next
snapshot, or gone), or for a crash directory (``child=0``) the crashing
process itself.  Its size must then stay the same between two looks.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from forensics.answers.documents import CatalogEntryDoc
from forensics.core.core import Core
from forensics.errors import ForensicsError, InputError
from forensics.reader.abi import snapshot_dir_reasons
from forensics.reader.complete import complete_core
from forensics.snapshots import catalog as _catalog

REASONS = snapshot_dir_reasons()  # what libtag names a directory after

_NAME = re.compile(
    r"^(?P<comm>.+)-(?P<pid>\d+)-(?P<seq>\d+)-(?P<reason>"
    + "|".join(re.escape(r) for r in REASONS)
    + r")(?:-(?P<n>\d+))?$"
)

# How often wait_complete looks again.
POLL_S = 0.02


class SnapshotFailed(ForensicsError):
    """The snapshot child said why it could not write the core (its error file)."""


class SnapshotTimeout(ForensicsError):
    """The core was not complete in time."""


@dataclass
class SnapshotDir:
    path: Path
    comm: str
    pid: int
    seq: int
    reason: str
    info: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name

    def read_info(self) -> dict[str, str]:
        self.info = read_info(self.path)
        return self.info

    @property
    def child(self) -> int | None:
        """The pid of the process writing the core: 0 for a crash dir, None before info exists."""
        v = self.info.get("child")
        return int(v) if v is not None and v.isdigit() else None

    @property
    def pause_ms(self) -> float | None:
        v = self.info.get("pause_ns")
        return int(v) / 1e6 if v is not None and v.isdigit() else None

    @property
    def time(self) -> float | None:
        """Seconds since the epoch when the snapshot was taken (None if not known)."""
        v = self.info.get("time_ms")
        if v is not None and v.isdigit():
            return int(v) / 1000.0
        try:
            return self.path.stat().st_mtime
        except OSError:
            return None


def comm_for_dir(pid: int) -> str:
    """*pid*'s command name as a snapshot directory's name starts (no "/" or " ")."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            c = f.read().rstrip("\n")
    except OSError:
        c = ""
    return "".join("_" if ch in "/ " else ch for ch in c) or "process"


def make_dir(root: Path, name: str) -> Path:
    """A new snapshot directory *name* (0700) in *root*, or name-1, name-2...
    when it exists."""
    for i in range(100):
        p = root / (name if i == 0 else f"{name}-{i}")
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            continue
        os.chmod(p, 0o700)
        return p
    raise InputError(f"cannot make a snapshot directory {name} in {root}: too many exist")


def parse_name(name: str) -> tuple[str, int, int, str] | None:
    """(comm, pid, seq, reason) of a snapshot directory name, or None."""
    m = _NAME.match(name)
    if not m:
        return None
    return m["comm"], int(m["pid"]), int(m["seq"]), m["reason"]


def list_dirs(root: str | os.PathLike[str], pid: int | None = None, *,
              owners: Iterable[int] = ()) -> list[SnapshotDir]:
    """The snapshot directories directly in *root* (of *pid* if given), oldest seq first.

    A root that does not exist has none; symlinks are never followed.  Only
    directories of ours count, or of *owners*: the user of a process whose
    own root this is (libtag keeps that root its user's and writable by
    nobody else, so nobody else can plant a directory there).
    """
    out: list[SnapshotDir] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return out
    except NotADirectoryError:
        raise InputError(f"{root} is not a directory") from None
    except PermissionError:
        raise InputError(f"cannot read snapshot directory {root}: permission denied") from None
    mine = {os.geteuid(), *owners}
    try:
        rst = os.stat(root)
        if not rst.st_mode & 0o022:
            # a root only its owner may write: nobody else can plant a
            # directory there, so its owner's are as good as ours (libtag in
            # a process of that user made them)
            mine.add(rst.st_uid)
    except OSError:
        pass
    for e in entries:
        parsed = parse_name(e.name)
        if parsed is None or not e.is_dir(follow_symlinks=False):
            continue
        try:
            if e.stat(follow_symlinks=False).st_uid not in mine:
                continue  # not ours: anyone who can write the root could plant it
        except OSError:
            continue
        comm, p, seq, reason = parsed
        if pid is not None and p != pid:
            continue
        out.append(SnapshotDir(Path(e.path), comm, p, seq, reason))
    out.sort(key=lambda d: (d.pid, d.seq, d.name))
    return out


def _read_small(path: Path, limit: int = 4096) -> str | None:
    """A small regular file's text, None if absent.  Never follows a symlink
    and never blocks: a FIFO or a device planted there is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise InputError(f"cannot read {path}: permission denied") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path} is not a regular file")
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


def read_info(path: str | os.PathLike[str]) -> dict[str, str]:
    """The key=value lines of <path>/info ({} while libtag has not written it yet)."""
    text = _read_small(Path(path) / "info")
    if text is None:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            info[key.strip()] = value.strip()
    return info


def read_error(path: str | os.PathLike[str]) -> str | None:
    """The one line the snapshot child left in <path>/error, or None."""
    text = _read_small(Path(path) / "error")
    if text is None:
        return None
    text = text.strip()
    return text or "the snapshot child failed without saying why"


def find_core(path: str | os.PathLike[str]) -> Path | None:
    """The core in a snapshot directory: ``core``, else ``core.<something>``
    (the kernel's name when core_uses_pid is set), never a ``.tmp``."""
    d = Path(path)
    plain = d / "core"
    if plain.is_file() and not plain.is_symlink():
        return plain
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return None
    for name in names:
        if name.startswith("core.") and not name.endswith((".tmp", ".fxidx", ".fxptr")):
            p = d / name
            if p.is_file() and not p.is_symlink():
                return p
    return None


def process_exited(pid: int) -> bool:
    """True when *pid* no longer runs: absent, or a zombie (state Z or X)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    except PermissionError:
        return False
    # "pid (comm) S ..." - comm may contain spaces and parentheses.
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state in (b"Z", b"X", b"x")


def is_complete(snap: SnapshotDir, *, writer_exited: Callable[[int], bool] = process_exited,
                ) -> tuple[bool, Path | None]:
    """(complete?, core path).  Raises SnapshotFailed if the child left an error file."""
    err = read_error(snap.path)
    if err is not None:
        raise SnapshotFailed(f"snapshot {snap.path} failed: {err}")
    info = snap.read_info()
    if not info:
        return False, None
    child = snap.child
    writer = child if child else int(info.get("pid", snap.pid))
    if not writer_exited(writer):
        return False, None
    return True, find_core(snap.path)


def wait_complete(path: str | os.PathLike[str] | SnapshotDir, timeout: float,
                  *, tick: Callable[[], None] | None = None,
                  writer_exited: Callable[[int], bool] = process_exited) -> SnapshotDir:
    """Wait until the core of one snapshot directory is complete; return it (info read).

    Complete: the writer (the fork child, or the crashing process) has exited
    and the core's size is the same at two looks.  Raises SnapshotFailed
    with the child's own words when it left an ``error`` file, or when it
    exited without writing any core, and SnapshotTimeout after *timeout* s.
    """
    snap = path if isinstance(path, SnapshotDir) else _snapshot_dir(Path(path))
    deadline = time.monotonic() + timeout
    last_size = -1
    while True:
        done, core = is_complete(snap, writer_exited=writer_exited)
        if done:
            if core is None:
                # The writer may have left the error file just before exiting.
                err = read_error(snap.path)
                if err is not None:
                    raise SnapshotFailed(f"snapshot {snap.path} failed: {err}")
                if snap.child == 0:  # a crash dir: the crashing process dumps itself
                    raise SnapshotFailed(
                        f"crash snapshot {snap.path} has no core: pid {snap.pid} died "
                        f"without dumping one (core size limit 0, or core_pattern not a "
                        f"plain file? LIBTAG_CORE=self makes libtag write it)")
                raise SnapshotFailed(
                    f"snapshot {snap.path} has no core: the snapshot child exited "
                    f"without writing one (is the core size limit 0, or core_pattern "
                    f"a pipe? LIBTAG_CORE=self makes libtag write it)")
            size = core.stat().st_size
            if size == last_size:
                complete_core(core)
                return snap
            last_size = size
        if time.monotonic() >= deadline:
            raise SnapshotTimeout(
                f"timed out after {timeout:g} s waiting for the core of pid {snap.pid} "
                f"(snapshot dir {snap.path})")
        if tick is not None:
            tick()
        time.sleep(POLL_S)


def _snapshot_dir(path: Path) -> SnapshotDir:
    parsed = parse_name(path.name)
    if parsed is None:
        raise InputError(f"{path} is not a libtag snapshot directory "
                         f"(expected <comm>-<pid>-<seq>-<reason>)")
    comm, pid, seq, reason = parsed
    return SnapshotDir(path, comm, pid, seq, reason)


def core_exe(core: Path) -> str | None:
    """The executable a core was taken of, from its notes; None if unreadable."""
    try:
        with Core(core) as c:
            return c.exe
    except Exception:  # a partial or foreign core: the catalog just lacks the exe
        return None


def record(snap: SnapshotDir, core: Path, *, exe: str | None = None,
           catalog=None) -> CatalogEntryDoc:
    """Put a complete snapshot in the catalog; returns its catalog entry."""

    complete_core(core)  # before its size is recorded; a no-op when done
    cat = catalog if catalog is not None else _catalog.Catalog()
    info = snap.info or snap.read_info()
    summary = {
        "dir": str(snap.path),
        "seq": snap.seq,
        "tid": _int(info.get("tid")),
        "threads_stopped": _int(info.get("threads_stopped")),
        "fork_ms": _int(info.get("fork_ns")) / 1e6 if info.get("fork_ns", "").isdigit() else None,
        "comm": snap.comm,
    }
    return cat.record(
        core=os.path.abspath(core),
        pid=snap.pid,
        exe=exe if exe is not None else core_exe(core),
        time=snap.time,
        reason=snap.reason,
        pause_ms=snap.pause_ms,
        core_bytes=core.stat().st_size,
        summary=summary,
    )


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


def scan_and_record(root: str | os.PathLike[str], *, wait: float = 0.0,
                    only: Iterable[str] | None = None, catalog=None,
                    ) -> list[tuple[SnapshotDir, CatalogEntryDoc | None, str | None]]:
    """Catalog the snapshot directories in *root* that are not in it yet.

    With *wait* > 0, waits up to that many seconds for each one still being
    written; otherwise incomplete ones are left for a later scan.  *only*
    limits the scan to these directory names.  Returns (dir, row, error) per
    directory looked at: row is None when it was not recorded, error says why
    when it failed (its error file, or a timeout).
    """

    cat = catalog if catalog is not None else _catalog.Catalog()
    names = set(only) if only is not None else None
    known = cat.known_dirs()
    results: list[tuple[SnapshotDir, dict | None, str | None]] = []
    for snap in list_dirs(root):
        if names is not None and snap.name not in names:
            continue
        if os.path.abspath(snap.path) in known:
            continue
        try:
            if wait > 0:
                wait_complete(snap, wait)
                core = find_core(snap.path)
            else:
                done, core = is_complete(snap)
                if not done or core is None:
                    results.append((snap, None, None))
                    continue
        except ForensicsError as e:
            results.append((snap, None, e.message))
            continue
        results.append((snap, record(snap, core, catalog=cat), None))
    return results
