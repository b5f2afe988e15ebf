"""Taking a snapshot of a running libtag process: signal it, wait for its core,
record it in the catalog.

The process itself decides where its core goes: its LIBTAG_DIR (as read from
/proc/PID/environ), else $XDG_STATE_HOME/forensics/snapshots of its own
environment (libtag/src/snapshot.c open_snapshot_root), and which signal asks
for it: its LIBTAG_SIGNAL (libtag/src/options.c, default SIGUSR2).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from forensics.core.notes import signal_name
from forensics.errors import InputError
from forensics.reader.abi import TAG_REAP_REQUEST
from forensics.reader.live import read_maps
from forensics.snapshots import catalog, snapdir

# LIBTAG_SIGNAL names libtag accepts besides numbers, RTMIN+N and none
# (libtag/src/options.c signal_number; tests/unit/test_abi_mirror.py compares).
LIBTAG_SIGNALS = ("USR1", "USR2", "PWR", "URG", "WINCH", "TTIN")
# " (deleted)": the library file was replaced (an upgrade, a reinstall) while
# the process runs; the mapped copy is still libtag.
_LIBTAG_MAPPING = re.compile(r"(^|/)libtag[^/]*\.so(\.[0-9.]+)?( \(deleted\))?$")


class PermissionDenied(InputError):
    """The process belongs to someone else."""


# ---------------------------------------------------------------- target --

def _no_permission(pid: int, uid: int | None = None) -> PermissionDenied:
    me = os.geteuid()
    who = f"it runs as uid {uid} and you are uid {me}" if uid is not None else \
        f"access to its /proc entries was refused to uid {me}"
    return PermissionDenied(
        f"no permission to snapshot pid {pid}: {who}; run forensics as the "
        f"process's user (or root)")


def open_process(pid: int):
    """psutil.Process of *pid*, refused if it is not ours (unless we are root)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        uids = proc.uids()
        status = proc.status()
    except psutil.NoSuchProcess:
        raise InputError(f"no process with pid {pid}") from None
    except psutil.AccessDenied:
        raise _no_permission(pid) from None
    if status == psutil.STATUS_ZOMBIE:
        raise InputError(f"no process with pid {pid} (it has exited and is a zombie)")
    me = os.geteuid()
    # Root may signal anyone; anybody else only a process of their own uid.
    # Checked here, not left to kill(2): its rule (real or saved uid) is
    # looser than what reading the process's maps and core needs.
    if me != 0 and (uids.real != me or uids.effective != me):
        raise _no_permission(pid, uids.effective if uids.effective != me else uids.real)
    return proc


def libtag_loaded(pid: int) -> bool:
    """libtag.so is mapped in the process, or its executable exports libtag_snapshot
    (libtag.a linked in statically)."""
    try:
        maps = read_maps(pid)
    except FileNotFoundError:
        raise InputError(f"no process with pid {pid}") from None
    except PermissionError:
        raise _no_permission(pid) from None
    if any(m.path and _LIBTAG_MAPPING.search(m.path) for m in maps):
        return True
    return _exe_exports_libtag(pid)


def _exe_exports_libtag(pid: int) -> bool:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        with open(f"/proc/{pid}/exe", "rb") as f:
            elf = ELFFile(f)
            for section in elf.iter_sections():
                if not isinstance(section, SymbolTableSection):
                    continue
                for sym in section.get_symbol_by_name("libtag_snapshot") or ():
                    if sym["st_shndx"] != "SHN_UNDEF":
                        return True
    except PermissionError:
        raise _no_permission(pid) from None
    except (OSError, ELFError):
        return False
    return False


def parse_signal(value: str | None) -> int | None:
    """The snapshot signal named by LIBTAG_SIGNAL (None = turned off), as libtag parses it."""
    if value is None or value == "":
        return int(signal.SIGUSR2)
    v = value
    if v in ("none", "0"):
        return None
    if v.isdigit():
        return int(v)
    if v.startswith("SIG"):
        v = v[3:]
    if v.startswith("RTMIN+") and v[6:].isdigit():
        return int(signal.SIGRTMIN) + int(v[6:])
    if v in LIBTAG_SIGNALS:
        return int(signal.Signals[f"SIG{v}"])
    raise InputError(f"the process's LIBTAG_SIGNAL={value} is not a signal libtag knows")


def snapshot_root(environ: dict[str, str]) -> Path:
    """Where libtag in a process with this environment makes its snapshot
    directories (libtag/src/snapshot.c open_snapshot_root)."""
    d = environ.get("LIBTAG_DIR")
    if d:
        return Path(d)
    state = environ.get("XDG_STATE_HOME", "")
    if state.startswith("/"):
        return Path(state) / "forensics" / "snapshots"
    home = environ.get("HOME", "")
    if home.startswith("/"):
        return Path(home) / ".local" / "state" / "forensics" / "snapshots"
    raise InputError("the process has neither LIBTAG_DIR, XDG_STATE_HOME nor HOME set: "
                     "libtag cannot make a snapshot directory; start it with "
                     "`forensics run --dir DIR -- CMD`")


def as_seen(pid: int, root: Path) -> Path:
    """*root* as this process can reach it: itself, or through /proc/PID/root when
    the target runs in another mount namespace (a container, a private mount)."""
    if _same_namespace(pid, "mnt"):
        return root
    return Path(f"/proc/{pid}/root") / str(root).lstrip("/")


def unwritable_reason(pid: int, root: Path) -> str | None:
    """Why the process could not make a snapshot directory in *root*, or None.

    Looked at through /proc/PID/root, so a process in another mount namespace
    (a container, a read-only bind mount) is judged by what it sees.
    """
    base = Path(f"/proc/{pid}/root")
    p = root
    while True:
        seen = base / str(p).lstrip("/")
        try:
            st = os.lstat(seen)
        except FileNotFoundError:
            if p.parent == p:
                return None
            p = p.parent
            continue
        except PermissionError:
            return None  # cannot tell from here
        break
    try:
        if os.statvfs(seen).f_flag & os.ST_RDONLY:
            return f"{p} is on a read-only file system"
    except OSError:
        return None
    if not os.access(seen, os.W_OK | os.X_OK):
        return f"{p} is not writable (permission denied)"
    if p == root:
        import stat as _stat
        if _stat.S_ISLNK(st.st_mode):
            return f"{root} is a symlink (libtag refuses to follow it)"
        if st.st_mode & 0o022:
            return (f"{root} is writable by group or others (mode {oct(st.st_mode & 0o777)}); "
                    f"libtag refuses it: chmod 700 it")
    return None


# ------------------------------------------------------------------ take --

def ask_to_reap(pid: int) -> None:
    """Ask a libtag process to collect its finished snapshot child now (a
    sigqueue of TAG_REAP_REQUEST on libtag's SIGRTMAX-1), so an idle process
    is not left with a zombie until it next allocates.  Best effort: the
    snapshot is already complete and recorded either way."""
    import ctypes
    import ctypes.util

    class _SigVal(ctypes.Union):
        _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, _SigVal]
        value = _SigVal(sival_int=ctypes.c_int(TAG_REAP_REQUEST).value)
        libc.sigqueue(pid, int(signal.SIGRTMAX) - 1, value)
    except (OSError, AttributeError):
        pass


def _same_namespace(pid: int, kind: str) -> bool:
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino == os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return True  # no such namespace kind here: one clock for all


def _ours(fresh: list, sent_ns: int | None):
    """The snapshot that answers a request sent at sent_ns: of the on-demand
    snapshots that appeared since, oldest first, the first whose request_ns
    is not before it.  One that started earlier answers another request (two
    `forensics snapshot` runs may signal in either order).  None while that
    cannot be told yet: a snapshot's info comes right after its directory,
    and one still without info when a later one has it has failed."""
    for i, d in enumerate(fresh):
        info = d.read_info()
        if not info:
            if any(later.read_info() for later in fresh[i + 1:]):
                continue
            return None
        asked = info.get("request_ns", "")
        if sent_ns is None or not asked.isdigit() or int(asked) >= sent_ns:
            return d
    return None


def take(pid: int, *, timeout: float, fallback_dir: str | None = None,
         note=lambda msg: None, status=None) -> dict:
    """Signal *pid* for an on-demand snapshot, wait for its core, record it.

    Returns the JSON document of `forensics snapshot --json`.
    """
    import psutil


    proc = open_process(pid)
    if not libtag_loaded(pid):
        raise InputError(
            f"process {pid} is not running under libtag: start it with "
            f"`forensics run -- CMD` or LD_PRELOAD=$(forensics lib-path)")
    try:
        environ = proc.environ()
    except psutil.AccessDenied:
        environ = None
    except psutil.NoSuchProcess:
        raise InputError(f"no process with pid {pid}") from None
    if environ:
        root = snapshot_root(environ)
        if fallback_dir and os.path.abspath(fallback_dir) != str(root):
            note(f"pid {pid} writes its snapshots to {root} (its LIBTAG_DIR or XDG "
                 f"state dir); --dir {fallback_dir} is not used")
        sig = parse_signal(environ.get("LIBTAG_SIGNAL"))
    else:
        if not fallback_dir:
            raise InputError(
                f"cannot read the environment of pid {pid} to learn where its snapshots "
                f"go: give its LIBTAG_DIR with --dir")
        root = Path(os.path.abspath(fallback_dir))
        sig = int(signal.SIGUSR2)
    if sig is None:
        raise InputError(f"process {pid} has on-demand snapshots turned off "
                         f"(LIBTAG_SIGNAL=none); restart it without that setting")
    seen_root = as_seen(pid, root)
    if seen_root != root:
        note(f"pid {pid} runs in another mount namespace: its snapshot dir {root} "
             f"is read through {seen_root}, valid while it runs")
    try:
        exe = proc.exe() or None
    except (psutil.AccessDenied, psutil.ZombieProcess, psutil.NoSuchProcess):
        exe = None

    before = {d.name for d in snapdir.list_dirs(seen_root, pid)}
    # libtag writes in each on-demand snapshot's info when the oldest request
    # it serves arrived (request_ns, CLOCK_MONOTONIC): ours is the first that
    # started after this moment.  A monotonic clock is only comparable in
    # one time namespace.
    sent_ns = time.monotonic_ns() if _same_namespace(pid, "time") else None
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise InputError(f"no process with pid {pid}") from None
    except PermissionError:
        raise _no_permission(pid, proc.uids().effective) from None

    deadline = time.monotonic() + timeout
    tick = (lambda: status.update(f"waiting for the core of pid {pid}")) if status else None
    snap = None
    while snap is None:
        fresh = [d for d in snapdir.list_dirs(seen_root, pid)
                 if d.name not in before and d.reason == "on-demand"]
        snap = _ours(fresh, sent_ns)
        if snap is not None:
            break
        if snapdir.process_exited(pid):
            raise InputError(f"process {pid} exited before it took the snapshot")
        why = unwritable_reason(pid, root)
        if why is not None:
            raise InputError(
                f"process {pid} cannot write its snapshot: {why}; it runs on without "
                f"one (point its LIBTAG_DIR at a writable directory of its user)")
        if time.monotonic() >= deadline:
            raise snapdir.SnapshotTimeout(
                f"timed out after {timeout:g} s waiting for the core of pid {pid} "
                f"(snapshot dir {root}: no new snapshot appeared; does the process "
                f"block or ignore {signal_name(sig, unknown='signal {}')}?)")
        time.sleep(snapdir.POLL_S)

    try:
        snapdir.wait_complete(snap, max(deadline - time.monotonic(), 0.0), tick=tick)
    except snapdir.SnapshotTimeout:
        raise snapdir.SnapshotTimeout(
            f"timed out after {timeout:g} s waiting for the core of pid {pid} "
            f"(snapshot dir {snap.path})") from None
    except snapdir.SnapshotFailed as e:
        raise snapdir.SnapshotFailed(
            f"snapshot of pid {pid} failed: {snapdir.read_error(snap.path) or e.message} "
            f"(snapshot dir {snap.path}); the process runs on") from None
    from forensics.files import disk_bytes

    core = snapdir.find_core(snap.path)
    assert core is not None  # wait_complete raised otherwise
    ask_to_reap(pid)
    with catalog.Catalog() as cat:
        if seen_root == root:
            cat.add_root(root)
        row = snapdir.record(snap, core, exe=exe, catalog=cat)
    return {
        "pid": pid,
        "core": os.path.abspath(core),
        "reason": snap.reason,
        "pause_ms": float(snap.pause_ms if snap.pause_ms is not None else 0.0),
        "core_bytes": int(row["core_bytes"]),
        "disk_bytes": disk_bytes(core),
        "dir": os.path.abspath(snap.path),
        "seq": snap.seq,
        "exe": row["exe"],
        "time": snap.time,
        "threads_stopped": row["summary"].get("threads_stopped"),
    }
