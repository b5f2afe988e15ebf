"""Talking to libtag inside a running process through its memory.

libtag's control block (tag_abi.h struct libtag_control) says what the
process answers to: the signal libtag takes snapshot requests on (a
real-time signal it claimed because the program left it alone), whether it
still handles LIBTAG_SIGNAL, and the snapshot directory it resolved at start.
It is found through /proc/PID/maps and read through /proc/PID/mem, so a
daemon that rewrote its environment (nginx, PostgreSQL set process titles
over it) is still understood.

A snapshot is *handed over* when the process cannot write where the caller
can read (it dropped to another user, or sees another file system): the
caller writes a request number into control.request_nonce, asks with
sigqueue(request_signal, TAG_SNAPSHOT_REQUEST), and libtag's fork child
writes its core into a pipe whose read end it publishes in its own
control.handoff_fd; the caller takes that descriptor with pidfd_getfd(2) and
copies the core into a snapshot directory of its own.  The process never
holds a descriptor of the caller's, and no file of its user is involved.

Reading and writing another process's memory and taking its descriptor need
ptrace access to it (root, or its own user where Yama's ptrace_scope allows):
without it, `read_control` returns None and the caller falls back to the
process's environment and a directory the process writes itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as _errno
import os
import select
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from forensics.errors import ForensicsError, InputError
from forensics.files import ensure_private_dir, write_private
from forensics.reader import abi
from forensics.reader.live import LiveMemory
from forensics.snapshots.snapdir import comm_for_dir, make_dir, process_exited

_OFF = abi.field_offsets(abi.Control)
_SYS_PIDFD_GETFD = 438  # x86_64
_PAGE = 4096
POLL_S = 0.02


class HandoffFailed(ForensicsError):
    """The process did not hand its snapshot over."""


@dataclass(frozen=True)
class Control:
    """What the control block of a live process says, at one moment."""

    addr: int
    request_signal: int  # 0: the program took it
    user_signal: int  # LIBTAG_SIGNAL while libtag handles it, 0 = off or taken
    start_euid: int
    dir: str  # the snapshot root the process resolved at start; "" = none


# ------------------------------------------------------------- control --

def read_control(pid: int) -> Control | None:
    """The control block of *pid*, or None when its memory cannot be read
    (not ours, ptrace_scope) or it holds none.  Raises AbiVersionError when
    libtag in the process is of another ABI version."""
    try:
        mem = LiveMemory(pid)
    except InputError:
        return None
    with mem:
        try:
            addr, ctl = abi.find_control(mem)
        except abi.AbiVersionError:
            raise
        except ForensicsError:
            return None
    return _control(addr, ctl)


def _control(addr: int, ctl) -> Control:
    d = bytes(ctl.dir).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return Control(addr, int(ctl.request_signal), int(ctl.user_signal), int(ctl.start_euid), d)


# ------------------------------------------------------------- signals --

class _SigVal(ctypes.Union):
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, _SigVal]
_libc.syscall.restype = ctypes.c_long


def sigqueue(pid: int, sig: int, value: int) -> None:
    """sigqueue(2) with an int value; raises OSError."""
    v = _SigVal(sival_int=ctypes.c_int(value).value)
    if _libc.sigqueue(int(pid), int(sig), v) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def pidfd_getfd(pidfd: int, fd: int) -> int:
    """A duplicate of descriptor *fd* of the process behind *pidfd* (close-on-exec)."""
    r = _libc.syscall(_SYS_PIDFD_GETFD, ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(r)


# ------------------------------------------------------------- handoff --

def _u64(fd: int, addr: int) -> int:
    return struct.unpack("<Q", os.pread(fd, 8, addr))[0]


def _copy_core(src: int, path: Path, deadline_s: float, tick: Callable[[], None] | None) -> int:
    """Copy the pipe to a new file at *path* (0600), leaving holes for zero
    pages; returns the bytes copied.  Gives up when nothing arrives for
    *deadline_s* seconds."""
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    zero = bytes(_PAGE)
    total = 0
    pending = b""
    try:
        os.set_blocking(src, False)
        while True:
            ready, _, _ = select.select([src], [], [], deadline_s)
            if not ready:
                raise HandoffFailed(f"the snapshot child sent nothing for {deadline_s:g} s")
            try:
                chunk = os.read(src, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                break
            if tick is not None:
                tick()
            data = pending + chunk
            whole = len(data) - len(data) % _PAGE
            view = memoryview(data)
            i = 0
            while i < whole:
                page = view[i:i + _PAGE]
                if page == zero:
                    os.lseek(out, _PAGE, os.SEEK_CUR)
                else:
                    os.write(out, page)
                i += _PAGE
            pending = bytes(view[whole:])
            total += len(chunk)
        if pending:
            os.write(out, pending)
        os.ftruncate(out, total)
        os.fsync(out)
    except OSError as e:
        os.close(out)
        os.unlink(path)
        if e.errno == _errno.ENOSPC:
            raise InputError(f"no space left on the device of {path}") from None
        raise InputError(f"cannot write {path}: {e.strerror}") from None
    except BaseException:
        os.close(out)
        os.unlink(path)
        raise
    os.close(out)
    return total


def _core_is_whole(path: Path, size: int) -> bool:
    """The ELF header and every segment's data are in the file."""
    with open(path, "rb") as f:
        eh = f.read(64)
        if len(eh) < 64 or eh[:4] != b"\x7fELF":
            return False
        phoff, = struct.unpack_from("<Q", eh, 32)
        phentsize, phnum = struct.unpack_from("<HH", eh, 54)
        f.seek(phoff)
        ph = f.read(phentsize * phnum)
    if len(ph) < phentsize * phnum:
        return False
    end = 0
    for i in range(phnum):
        _type, _flags, off, _va, _pa, filesz = struct.unpack_from("<IIQQQQ", ph, i * phentsize)
        end = max(end, off + filesz)
    return size >= end


def take_handoff(pid: int, ctl: Control, root: Path, *, timeout: float,
                 tick: Callable[[], None] | None = None) -> tuple[Path, dict[str, str]]:
    """Ask *pid* for a snapshot handed over to us; returns (snapshot dir, info).

    The directory is made in *root* (ours), named as libtag names its own
    (<comm>-<pid>-<seq>-on-demand), with the core (0600) and an info file.
    """

    root = ensure_private_dir(root)
    deadline = time.monotonic() + timeout
    try:
        mem = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(f"no process with pid {pid}") from None
    except PermissionError:
        raise InputError(f"no permission to write to the memory of pid {pid} (needed to hand "
                         f"its snapshot over): run forensics as root") from None
    try:
        req = ctl.addr + _OFF["request_nonce"]
        while _u64(mem, req) != 0:  # another caller's request not taken yet
            if time.monotonic() >= deadline:
                raise HandoffFailed(f"another `forensics snapshot` of pid {pid} is waiting for "
                                    f"its core; try again when it is done")
            time.sleep(POLL_S)
        nonce = int.from_bytes(os.urandom(8), "little") | 1
        os.pwrite(mem, struct.pack("<Q", nonce), req)
        try:
            sigqueue(pid, ctl.request_signal, abi.TAG_SNAPSHOT_REQUEST)
        except OSError as e:
            os.pwrite(mem, struct.pack("<Q", 0), req)
            raise InputError(f"cannot signal pid {pid}: {e.strerror}") from None
        while True:
            last = abi.SnapInfo.parse(os.pread(mem, abi.SnapInfo.sizeof(), ctl.addr + _OFF["last"]))
            if last.nonce == nonce:
                break
            if process_exited(pid):
                raise InputError(f"process {pid} exited before it took the snapshot")
            if time.monotonic() >= deadline:
                if _u64(mem, req) == nonce:
                    os.pwrite(mem, struct.pack("<Q", 0), req)
                raise HandoffFailed(
                    f"timed out after {timeout:g} s: pid {pid} did not answer the request on "
                    f"signal {ctl.request_signal} (does it block that signal in every thread?)")
            if tick is not None:
                tick()
            time.sleep(POLL_S)
    finally:
        os.close(mem)

    child = int(last.child)
    try:
        pidfd = os.pidfd_open(child)
    except ProcessLookupError:
        raise HandoffFailed(f"the snapshot child {child} of pid {pid} ended before handing "
                            f"its core over") from None
    try:
        hfd = 0
        try:
            cmem = os.open(f"/proc/{child}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise HandoffFailed(f"cannot read the snapshot child {child} of pid {pid}: "
                                f"{e.strerror}") from None
        try:
            while hfd == 0:
                try:
                    hfd = struct.unpack("<i", os.pread(cmem, 4, ctl.addr + _OFF["handoff_fd"]))[0]
                except OSError:
                    hfd = -_errno.ESRCH
                if hfd == 0:
                    if time.monotonic() >= deadline:
                        raise HandoffFailed(f"timed out after {timeout:g} s waiting for the "
                                            f"snapshot child {child} of pid {pid}")
                    time.sleep(POLL_S / 4)
        finally:
            os.close(cmem)
        if hfd < 0:
            raise HandoffFailed(f"the snapshot child {child} of pid {pid} could not hand its "
                                f"core over: {os.strerror(-hfd)}")
        try:
            src = pidfd_getfd(pidfd, hfd)
        except OSError as e:
            raise HandoffFailed(f"cannot take the core's pipe from the snapshot child {child} "
                                f"of pid {pid}: {e.strerror}") from None
    finally:
        os.close(pidfd)

    snap = make_dir(root, f"{comm_for_dir(pid)}-{pid}-{int(last.seq)}-on-demand")
    core = snap / "core"
    try:
        size = _copy_core(src, core, 30.0, tick)
    except BaseException:
        os.rmdir(snap)
        raise
    finally:
        os.close(src)
    if not _core_is_whole(core, size):
        os.unlink(core)
        os.rmdir(snap)
        raise HandoffFailed(f"the core handed over by pid {pid} is cut short ({size} bytes): "
                            f"its snapshot child failed while writing it")
    info = {
        "pid": str(pid), "child": str(child), "seq": str(int(last.seq)),
        "reason": "on-demand", "tid": str(int(last.tid)),
        "threads_stopped": str(int(last.threads_stopped)),
        "pause_ns": str(int(last.pause_ns)), "fork_ns": str(int(last.fork_ns)),
        "time_ms": str(int(last.time_ms)), "request_ns": str(int(last.request_ns)),
        "handoff": "1",
    }
    text = "".join(f"{k}={v}\n" for k, v in info.items()).encode()
    write_private(snap / "info", lambda f: f.write(text), durable=True)
    return snap, info
