"""The cores systemd-coredump holds: found for ``forensics list`` and for
``--coredump MATCH``.

Where ``core_pattern`` pipes cores to systemd-coredump, each crash's core is a
file in its storage folder, compressed as systemd is configured (zstd by
default, lz4 or xz; ``Compress=no``: plain), named

    core.COMM.UID.BOOTID.PID.TIMESTAMP[.zst|.lz4|.xz]

(COMM with ``.``, ``/`` and space escaped as ``\\xNN``, TIMESTAMP in µs since
the epoch), and with the extended attributes systemd-coredump sets on it:
``user.coredump.pid``, ``.uid``, ``.gid``, ``.signal``, ``.timestamp``,
``.comm``, ``.exe`` (``.hostname``, ``.rlimit``).  The journal has a record of
each crash too, which ``coredumpctl --json=short list`` prints: ``time`` (µs),
``pid``, ``uid``, ``gid``, ``sig``, ``corefile`` (``present``, ``missing``,
``journal``, ...), ``exe``, ``size``.

Both are read: the folder is what can be opened (and is all there is where
journald does not run: a container); coredumpctl adds the crashes whose file
is gone or was never written, each matched to its file by pid and time.

Settings (the machine's are the defaults; the tests point them elsewhere):

- ``FORENSICS_COREDUMP_DIR``: the storage folder (``/var/lib/systemd/coredump``)
- ``FORENSICS_COREDUMPCTL``: the coredumpctl to run (``coredumpctl`` on PATH);
  empty: do not run one
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from forensics.errors import InputError

DEFAULT_DIR = "/var/lib/systemd/coredump"
COREDUMPCTL_TIMEOUT = 10.0  # seconds: a journal too large or a hung bus is no hang here

_NAME = re.compile(r"^core\.(?P<comm>[^.]*)\.(?P<uid>\d+)\.(?P<boot>[0-9a-f]{32})\."
                   r"(?P<pid>\d+)\.(?P<ts>\d+)(?:\.(?P<ext>zst|lz4|xz))?$")
_XATTR = "user.coredump."
# how long after the crash (COREDUMP_TIMESTAMP, the file's name) the journal
# may have logged it (coredumpctl's time): systemd-coredump writes the file first
_MATCH_WINDOW_S = 300.0


@dataclass
class Coredump:
    """One crash systemd-coredump recorded."""

    path: str | None  # its core file; None: systemd has no file for it (corefile says why)
    pid: int
    uid: int | None
    comm: str | None
    exe: str | None
    signal: int | None
    time: float | None  # the crash, seconds since the epoch
    boot_id: str | None = None
    corefile: str = "present"  # coredumpctl's word: present, missing, journal, inaccessible, ...
    source: list[str] = field(default_factory=list)  # "directory", "coredumpctl"

    @property
    def program(self) -> str | None:
        return os.path.basename(self.exe) if self.exe else self.comm


def coredump_dir() -> str:
    return os.environ.get("FORENSICS_COREDUMP_DIR") or DEFAULT_DIR


def coredumpctl_binary() -> str | None:
    """The coredumpctl to run, None for none."""
    given = os.environ.get("FORENSICS_COREDUMPCTL")
    if given is not None:
        return given or None
    return shutil.which("coredumpctl")


def _unescape(text: str) -> str:
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


def _xattr(path: str, name: str) -> str | None:
    try:
        return os.getxattr(path, _XATTR + name, follow_symlinks=False).decode("utf-8", "replace")
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def from_directory(folder: str | None = None) -> list[Coredump]:
    """The cores in systemd-coredump's folder, from each file's xattrs, else
    its name; files that are not systemd's cores, symlinks, are skipped."""
    folder = folder or coredump_dir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        m = _NAME.match(name)
        if m is None:
            continue
        path = os.path.join(folder, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        ts = _int(_xattr(path, "timestamp")) or int(m["ts"])
        out.append(Coredump(
            path=path,
            pid=_int(_xattr(path, "pid")) or int(m["pid"]),
            uid=_int(_xattr(path, "uid")) if _xattr(path, "uid") is not None else int(m["uid"]),
            comm=_xattr(path, "comm") or _unescape(m["comm"]),
            exe=_xattr(path, "exe"),
            signal=_int(_xattr(path, "signal")),
            time=ts / 1e6,
            boot_id=m["boot"],
            source=["directory"],
        ))
    return out


_SIGNALS = {f"SIG{s.name[3:]}": int(s) for s in __import__("signal").Signals if s.name.startswith("SIG")}


def _signal(value) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        name = value.upper()
        return _SIGNALS.get(name if name.startswith("SIG") else f"SIG{name}", _int(value))
    return None


def from_coredumpctl(binary: str | None = None) -> list[Coredump] | None:
    """The crashes ``coredumpctl --json=short list`` reports (its file not
    known: path None), or None when there is no coredumpctl or it fails (no
    journal, no crash yet: it exits 1 saying "No coredumps found")."""
    binary = binary or coredumpctl_binary()
    if not binary:
        return None
    try:
        done = subprocess.run([binary, "--json=short", "--no-pager", "list"], capture_output=True,
                              text=True, timeout=COREDUMPCTL_TIMEOUT, stdin=subprocess.DEVNULL)
        rows = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not isinstance(rows, list):
        return None
    out = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("pid"), int):
            continue
        t = row.get("time")
        exe = row.get("exe") if isinstance(row.get("exe"), str) else None
        out.append(Coredump(
            path=None, pid=row["pid"], uid=row.get("uid") if isinstance(row.get("uid"), int) else None,
            comm=None, exe=exe, signal=_signal(row.get("sig")),
            time=t / 1e6 if isinstance(t, (int, float)) else None,
            corefile=str(row.get("corefile") or "present"), source=["coredumpctl"],
        ))
    return out


def coredumps() -> list[Coredump]:
    """Every crash systemd-coredump holds, newest first: the folder's files,
    each joined with coredumpctl's record of it (same pid, logged within
    minutes of the crash), then coredumpctl's crashes with no file here."""
    files = from_directory()
    journal = from_coredumpctl() or []
    for rec in journal:
        best = None
        for f in files:
            if f.pid != rec.pid or "coredumpctl" in f.source:
                continue
            if rec.time is not None and f.time is not None and \
                    not -1.0 <= rec.time - f.time <= _MATCH_WINDOW_S:
                continue
            best = f
            break
        if best is not None:
            best.source.append("coredumpctl")
            best.exe = best.exe or rec.exe
            best.signal = best.signal if best.signal is not None else rec.signal
            best.corefile = rec.corefile
        else:
            files.append(rec)
    files.sort(key=lambda c: (c.time or 0.0, c.pid), reverse=True)
    return files


def _hits(spec: str) -> tuple[list[Coredump], str]:
    """(every crash systemd-coredump recorded of pid spec (all digits) or of
    the program spec (its executable's name or path, or its comm), newest
    first, those without a core file included; what spec is, in words)."""
    found = coredumps()
    if spec.isdigit():
        return [c for c in found if c.pid == int(spec)], f"pid {spec}"
    return [c for c in found if spec in (c.exe, c.program, c.comm)], f"program {spec}"


def _none_of(spec: str, what: str) -> InputError:
    where = coredump_dir()
    return InputError(f"--coredump {spec}: no core of {what} in {where}"
                      f"{'' if coredumpctl_binary() else ' (and no coredumpctl)'}; "
                      f"`forensics list` shows the cores there are")


def match(spec: str) -> Coredump:
    """The newest core systemd-coredump holds of pid spec (all digits) or of
    the program spec (its executable's name or path, or its comm)."""
    hits, what = _hits(spec)
    with_file = [c for c in hits if c.path is not None]
    if with_file:
        return with_file[0]
    if hits:
        c = hits[0]
        raise InputError(f"--coredump {spec}: systemd-coredump recorded a crash of {what} "
                         f"but holds no core file for it (coredumpctl: corefile {c.corefile})")
    raise _none_of(spec, what)


def match_all(spec: str) -> list[Coredump]:
    """Every crash systemd-coredump recorded of pid spec (all digits) or of
    the program spec, newest first, those whose core systemd does not hold
    included (path None; no_file says so): what ``triage --coredump`` reads.
    InputError when there is none."""
    hits, what = _hits(spec)
    if not hits:
        raise _none_of(spec, what)
    return hits


def no_file(spec: str, c: Coredump) -> str:
    """The line that says systemd holds no core file for the crash c that
    --coredump spec matched."""
    when = (_dt.datetime.fromtimestamp(c.time, _dt.timezone.utc).strftime(" at %Y-%m-%d %H:%M:%SZ")
            if c.time is not None else "")
    prog = f" ({c.program})" if c.program else ""
    return (f"--coredump {spec}: systemd-coredump recorded a crash of pid {c.pid}{prog}{when} "
            f"but holds no core file for it (coredumpctl: corefile {c.corefile})")
