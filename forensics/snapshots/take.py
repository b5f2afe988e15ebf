"""Taking a snapshot of a running libtag process: ask it, wait for its core,
record it in the catalog.

What the process answers to and where it writes are read from libtag's
control block in its memory (forensics/snapshots/handoff.py): the request
signal libtag claimed (a real-time signal the program left alone), whether
it still handles LIBTAG_SIGNAL, and the snapshot directory it resolved at
start.  No signal the program installed a handler for is ever sent.  When
the process could not write that directory (it dropped its privileges, or
the directory is not its user's), the core is handed over to the caller
instead.  When its memory cannot be read (another user's process, Yama's
ptrace_scope), its environment is the fallback: LIBTAG_DIR, else
$XDG_STATE_HOME/forensics/snapshots (libtag/src/snapshot/snapshot.c resolve_root).
"""

from __future__ import annotations

import os
import re
import signal
import stat as _stat
import time
from pathlib import Path

import psutil

from forensics.answers.documents import SnapshotDoc
from forensics.core.notes import signal_name
from forensics.errors import InputError
from forensics.files import default_snapshot_dir, disk_bytes, ensure_private_dir, write_private
from forensics.reader.abi import TAG_REAP_REQUEST, TAG_SNAPSHOT_REQUEST, AbiVersionError
from forensics.reader.live import read_maps
from forensics.snapshots import catalog, corefile, handoff, ptrace, snapdir
from forensics.snapshots.handoff import sigqueue, take_handoff

# ELF e_machine -> the name a message gives it
_MACHINES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390x", 40: "arm", 62: "x86_64",
             183: "aarch64", 243: "riscv64", 258: "loongarch64"}

# LIBTAG_SIGNAL names libtag accepts besides numbers, RTMIN+N and none
# (libtag/src/base/options.c signal_number; tests/unit/test_abi_mirror.py compares).
LIBTAG_SIGNALS = ("USR1", "USR2", "PWR", "URG", "WINCH", "TTIN")
# " (deleted)": the library file was replaced (an upgrade, a reinstall) while
# the process runs; the mapped copy is still libtag.
_LIBTAG_MAPPING = re.compile(r"(^|/)libtag[^/]*\.so(\.[0-9.]+)?( \(deleted\))?$")


class PermissionDenied(InputError):
    """The process belongs to someone else."""


# ---------------------------------------------------------------- target --

def _no_permission(pid: int, uid: int | None = None) -> PermissionDenied:
    me = os.geteuid()
    if me == 0:  # root refused: a capability is missing (ptrace's reasons)
        return PermissionDenied(ptrace.why_not_traceable(pid, PermissionError(1, "EPERM")))
    who = f"it runs as uid {uid} and you are uid {me}" if uid is not None else \
        f"access to its /proc entries was refused to uid {me}"
    return PermissionDenied(
        f"no permission to snapshot pid {pid}: {who}; run forensics as the "
        f"process's user (or root)")


def open_process(pid: int):
    """psutil.Process of *pid*, refused if it is not ours (unless we are root)."""

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


def _elf_machine(read) -> int | None:
    """e_machine of the ELF header read(0, 20) gives (a little-endian one),
    or None when it is not one."""
    try:
        head = read(0, 20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] != 1:
        return None
    return int.from_bytes(head[18:20], "little")


def emulated_machine(pid: int) -> str | None:
    """The machine whose code the libtag in *pid* is, when it is not the
    one forensics runs as: a program run by a user-mode emulator
    (qemu-user, directly or through binfmt_misc) is the emulator's process
    to the kernel, and libtag is mapped in it as the program's machine's
    library.  None for a native process, or when that cannot be read."""
    try:
        maps = read_maps(pid)
        fd = os.open(f"/proc/{int(pid)}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        lib = next((m for m in maps if m.offset == 0 and m.readable and m.path
                    and _LIBTAG_MAPPING.search(m.path)), None)
        theirs = _elf_machine(lambda off, n: os.pread(fd, n, lib.start + off)) if lib else None
    finally:
        os.close(fd)
    with open("/proc/self/exe", "rb") as f:
        ours = _elf_machine(lambda off, n: os.pread(f.fileno(), n, off))
    if theirs is None or ours is None or theirs == ours:
        return None
    return _MACHINES.get(theirs, f"ELF machine {theirs}")


# (device, inode, mtime) of an executable -> whether it exports libtag:
# `forensics list` asks this of every process, and a server's many
# processes share one executable
_EXPORTS: dict[tuple[int, int, int], bool] = {}


def _exe_exports_libtag(pid: int) -> bool:
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except PermissionError:
        raise _no_permission(pid) from None
    except OSError:
        return False
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)
    if key not in _EXPORTS:
        _EXPORTS[key] = _exe_file_exports_libtag(pid)
    return _EXPORTS[key]


def _exe_file_exports_libtag(pid: int) -> bool:
    from elftools.common.exceptions import ELFError  # deferred, start-up time: pyelftools
    from elftools.elf.elffile import ELFFile  # deferred, start-up time: pyelftools
    from elftools.elf.sections import SymbolTableSection  # deferred, start-up time: pyelftools

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
    directories (libtag/src/snapshot/snapshot.c open_snapshot_root)."""
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
    seen = Path(f"/proc/{pid}/root") / str(root).lstrip("/")
    try:
        if os.path.samefile(seen, root):
            return root  # the same folder here too: a path that outlives the process
    except OSError:
        pass
    return seen


def _status(pid: int) -> dict[str, list[str]]:
    """/proc/PID/status as {key: its fields}; raises OSError."""
    out: dict[str, list[str]] = {}
    with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, rest = line.partition(":")
            out[key] = rest.split()
    return out


def _creds(pid: int) -> tuple[int, set[int]]:
    """(effective uid, every gid) of *pid*, from /proc/PID/status."""
    st = _status(pid)
    uid = int(st["Uid"][1]) if len(st.get("Uid", ())) > 1 else 0
    gids = {int(st["Gid"][1])} if len(st.get("Gid", ())) > 1 else set()
    gids.update(int(g) for g in st.get("Groups", ()))
    return uid, gids


def _may(st: os.stat_result, uid: int, gids: set[int], bits: int) -> bool:
    """Would a process of uid/gids get *bits* (a mask of 4, 2, 1) on this inode?"""
    if uid == 0:
        return True  # CAP_DAC_OVERRIDE (search on a directory included)
    if st.st_uid == uid:
        mode = st.st_mode >> 6
    elif st.st_gid in gids:
        mode = st.st_mode >> 3
    else:
        mode = st.st_mode
    return (mode & bits) == bits


def unwritable_reason(pid: int, root: Path) -> str | None:
    """Why the process could not make a snapshot directory in *root*, or None.

    Judged as libtag in the process will be (libtag/src/snapshot/snapshot.c
    open_dir_secure): with the process's user and groups as they are now (a
    daemon that dropped its privileges is judged as the user it became), on
    the file system it sees (looked at through /proc/PID/root, so a process
    in another mount namespace is judged by what it sees).
    """

    try:
        uid, gids = _creds(pid)
    except (OSError, ValueError):
        return None  # cannot tell from here
    base = Path(f"/proc/{pid}/root")
    parts = [p for p in root.parts[1:]]
    cur = Path("/")
    st = None
    for i in range(len(parts) + 1):
        seen = base / str(cur).lstrip("/")
        try:
            # /proc/PID/root itself is a link to the process's root: follow that one
            st = os.stat(seen) if cur == Path("/") else os.lstat(seen)
        except FileNotFoundError:
            # the rest is created by the process: the last existing one must
            # let it make a directory
            parent = cur.parent
            try:
                pst = os.stat(base / str(parent).lstrip("/"))
                if os.statvfs(base / str(parent).lstrip("/")).f_flag & os.ST_RDONLY:
                    return f"{parent} is on a read-only file system"
            except OSError:
                return None
            if not _may(pst, uid, gids, 3):
                return f"{parent} is not writable by uid {uid} (permission denied)"
            return None
        except PermissionError:
            return None  # cannot tell from here
        except OSError:
            return None
        if _stat.S_ISLNK(st.st_mode):
            return f"{cur} is a symlink (libtag refuses to follow it)"
        if i == len(parts):
            break
        if not _may(st, uid, gids, 1):
            return f"uid {uid} cannot enter {cur} (permission denied)"
        cur = cur / parts[i]
    try:
        if os.statvfs(base / str(root).lstrip("/")).f_flag & os.ST_RDONLY:
            return f"{root} is on a read-only file system"
    except OSError:
        return None
    if st.st_uid != uid:
        return f"{root} belongs to uid {st.st_uid}, and the process runs as uid {uid}"
    if st.st_mode & 0o022:
        return (f"{root} is writable by group or others (mode {oct(st.st_mode & 0o777)}); "
                f"libtag refuses it: chmod 700 it")
    return None


def _ns_pid(pid: int) -> int:
    """*pid* as the process itself sees it (the innermost of NSpid: in a
    container's pid namespace libtag names its directories with that)."""
    try:
        return int(_status(pid)["NSpid"][-1])
    except (OSError, ValueError, KeyError, IndexError):
        return pid


def _child_exited_in_ns(parent: int):
    """writer_exited for a process in another pid namespace: its snapshot
    child's pid in the info file is the namespace's; find that child among
    the parent's children (libtag's fork child stays one until reaped)."""
    def exited(ns_child: int) -> bool:

        try:
            kids = psutil.Process(parent).children()
        except psutil.Error:
            return True
        for k in kids:
            if _ns_pid(k.pid) == ns_child:
                return snapdir.process_exited(k.pid)
        return True
    return exited


def _catches(pid: int, sig: int) -> bool:
    """Does *pid* have a handler for *sig* (SigCgt in /proc/PID/status)?"""
    try:
        return bool(int(_status(pid)["SigCgt"][0], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, KeyError, IndexError):
        return True  # cannot tell: assume libtag's


# ------------------------------------------------------------------ take --

def ask_to_reap(pid: int, sig: int | None = None) -> None:
    """Ask a libtag process to collect its finished snapshot child now (a
    sigqueue of TAG_REAP_REQUEST on libtag's request signal), so an idle
    process is not left with a zombie until it next allocates.  Best effort:
    the snapshot is already complete and recorded either way; never sent
    when the program took that signal."""

    try:
        sigqueue(pid, sig if sig is not None else int(signal.SIGRTMAX) - 1, TAG_REAP_REQUEST)
    except OSError:
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


class Plan:
    """How to ask one process for a snapshot, and where its core will be."""

    def __init__(self, *, root: Path | None, send, describe: str, request_sig: int | None,
                 handoff_ctl=None) -> None:
        self.root = root              # the process's snapshot root (None: handed over)
        self.send = send              # callable that asks
        self.describe = describe      # the signal, for messages
        self.request_sig = request_sig  # libtag's request signal, for the reap request
        self.handoff_ctl = handoff_ctl  # set: hand the core over instead


def _plan(pid: int, proc, *, fallback_dir: str | None, signal_override: int | None,
          note, emulated: str | None = None) -> Plan:
    """Decide how to ask *pid*: from its control block when its memory can
    be read, else from its environment.

    An emulated process (*emulated*: its machine) is asked only by a
    standard signal, its LIBTAG_SIGNAL: an emulator renumbers the
    real-time signals between the host and the program (qemu-user 7.2
    gives host signal n to the program as n - 2, and the program's two
    highest, libtag's request signal SIGRTMAX-1 among them, have no host
    number at all), so libtag's request signal - or the reap request
    after it - would arrive as another signal, whose default action
    ends the program."""
    if emulated is not None:
        return _emulated_plan(pid, emulated, signal_override)


    def by_kill(sig: int):
        return lambda: os.kill(pid, sig)

    def by_request(sig: int):
        return lambda: handoff.sigqueue(pid, sig, TAG_SNAPSHOT_REQUEST)

    old_abi = False
    try:
        ctl = handoff.read_control(pid)
    except AbiVersionError as e:
        note(f"{e.message}; asking it the old way (its LIBTAG_SIGNAL)")
        ctl, old_abi = None, True

    if ctl is not None:
        root = Path(ctl.dir) if ctl.dir else None
        if signal_override is not None:
            if root is None:
                raise InputError(f"pid {pid} has no snapshot directory (no LIBTAG_DIR, "
                                 f"XDG_STATE_HOME or HOME at its start)")
            return Plan(root=root, send=by_kill(signal_override),
                        describe=signal_name(signal_override, unknown="signal {}"),
                        request_sig=ctl.request_signal or None)
        why = unwritable_reason(pid, root) if root is not None else \
            "it has no snapshot directory (no LIBTAG_DIR, XDG_STATE_HOME or HOME at its start)"
        if why is None:
            if ctl.request_signal:
                return Plan(root=root, send=by_request(ctl.request_signal),
                            describe=f"libtag's request signal {ctl.request_signal}",
                            request_sig=ctl.request_signal)
            if ctl.user_signal:
                return Plan(root=root, send=by_kill(ctl.user_signal),
                            describe=signal_name(ctl.user_signal, unknown="signal {}"),
                            request_sig=None)
            raise InputError(_no_trigger(pid))
        if not ctl.request_signal:
            raise InputError(f"pid {pid} cannot write its snapshots ({why}) and "
                             f"{_no_trigger(pid)[len(f'pid {pid} '):]}")
        dest = Path(os.path.abspath(fallback_dir)) if fallback_dir else default_snapshot_dir()
        note(f"pid {pid} cannot write its own snapshot directory ({why}): "
             f"its core is handed over to {dest}")
        return Plan(root=dest, send=None, describe=f"libtag's request signal {ctl.request_signal}",
                    request_sig=ctl.request_signal, handoff_ctl=ctl)

    # No control block to read (another user's process, ptrace_scope, an
    # older libtag): its environment, as far as it can still be read.
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
        user_sig = parse_signal(environ.get("LIBTAG_SIGNAL"))
    else:
        if not fallback_dir:
            raise InputError(
                f"cannot read the memory or the environment of pid {pid} to learn where its "
                f"snapshots go: run forensics as root, or give its LIBTAG_DIR with --dir")
        root = Path(os.path.abspath(fallback_dir))
        user_sig = int(signal.SIGUSR2)
    if signal_override is not None:
        return Plan(root=root, send=by_kill(signal_override),
                    describe=signal_name(signal_override, unknown="signal {}"), request_sig=None)
    rt = int(signal.SIGRTMAX) - 1
    if not old_abi and _catches(pid, rt):
        return Plan(root=root, send=by_request(rt), describe=f"libtag's request signal {rt}",
                    request_sig=rt)
    if user_sig is None:
        raise InputError(f"process {pid} has on-demand snapshots turned off "
                         f"(LIBTAG_SIGNAL=none); restart it without that setting")
    if not _catches(pid, user_sig):
        raise InputError(_no_trigger(pid))
    return Plan(root=root, send=by_kill(user_sig),
                describe=signal_name(user_sig, unknown="signal {}"), request_sig=None)


def _emulated_plan(pid: int, machine: str, signal_override: int | None) -> Plan:
    """How to ask an emulated process (see _plan): by a standard signal
    libtag handles there, into the directory it writes itself."""
    why = (f"pid {pid} runs {machine} code under an emulator, which renumbers real-time "
           f"signals: libtag's request signal cannot reach it")
    if signal_override is not None and signal_override >= 32:  # 32 and up: real-time
        raise InputError(f"{why}, nor --signal {signal_override}; nothing was sent.  Ask it by "
                         f"a standard signal it handles (--signal USR2)")
    ctl = handoff.read_control(pid)
    if ctl is not None:
        root, sig = (Path(ctl.dir) if ctl.dir else None), ctl.user_signal
    else:  # the emulator keeps the program's memory elsewhere: its environment
        try:
            environ = psutil.Process(pid).environ()
        except psutil.Error:
            environ = {}
        root = snapshot_root(environ) if environ else None
        sig = parse_signal(environ.get("LIBTAG_SIGNAL")) if environ else None
    if root is None:
        raise InputError(f"{why}, and where it writes its snapshots cannot be read; nothing "
                         f"was sent")
    unwritable = unwritable_reason(pid, root)
    if unwritable is not None:
        raise InputError(f"{why}, and it cannot write its own snapshot directory ({unwritable}): "
                         f"a core handed over needs that signal; nothing was sent")
    if signal_override is not None:
        sig = signal_override
    if not sig:
        raise InputError(f"{why}, and it handles no LIBTAG_SIGNAL; nothing was sent.  Restart it "
                         f"with LIBTAG_SIGNAL set to a standard signal it leaves alone (USR2, "
                         f"the default, or WINCH, URG, PWR, TTIN)")
    return Plan(root=root, send=lambda: os.kill(pid, sig),
                describe=signal_name(sig, unknown="signal {}"), request_sig=None)


def _no_trigger(pid: int) -> str:
    return (f"pid {pid} has no snapshot trigger: the program installed its own handlers on "
            f"the signals libtag listens on (its request signal {int(signal.SIGRTMAX) - 1} and "
            f"LIBTAG_SIGNAL); nothing was sent.  Restart it with LIBTAG_SIGNAL set to a signal "
            f"it leaves alone (for example RTMIN+3), or pass --signal SIG if you know one "
            f"libtag handles")


def take(pid: int, *, timeout: float, fallback_dir: str | None = None,
         signal_override: int | None = None, use_ptrace: bool = False,
         note=lambda msg: None, status=None) -> SnapshotDoc:
    """Snapshot *pid*, wait for its core, record it: a process that runs
    libtag is asked to fork itself; any other (or any, with *use_ptrace*)
    is forked from outside by ptrace (take_by_ptrace).

    Returns the document of `forensics snapshot --json`.
    """

    proc = open_process(pid)
    loaded = libtag_loaded(pid)
    emulated = emulated_machine(pid) if loaded else None
    if emulated is not None and use_ptrace:
        raise InputError(f"pid {pid} runs {emulated} code under an emulator: ptrace would stop "
                         f"and fork the emulator, not the program; leave out --ptrace (libtag "
                         f"in it takes the snapshot)")
    if use_ptrace or not loaded:
        return take_by_ptrace(pid, proc, dest=fallback_dir, note=note, status=status)
    plan = _plan(pid, proc, fallback_dir=fallback_dir, signal_override=signal_override,
                 note=note, emulated=emulated)
    try:
        # an emulated process's executable is the emulator: the core names the program
        exe = None if emulated else proc.exe() or None
    except (psutil.AccessDenied, psutil.ZombieProcess, psutil.NoSuchProcess):
        exe = None
    tick = (lambda: status.update(f"waiting for the core of pid {pid}")) if status else None

    if plan.handoff_ctl is not None:
        path, _info = take_handoff(pid, plan.handoff_ctl, plan.root, timeout=timeout, tick=tick)
        snap = snapdir.SnapshotDir(path, *snapdir.parse_name(path.name))
        seen_root = root = plan.root
    else:
        root = plan.root
        seen_root = as_seen(pid, root)
        if seen_root != root:
            note(f"pid {pid} runs in another mount namespace: its snapshot dir {root} "
                 f"is read through {seen_root}, valid while it runs")
        snap = _take_in_place(pid, proc, plan, seen_root, timeout=timeout, tick=tick)

    core = snapdir.find_core(snap.path)
    assert core is not None  # wait_complete raised otherwise
    if plan.request_sig:
        ask_to_reap(pid, plan.request_sig)
    with catalog.Catalog() as cat:
        if seen_root == root:
            cat.add_root(root)
        row = snapdir.record(snap, core, exe=exe, catalog=cat)
    return SnapshotDoc(
        pid=pid,
        core=os.path.abspath(core),
        reason=snap.reason,
        pause_ms=float(snap.pause_ms if snap.pause_ms is not None else 0.0),
        core_bytes=int(row.core_bytes),
        disk_bytes=disk_bytes(core),
        dir=os.path.abspath(snap.path),
        seq=snap.seq,
        exe=row.exe,
        time=snap.time,
        threads_stopped=row.summary.get("threads_stopped"),
        handed_over=plan.handoff_ctl is not None,
        method="libtag",
        reap_ms=None,
    )


def _take_in_place(pid: int, proc, plan: Plan, seen_root: Path, *, timeout: float, tick):
    """Ask the process and wait for the snapshot it writes into its own directory."""
    root = plan.root
    # the process's own directories: its user's (checked to be the root's
    # owner, as libtag requires of it)
    try:
        owner = os.stat(seen_root).st_uid
        owners = (owner,) if owner == _creds(pid)[0] else ()
    except (OSError, ValueError):
        owners = ()
    ns_pid = _ns_pid(pid)  # libtag names its directories with the pid it sees
    before = {d.name for d in snapdir.list_dirs(seen_root, ns_pid, owners=owners)}
    # libtag writes in each on-demand snapshot's info when the oldest request
    # it serves arrived (request_ns, CLOCK_MONOTONIC): ours is the first that
    # started after this moment.  A monotonic clock is only comparable in
    # one time namespace.
    sent_ns = time.monotonic_ns() if _same_namespace(pid, "time") else None
    try:
        plan.send()
    except ProcessLookupError:
        raise InputError(f"no process with pid {pid}") from None
    except PermissionError:
        raise _no_permission(pid, proc.uids().effective) from None

    deadline = time.monotonic() + timeout
    snap = None
    while snap is None:
        fresh = [d for d in snapdir.list_dirs(seen_root, ns_pid, owners=owners)
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
                f"block or ignore {plan.describe}?)")
        time.sleep(snapdir.POLL_S)

    try:
        snapdir.wait_complete(snap, max(deadline - time.monotonic(), 0.0), tick=tick,
                              writer_exited=(snapdir.process_exited if ns_pid == pid
                                             else _child_exited_in_ns(pid)))
    except snapdir.SnapshotTimeout:
        raise snapdir.SnapshotTimeout(
            f"timed out after {timeout:g} s waiting for the core of pid {pid} "
            f"(snapshot dir {snap.path})") from None
    except snapdir.SnapshotFailed as e:
        raise snapdir.SnapshotFailed(
            f"snapshot of pid {pid} failed: {snapdir.read_error(snap.path) or e.message} "
            f"(snapshot dir {snap.path}); the process runs on") from None
    return snap


# ---------------------------------------------------------------- ptrace --

def take_by_ptrace(pid: int, proc, *, dest: str | None, note=lambda msg: None,
                   status=None) -> SnapshotDoc:
    """Snapshot *pid* from outside (forensics/snapshots/ptrace.py): stop its
    threads, make it fork a copy, let it run on, write the copy's core into
    a new snapshot directory of ours (*dest*, else our snapshot directory),
    record it.  Returns the `forensics snapshot --json` document."""

    st = ptrace.preflight(pid)
    try:
        exe = proc.exe() or None
    except (psutil.AccessDenied, psutil.ZombieProcess, psutil.NoSuchProcess):
        exe = None
    try:
        at = ptrace.syscall_address(pid)
    except PermissionError:
        raise InputError(ptrace.why_not_traceable(pid, PermissionError(1, "EPERM"))) from None
    except FileNotFoundError:
        raise InputError(f"no process with pid {pid}") from None
    except OSError as e:
        raise InputError(f"cannot read the code of pid {pid}: {e.strerror}") from None
    root = ensure_private_dir(Path(os.path.abspath(dest)) if dest else default_snapshot_dir())
    seq = 1 + max((d.seq for d in snapdir.list_dirs(root, pid)), default=0)
    snap_path = snapdir.make_dir(root, f"{snapdir.comm_for_dir(pid)}-{pid}-{seq}-on-demand")
    core = snap_path / "core"
    copy = filters = None
    try:
        # From the clone to the copy's death, one try: the copy never
        # outlives this function (and, once settled, not forensics either)
        try:
            frozen, copy, filters = _fork_by_ptrace(pid, at, seccomp=st.get("Seccomp") == "2")
        except ptrace.PtraceError as e:
            raise InputError(f"process {pid} could not be snapshot: {e.strerror} (it exited, "
                             f"or another tracer took it); it runs on") from None
        pause_ns = frozen.released_ns - frozen.started_ns
        threads = sorted(frozen.threads.values(), key=lambda t: (t.tid != pid, t.tid))
        threads = [t for t in threads if t.regs]
        time_ms = int(time.time() * 1000)
        ptrace.close_copy_fds(copy, at, filters)
        marker = {"method": "ptrace", "pid": str(pid), "pause_ns": str(pause_ns),
                  "fork_ns": str(copy.fork_ns), "time_ms": str(time_ms),
                  "threads_stopped": str(len(threads))}
        tick = None
        if status is not None:
            def tick(done: int, want: int) -> None:
                status.update(f"writing the core of pid {pid}: {done >> 20} of {want >> 20} MiB")
        written = corefile.write_core(core, pid=pid, copy_pid=copy.pid, threads=threads,
                                      marker=marker, progress=tick)
    except BaseException:
        if copy is not None:
            ptrace.kill_copy(copy)
            ptrace.reap(pid, copy, at, filters)
        try:
            os.rmdir(snap_path)
        except OSError:
            pass
        raise
    ptrace.kill_copy(copy)
    reap_ns = ptrace.reap(pid, copy, at, filters)
    if reap_ns is None:
        note(f"the copy {copy.ns_pid} of pid {pid} stays a zombie child of it until it exits "
             f"(it could not be collected)")
    info = {"pid": pid, "child": copy.ns_pid, "seq": seq, "reason": "on-demand",
            "tid": copy.injected_tid, "threads_stopped": len(threads), "pause_ns": pause_ns,
            "fork_ns": copy.fork_ns, "time_ms": time_ms, "method": "ptrace",
            "reap_ns": reap_ns if reap_ns is not None else ""}
    text = "".join(f"{k}={v}\n" for k, v in info.items()).encode()
    write_private(snap_path / "info", lambda f: f.write(text), durable=True)
    snap = snapdir.SnapshotDir(snap_path, snapdir.comm_for_dir(pid), pid, seq, "on-demand")
    snap.read_info()
    with catalog.Catalog() as cat:
        cat.add_root(root)
        row = snapdir.record(snap, core, exe=exe, catalog=cat)
    return SnapshotDoc(
        pid=pid,
        core=os.path.abspath(core),
        reason="on-demand",
        pause_ms=pause_ns / 1e6,
        core_bytes=int(written.core_bytes),
        disk_bytes=disk_bytes(core),
        dir=os.path.abspath(snap_path),
        seq=seq,
        exe=row.exe,
        time=time_ms / 1000.0,
        threads_stopped=len(threads),
        handed_over=False,
        method="ptrace",
        reap_ms=reap_ns / 1e6 if reap_ns is not None else None,
    )


def _fork_by_ptrace(pid: int, at: int, *, seccomp: bool):
    """Stop, fork and release *pid*; (frozen, copy, seccomp filters), the
    copy stopped and bound to die with forensics.  Forensics' own
    interrupting signals wait until then (ptrace.deferred_signals): the
    process must never be left with an injected call's registers, nor the
    copy free to run the program's code."""

    with ptrace.deferred_signals():
        try:
            frozen = ptrace.freeze(pid)
        except ptrace.PtraceError as e:
            raise InputError(ptrace.why_not_traceable(pid, e)) from None
        copy = None
        try:
            filters = []
            if seccomp:
                main = next((t for t in frozen.live() if t.tid == pid), frozen.live()[0])
                try:
                    filters = ptrace.seccomp_filters(main.tid)
                except ptrace.PtraceError as e:
                    raise ptrace.Refused(
                        f"process {pid} runs under a seccomp filter that could not be read "
                        f"({e.strerror}): whether it lets fork through is unknown, so nothing "
                        f"was done") from None
            copy = ptrace.fork_copy(frozen, at, filters)
        finally:
            frozen.released_ns = ptrace.release(frozen)
        try:
            ptrace.settle_copy(copy, pid)
        except BaseException:
            ptrace.kill_copy(copy)
            ptrace.reap(pid, copy, at, filters)
            raise
    return frozen, copy, filters
