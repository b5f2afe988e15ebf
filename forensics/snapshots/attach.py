"""Loading libtag into a running process: ``forensics attach PID``.

One thread of the process is stopped by ptrace and made to call
``dlopen(libtag.so, RTLD_NOW)`` and then ``libtag_attach()``
(libtag/src/life/attach.c: every module's GOT and data slots of the malloc
family pointed at libtag's), on its own stack, returning to address 0
(forensics/snapshots/ptrace.py call_function); its cancellation is turned
off around the calls.  Its registers are put back and it is released: the
wait it was in restarts.  The other threads run on throughout; a slot
changes in one store.

The thread must hold no lock the calls need (the allocator's arenas, the
dynamic linker's load lock): it is one asleep in an idle wait - an event
loop's, a sleep, an accept, a read of a pipe, socket or terminal - seen
asleep there in /proc and again once stopped, with no signal pending.

Refused with one line, nothing changed: a process that already runs
libtag, a static binary (no glibc ``dlopen`` to call), a glibc older than
2.34, a process under a seccomp filter (dlopen's system calls cannot all
be checked), one whose files are another mount namespace's where
libtag.so is not the same file, one whose threads are never idle, and
whatever the ptrace snapshot refuses (ptrace.preflight); with libtag loaded
but nothing taken over, a process that allocates with another allocator.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import time
from dataclasses import dataclass

from forensics.answers.documents import AttachDoc
from forensics.errors import InputError
from forensics.reader.live import read_maps
from forensics.snapshots import ptrace
from forensics.snapshots.take import libtag_loaded

RTLD_NOW = 2
PTHREAD_CANCEL_DISABLE = 1
_LIBC = re.compile(r"/libc\.so\.6$")
_TRIES = 50
# The waits a thread may be used from: an event loop's, a sleep, a wait for
# a connection, a signal or a child - not a system call the allocator or
# the dynamic linker makes while holding a lock (mmap, brk, madvise,
# openat, read of a file), and not a futex (it may wait for such a lock).
_IDLE_WAITS = {
    7: "poll", 23: "select", 34: "pause", 35: "nanosleep", 43: "accept", 61: "wait4",
    128: "rt_sigtimedwait", 130: "rt_sigsuspend", 230: "clock_nanosleep", 232: "epoll_wait",
    247: "waitid", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
    441: "epoll_pwait2",
}
# reads that count as such a wait when their descriptor is a pipe, a socket
# or a terminal (a read of a file may be the dynamic linker's)
_IDLE_READS = {0: "read", 19: "readv", 45: "recvfrom", 47: "recvmsg", 299: "recvmmsg"}
# what such a wait holds in rax once interrupted: a restart code, or EINTR
_INTERRUPTED = {-512, -513, -514, -516, -4}
_EOPNOTSUPP = 95


def _symbol(path: str, name: str) -> int | None:
    """st_value of dynamic symbol *name* of the ELF file at *path*."""
    from elftools.common.exceptions import ELFError  # deferred, start-up time: pyelftools
    from elftools.elf.elffile import ELFFile  # deferred, start-up time: pyelftools

    try:
        with open(path, "rb") as f:
            dynsym = ELFFile(f).get_section_by_name(".dynsym")
            if dynsym is None:
                return None
            for sym in dynsym.get_symbol_by_name(name) or ():
                if sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
                    return int(sym["st_value"])
    except (OSError, ELFError):
        return None
    return None


def _module(pid: int, pattern) -> tuple[str, int] | None:
    """(path, load base) of the first mapped file matching *pattern*."""
    maps = [m for m in read_maps(pid) if m.path and pattern(m.path)]
    if not maps:
        return None
    path = maps[0].path
    return path, min(m.start - m.offset for m in maps if m.path == path)


def _idle_wait(pid: int, tid: int) -> int | None:
    """The idle wait *tid* sleeps in (interruptibly: state S): a system
    call of _IDLE_WAITS, or of _IDLE_READS on a pipe (named or not), socket
    or terminal;
    None otherwise."""
    if ptrace.task_state(pid, tid) != "S":
        return None
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            words = f.read().split()
    except OSError:
        return None
    if not words or not words[0].isdigit():
        return None
    nr = int(words[0])
    if nr in _IDLE_WAITS:
        return nr
    if nr in _IDLE_READS and len(words) > 1:
        try:
            fd = f"/proc/{pid}/fd/{int(words[1], 16)}"
            target = os.readlink(fd)
            mode = os.stat(fd).st_mode  # a pipe's, a named FIFO's, a socket's: never opened
        except (OSError, ValueError):
            return None
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or target.startswith(("/dev/pts/", "/dev/tty")):
            return nr
    return None


def _pick_thread(pid: int) -> tuple[int, int] | None:
    """(thread, its wait) asleep in an idle wait, the main thread first."""
    idle = []
    for t in ptrace._tids(pid):
        nr = _idle_wait(pid, t)
        if nr is not None:
            idle.append((t != pid, t, nr))
    return min(idle)[1:] if idle else None


def _read_cstring(pid: int, addr: int, limit: int = 512) -> str:
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.pread(fd, limit, addr)
        finally:
            os.close(fd)
    except OSError:
        return "?"
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def attach(pid: int, lib: str, note=lambda msg: None) -> AttachDoc:
    """Load *lib* (libtag.so) into *pid* and rebind its malloc family.
    Returns the `forensics attach --json` document."""

    st = ptrace.preflight(pid)
    if libtag_loaded(pid):
        raise InputError(f"process {pid} already runs libtag: snapshot it "
                         f"(forensics snapshot {pid})")
    if st.get("Seccomp") == "2":
        raise ptrace.Refused(f"process {pid} runs under a seccomp filter: loading a library "
                             f"makes system calls that cannot all be checked against it, so "
                             f"attach refuses; forensics snapshot {pid} still works")
    libc = _module(pid, lambda p: bool(_LIBC.search(p)))
    if libc is None:
        raise ptrace.Refused(f"process {pid} has no glibc libc.so.6 mapped (a static binary, "
                             f"or another C library): libtag cannot be loaded into it; "
                             f"forensics snapshot {pid} still works")
    libc_path, libc_base = libc
    seen = f"/proc/{pid}/root{libc_path}"
    dlopen_at = _symbol(seen, "dlopen")
    dlerror_at = _symbol(seen, "dlerror")
    if dlopen_at is None or dlerror_at is None:
        raise ptrace.Refused(f"process {pid}'s C library ({libc_path}) exports no dlopen: "
                             f"glibc 2.34 or newer is needed")
    try:
        same = os.path.samefile(f"/proc/{pid}/root{lib}", lib)
    except OSError:
        same = False
    if not same:
        raise ptrace.Refused(f"process {pid} does not see {lib} (another mount namespace: a "
                             f"container); copy it to the same path inside, then attach")
    attach_at = _symbol(lib, "libtag_attach")
    if attach_at is None:
        raise InputError(f"{lib} exports no libtag_attach: reinstall forensics")

    cancel_at = _symbol(seen, "pthread_setcancelstate")
    if cancel_at is None:
        raise ptrace.Refused(f"process {pid}'s C library ({libc_path}) exports no "
                             f"pthread_setcancelstate: glibc 2.34 or newer is needed")
    calls = _Calls(libc_base + dlopen_at, libc_base + dlerror_at, libc_base + cancel_at,
                   attach_at)
    for _ in range(_TRIES):
        picked = _pick_thread(pid)
        if picked is None:
            time.sleep(0.02)
            continue
        done = _attach_through(pid, *picked, lib, calls, note)
        if done is not None:
            return done
    raise ptrace.Refused(f"no thread of process {pid} stayed asleep in an idle wait (epoll, "
                         f"poll, select, accept, a sleep) long enough to be used: attach runs "
                         f"dlopen in such a thread so that it holds no lock; try again when the "
                         f"process is idler")


@dataclass
class _Calls:
    dlopen: int
    dlerror: int
    setcancelstate: int
    attach_rel: int        # libtag_attach's offset in libtag.so


def _attach_through(pid: int, tid: int, wait: int, lib: str, calls: _Calls,
                    note) -> dict | None:
    """Stop *tid*; if it still sleeps in the idle wait *wait*, load libtag through
    it and return the document; None to try another moment.  The whole
    time, forensics' own interrupting signals wait (a thread left in an
    injected call would return to address 0)."""
    with ptrace.deferred_signals():
        t0 = time.monotonic_ns()
        try:
            ptrace.ptrace(ptrace.PTRACE_SEIZE, tid, 0, 0)
        except ptrace.PtraceError as e:
            raise InputError(ptrace.why_not_traceable(pid, e)) from None
        th = ptrace.Thread(tid, attached=True)
        frozen = ptrace.Frozen(pid, {tid: th})
        try:
            ptrace.ptrace(ptrace.PTRACE_INTERRUPT, tid)
            if not ptrace._settle(frozen, th):
                return None
            th.regs = ptrace._getregs(tid)
            orig = struct.unpack_from("<q", th.regs, ptrace.R_ORIG_RAX * 8)[0]
            rax = struct.unpack_from("<q", th.regs, ptrace.R_RAX * 8)[0]
            if orig != wait or rax not in _INTERRUPTED or th.pending:
                return None  # it left its wait: not a safe moment
            try:
                rebound = _load(pid, tid, th, lib, calls, note)
            finally:
                ptrace._setregs(tid, th.regs)
        except (ptrace.PtraceError, ptrace.NotStopping) as e:
            raise InputError(f"attach to process {pid} stopped half-way: {e}; it may have "
                             f"exited") from None
        finally:
            ptrace.release(frozen)
    held_ms = (time.monotonic_ns() - t0) / 1e6
    if rebound == -_EOPNOTSUPP:
        raise ptrace.Refused(f"process {pid} allocates with another allocator than glibc's "
                             f"(jemalloc, tcmalloc, mimalloc, or a second C library in another "
                             f"link namespace): its blocks cannot be told from libtag's; libtag "
                             f"is loaded but takes over nothing")
    if rebound < 0:
        raise InputError(f"libtag is loaded in process {pid} but could not take over its "
                         f"allocations: {os.strerror(-rebound)}")
    return AttachDoc(pid=pid, tid=tid, library=lib, rebound=int(rebound), held_ms=held_ms)


def _load(pid: int, tid: int, th, lib: str, calls: _Calls, note) -> int:
    """In stopped *tid*: cancellation off, dlopen(lib), libtag_attach(),
    cancellation as it was; libtag_attach's result."""
    def slow(seconds: float) -> None:
        note(f"thread {tid} of pid {pid} has been loading libtag for {seconds:.0f} s; "
             f"waiting for it (stopping now would leave it in the call)")

    def call(fn: int, args=(), data=b"") -> tuple[int, int]:
        return ptrace.call_function(tid, th.regs, fn, args, data, held=th, slow=slow)

    # pthread_setcancelstate(DISABLE, &old): a cancellation request must not
    # unwind the thread out of dlopen
    r, old_at = call(calls.setcancelstate, (PTHREAD_CANCEL_DISABLE, -1), bytes(8))
    old_state = struct.unpack("<i", _read(pid, old_at, 4))[0] if r == 0 else None
    try:
        handle, _ = call(calls.dlopen, (-1, RTLD_NOW), os.fsencode(lib) + b"\0")
        if handle == 0:
            msg, _ = call(calls.dlerror)
            why = _read_cstring(pid, msg) if msg else "unknown"
            raise InputError(f"dlopen of libtag failed in process {pid}: {why}")
        mod = _module(pid, lambda p: _same(p, lib))
        if mod is None:
            raise InputError(f"libtag was loaded into process {pid} but is not in its maps")
        rebound, _ = call(mod[1] + calls.attach_rel)
    finally:
        if old_state is not None:
            call(calls.setcancelstate, (old_state, 0))
    return rebound


def _read(pid: int, addr: int, n: int) -> bytes:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, n, addr)
    finally:
        os.close(fd)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
