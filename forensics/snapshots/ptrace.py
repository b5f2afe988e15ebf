"""A fork-snapshot of any process, by ptrace: no libtag, no restart.

The process pauses for a fork and runs on; a copy of it that never runs the
program's code is read for the core.  Step by step (`freeze`, `fork_copy`,
`release`, `reap`):

1. **Stop every thread.**  Each thread is seized (``PTRACE_SEIZE``, which
   stops nothing and leaves no signal behind, unlike ``PTRACE_ATTACH``'s
   ``SIGSTOP``) and interrupted (``PTRACE_INTERRUPT``); the task list is read
   again until it names no thread that is not stopped (a thread created
   meanwhile by a stopped one is traced from birth: ``PTRACE_O_TRACECLONE``).
   Each thread's registers are read: the general ones (with the fs base),
   the FPU/SSE area and the XSAVE area.
2. **Fork a copy.**  One thread is made to run a ``clone`` system call: its
   registers point it at a ``syscall`` instruction found in the process's own
   code (the vDSO, else any executable mapping) with ``clone``'s arguments,
   and it is single-stepped over it.  The flags are 0: exit signal 0, so the
   program's ``SIGCHLD`` handler never runs and its ``wait()`` never sees the
   copy, as with libtag's own snapshots.  ``orig_rax`` = -1 keeps the
   kernel's system-call restart away from the injected call; the thread's
   own registers are put back afterwards, so a system call the stop
   interrupted restarts as it does under gdb's attach.
3. **Release.**  Every thread is detached; a signal that arrived while it
   was stopped is handed back to it at the detach.  The pause ends here.
4. **The copy** starts traced (``PTRACE_O_TRACECLONE``) and stopped, and is
   never resumed: its memory is the process's at the fork.  Its descriptors
   are closed first (an injected ``close_range``), so it holds no socket or
   pipe of the program open while the core is written.  It is traced with
   ``PTRACE_O_EXITKILL``: if forensics dies, the copy dies too.
5. **Reap.**  Once the core is written the copy is killed; its zombie
   belongs to the process, so one thread is stopped again for a moment to
   run ``wait4(copy, NULL, __WALL | WNOHANG)``.

Everything the program could notice is checked before the first stop: a
process that is another tracer's, stopped, a zombie, or whose seccomp filter
would not let one of the injected system calls through (the filter is read
and run here; reading it needs CAP_SYS_ADMIN) is refused with one line and
left untouched.  Only x86_64.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import signal
import struct
import threading
import time
from dataclasses import dataclass, field

from forensics.errors import InputError
from forensics.reader.live import read_maps
from forensics.snapshots.seccomp import seccomp_allows

# <sys/ptrace.h>, <linux/ptrace.h>
PTRACE_SINGLESTEP = 9
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_SETOPTIONS = 0x4200
PTRACE_GETEVENTMSG = 0x4201
PTRACE_GETREGSET = 0x4204
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_SECCOMP_GET_FILTER = 0x420C

PTRACE_O_TRACECLONE = 0x8
PTRACE_O_EXITKILL = 0x100000
PTRACE_EVENT_CLONE = 3
PTRACE_EVENT_STOP = 128

NT_PRFPREG = 2
NT_X86_XSTATE = 0x202

__WALL = 0x40000000
WNOHANG = 1

# x86_64 system call numbers
SYS_clone = 56
SYS_wait4 = 61
SYS_close_range = 436

# struct user_regs_struct: 27 longs; the indexes used here
_NREGS = 27
R_RAX, R_RCX, R_RDX, R_RSI, R_RDI, R_ORIG_RAX, R_RIP = 10, 11, 12, 13, 14, 15, 16
R_R10, R_R8, R_R9 = 7, 9, 8
R_RSP = 19
PTRACE_CONT = 7
_FPREGS_SIZE = 512
_XSTATE_MAX = 1 << 14

_libc = ctypes.CDLL(None, use_errno=True)
_ptrace = _libc.ptrace
_ptrace.restype = ctypes.c_long
_ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)


class _Iovec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


class PtraceError(OSError):
    pass


def ptrace(req: int, tid: int, addr: int = 0, data=0) -> int:
    r = _ptrace(req, tid, addr, data)
    if r == -1:
        e = ctypes.get_errno()
        if e:
            raise PtraceError(e, os.strerror(e))
    return r


class Refused(InputError):
    """The process cannot be snapshot by ptrace; nothing of it was changed."""


class Gone(InputError):
    """The process exited while it was being snapshot."""


# ------------------------------------------------------------ the threads --

@dataclass
class Thread:
    tid: int
    regs: bytes = b""          # struct user_regs_struct
    fpregs: bytes = b""        # struct user_fpregs_struct (NT_PRFPREG)
    xstate: bytes = b""        # the XSAVE area (NT_X86_XSTATE), b"" when not given
    pending: int = 0           # a signal to hand back at the detach
    attached: bool = False     # traced by us
    stopped: bool = False      # its first stop after the interrupt was seen

    def reg(self, i: int) -> int:
        return struct.unpack_from("<Q", self.regs, i * 8)[0]


def _getregs(tid: int) -> bytes:
    buf = ctypes.create_string_buffer(_NREGS * 8)
    ptrace(PTRACE_GETREGS, tid, 0, ctypes.addressof(buf))
    return buf.raw


def _setregs(tid: int, regs: bytes) -> None:
    buf = ctypes.create_string_buffer(regs, len(regs))
    ptrace(PTRACE_SETREGS, tid, 0, ctypes.addressof(buf))


def _getregset(tid: int, nt: int, size: int) -> bytes:
    buf = ctypes.create_string_buffer(size)
    iov = _Iovec(ctypes.addressof(buf), size)
    try:
        ptrace(PTRACE_GETREGSET, tid, nt, ctypes.addressof(iov))
    except PtraceError:
        return b""
    return buf.raw[:iov.len]


def _tids(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except FileNotFoundError:
        raise Gone(f"no process with pid {pid}") from None


STOP_TIMEOUT_S = 3.0  # a thread that does not stop in this time is in an uninterruptible wait


class NotStopping(InputError):
    """A thread did not reach its stop in time (an uninterruptible wait)."""


def _wait(tid: int, timeout: float | None = STOP_TIMEOUT_S) -> int:
    """The next status of *tid* (a tracee of ours); -1 when it is gone.
    Raises NotStopping after *timeout* seconds (None: wait for ever).
    Polls: a blocking wait cannot be given a deadline here (forensics has
    other threads, a timer's signal may go to one of them)."""
    if timeout is None:
        try:
            return os.waitpid(tid, __WALL)[1]
        except ChildProcessError:
            return -1
    deadline = time.monotonic() + timeout
    spins = 0
    while True:
        try:
            got, status = os.waitpid(tid, __WALL | WNOHANG)
        except ChildProcessError:
            return -1
        if got:
            return status
        spins += 1
        if spins < 2000:
            os.sched_yield()
        elif time.monotonic() > deadline:
            raise NotStopping(tid)
        else:
            time.sleep(0.0005)


def _exited(status: int) -> bool:
    return status == -1 or os.WIFEXITED(status) or os.WIFSIGNALED(status)


@dataclass
class Frozen:
    """A process whose every thread is stopped under our ptrace."""
    pid: int
    threads: dict[int, Thread] = field(default_factory=dict)
    started_ns: int = 0        # before the first thread was seized (monotonic)
    released_ns: int = 0       # when the last thread was detached

    def live(self) -> list[Thread]:
        return [t for t in self.threads.values() if t.attached]


def _settle(frozen: Frozen, th: Thread) -> bool:
    """Wait for *th*'s first stop after the interrupt.  False if it exited."""
    while True:
        status = _wait(th.tid)
        if _exited(status):
            th.attached = False
            return False
        if not os.WIFSTOPPED(status):
            continue
        event = status >> 16
        sig = os.WSTOPSIG(status)
        if event == PTRACE_EVENT_CLONE:
            # it was creating a thread, and is stopped inside clone: the new
            # thread is traced from birth (it stops by itself); this one
            # must finish its clone before it may be used, so it runs on and
            # is interrupted again (the event stop took the first interrupt)
            new = ctypes.c_ulong()
            ptrace(PTRACE_GETEVENTMSG, th.tid, 0, ctypes.addressof(new))
            if new.value not in frozen.threads:
                frozen.threads[new.value] = Thread(int(new.value), attached=True)
            ptrace(PTRACE_CONT, th.tid, 0, 0)
            ptrace(PTRACE_INTERRUPT, th.tid)
            continue
        if event == PTRACE_EVENT_STOP:
            if sig not in (signal.SIGTRAP, 0):
                # a group-stop began (SIGSTOP, SIGTSTP...) as we stopped it
                th.pending = 0
            return True
        if event == 0:
            th.pending = sig  # a signal-delivery-stop: hand it back at the detach
            return True
        return True


def freeze(pid: int) -> Frozen:
    """Seize and stop every thread of *pid*, and read their registers."""
    frozen = Frozen(pid)
    frozen.started_ns = time.monotonic_ns()
    try:
        while True:
            fresh = [t for t in _tids(pid) if t not in frozen.threads]
            unsettled = [t for t in frozen.threads.values() if t.attached and not t.stopped]
            if not fresh and not unsettled:
                break
            for tid in fresh:
                th = Thread(tid)
                try:
                    ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACECLONE)
                except PtraceError as e:
                    if e.errno == _errno.ESRCH:
                        continue  # the thread exited
                    raise
                th.attached = True
                frozen.threads[tid] = th
                try:
                    ptrace(PTRACE_INTERRUPT, tid)
                except PtraceError as e:
                    if e.errno != _errno.ESRCH:
                        raise
            # a thread made by one that was stopping is traced from birth:
            # _settle adds it, and the next round waits for its stop
            for th in list(frozen.threads.values()):
                if th.attached and not th.stopped:
                    try:
                        th.stopped = _settle(frozen, th)
                    except NotStopping:
                        raise Refused(f"thread {th.tid} of process {pid} did not stop within "
                                      f"{STOP_TIMEOUT_S:g} s ({_task_state(pid, th.tid)}): it is "
                                      f"in an uninterruptible wait (disk or network I/O, a "
                                      f"vfork); every thread was released, try again") from None
        for th in frozen.live():
            th.regs = _getregs(th.tid)
            th.fpregs = _getregset(th.tid, NT_PRFPREG, _FPREGS_SIZE)
            th.xstate = _getregset(th.tid, NT_X86_XSTATE, _XSTATE_MAX)
    except BaseException:
        release(frozen)
        raise
    if not frozen.live():
        raise Gone(f"process {pid} exited while it was being stopped")
    return frozen


def release(frozen: Frozen) -> int:
    """Detach every thread (handing back the signals they got meanwhile);
    returns when the last one runs again (monotonic ns)."""
    for th in frozen.threads.values():
        if th.attached:
            try:
                ptrace(PTRACE_DETACH, th.tid, 0, th.pending)
            except PtraceError as e:
                # ESRCH: gone, or seized but not stopped yet (PTRACE_DETACH
                # needs a stop): wait for its stop, then detach
                if e.errno == _errno.ESRCH and os.path.exists(f"/proc/{frozen.pid}/task/{th.tid}"):
                    try:
                        if not _exited(_wait(th.tid, 1.0)):
                            ptrace(PTRACE_DETACH, th.tid, 0, th.pending)
                    except (NotStopping, PtraceError):
                        pass
            th.attached = False
    return time.monotonic_ns()


def task_state(pid: int, tid: int) -> str | None:
    """The state letter of thread *tid* of *pid* (R, S, D, T, t, Z...), None
    when it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _task_state(pid: int, tid: int) -> str:
    """"state D, in io_schedule" from /proc, for a message."""
    state = task_state(pid, tid)
    try:
        with open(f"/proc/{pid}/task/{tid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        wchan = ""
    if state is None:
        return "state unknown"
    return f"state {state}" + (f", in {wchan}" if wchan and wchan != "0" else "")


# ------------------------------------------------------------ injection --

def _step_syscall(tid: int, regs: bytes, nr: int, args: tuple[int, ...], at: int,
                  on_clone=None) -> int:
    """Run system call *nr* with *args* in stopped thread *tid* (whose
    registers are *regs*) through the ``syscall`` at *at*; returns its
    result (a negative errno on failure).  The caller restores the
    thread's registers."""
    r = list(struct.unpack(f"<{_NREGS}Q", regs))
    r[R_RAX] = nr
    r[R_ORIG_RAX] = (1 << 64) - 1
    r[R_RIP] = at
    full = tuple(args) + (0,) * (6 - len(args))  # no stale register as an argument
    for i, v in zip((R_RDI, R_RSI, R_RDX, R_R10, R_R8, R_R9), full):
        r[i] = v & ((1 << 64) - 1)
    _setregs(tid, struct.pack(f"<{_NREGS}Q", *r))
    pending = 0
    while True:
        ptrace(PTRACE_SINGLESTEP, tid, 0, pending)
        pending = 0
        status = _wait(tid, None)
        if _exited(status):
            raise Gone(f"thread {tid} exited during an injected system call")
        event = status >> 16
        sig = os.WSTOPSIG(status)
        if event == PTRACE_EVENT_CLONE:
            new = ctypes.c_ulong()
            ptrace(PTRACE_GETEVENTMSG, tid, 0, ctypes.addressof(new))
            if on_clone is not None:
                on_clone(int(new.value))
            continue
        if event == PTRACE_EVENT_STOP:
            continue  # the interrupt still pending from freeze(): step again
        if event == 0 and sig == signal.SIGTRAP:
            now = _getregs(tid)
            rip = struct.unpack_from("<Q", now, R_RIP * 8)[0]
            if rip == at + 2:
                v = struct.unpack_from("<q", now, R_RAX * 8)[0]
                return v
            continue
        if event == 0:
            raise _Interrupted(sig)
        continue


class _Interrupted(Exception):
    """A signal arrived for the thread in the middle of the injected call."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


def inject(tid: int, regs: bytes, nr: int, args: tuple[int, ...], at: int, on_clone=None) -> int:
    """_step_syscall, with the thread's registers put back after it; a signal
    that interrupted the single step is remembered by the caller (raised as
    _Interrupted after the registers are back)."""
    try:
        return _step_syscall(tid, regs, nr, args, at, on_clone)
    finally:
        try:
            _setregs(tid, regs)
        except PtraceError:
            pass


class CallFailed(InputError):
    """An injected function call did not return as a call returns."""


def call_function(tid: int, regs: bytes, fn: int, args: tuple[int, ...] = (),
                  data: bytes = b"", *, held: Thread | None = None,
                  slow=None) -> tuple[int, int]:
    """Call fn(*args) in stopped thread *tid* (whose registers are *regs*),
    on its own stack below the red zone, with *data* copied there first
    (an argument -1 stands for data's address).  The call returns to
    address 0: the fault there ends it.  Returns (rax, data's address).
    The caller restores the registers.

    The call is waited for however long it takes: a thread left to run
    untraced would return to address 0.  slow(seconds) is called once when
    it takes over 10 s.  A signal the thread gets meanwhile is held for
    the detach (held.pending) when it is the first; a second one is
    delivered then and there (the program's handler runs on top of the
    call, as it would during any call)."""
    r = list(struct.unpack(f"<{_NREGS}Q", regs))
    sp = (r[R_RSP] - 4096) & ~15
    data_at = 0
    if data:
        sp -= -(-len(data) // 16) * 16
        data_at = sp
    sp -= 8  # the return address: at the callee's entry rsp % 16 == 8
    fd = os.open(f"/proc/{tid}/mem", os.O_RDWR | os.O_CLOEXEC)
    try:
        if data:
            os.pwrite(fd, data, data_at)
        os.pwrite(fd, b"\0" * 8, sp)
    finally:
        os.close(fd)
    r[R_RSP] = sp
    r[R_RIP] = fn
    r[R_RAX] = 0
    r[R_ORIG_RAX] = (1 << 64) - 1
    for i, v in zip((R_RDI, R_RSI, R_RDX, R_RCX, R_R8, R_R9), args):
        r[i] = (data_at if v == -1 else v) & ((1 << 64) - 1)
    _setregs(tid, struct.pack(f"<{_NREGS}Q", *r))
    started = time.monotonic()
    told = False
    deliver = 0
    while True:
        ptrace(PTRACE_CONT, tid, 0, deliver)
        deliver = 0
        while True:
            try:
                status = _wait(tid, 1.0)
                break
            except NotStopping:
                if not told and slow is not None and time.monotonic() - started > 10:
                    told = True
                    slow(time.monotonic() - started)
        if _exited(status):
            raise Gone(f"the process of thread {tid} ended during the injected call")
        event = status >> 16
        sig = os.WSTOPSIG(status)
        if event:
            continue  # an event stop (the interrupt still pending): go on
        now = _getregs(tid)
        rip = struct.unpack_from("<Q", now, R_RIP * 8)[0]
        if sig == signal.SIGSEGV and rip == 0:
            return struct.unpack_from("<q", now, R_RAX * 8)[0], data_at
        if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
            raise CallFailed(f"the call injected into thread {tid} faulted ({signal.Signals(sig).name} "
                             f"at {rip:#x})")
        if held is not None and held.pending == 0:
            held.pending = sig
        else:
            deliver = sig


def syscall_address(pid: int) -> int:
    """The address of a ``syscall`` instruction (0f 05) in an executable
    mapping of *pid*: the vDSO first, else its other code.  Any two such
    bytes do: the CPU decodes from where it is pointed."""

    maps = read_maps(pid)
    # code the process cannot change under us: not writable (a JIT's is)
    order = sorted((m for m in maps if m.perms[2:3] == "x" and m.readable and not m.writable),
                   key=lambda m: m.path != "[vdso]")
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for m in order:
            lo = m.start
            while lo < m.end:
                n = min(1 << 20, m.end - lo)
                try:
                    data = os.pread(fd, n, lo)
                except OSError:
                    break
                i = data.find(b"\x0f\x05")
                if i >= 0:
                    return lo + i
                lo += n - 1 if n > 1 else n
    finally:
        os.close(fd)
    raise Refused(f"process {pid} has no readable code holding a syscall instruction; "
                  f"nothing was changed")


# -------------------------------------------------------------- seccomp --

def seccomp_filters(tid: int) -> list[list[tuple[int, int, int, int]]]:
    """The seccomp filters of stopped tracee *tid*, newest first, each a list
    of (code, jt, jf, k).  Needs CAP_SYS_ADMIN."""
    out = []
    i = 0
    while True:
        try:
            n = ptrace(PTRACE_SECCOMP_GET_FILTER, tid, i, 0)
        except PtraceError as e:
            if e.errno == _errno.ENOENT:
                break
            raise
        buf = ctypes.create_string_buffer(n * 8)
        ptrace(PTRACE_SECCOMP_GET_FILTER, tid, i, ctypes.addressof(buf))
        out.append([struct.unpack_from("<HBBI", buf.raw, j * 8) for j in range(n)])
        i += 1
    return out


# ---------------------------------------------------------- preflight --

def read_status(path: str) -> dict[str, str]:
    """A /proc status file (a process's or a thread's) as {key: value}; {}
    when it cannot be read."""
    out = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def status_fields(pid: int) -> dict[str, str]:
    """/proc/PID/status; Gone when there is no such process."""
    out = read_status(f"/proc/{pid}/status")
    if not out:
        raise Gone(f"no process with pid {pid}")
    return out


def _comm_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"


def preflight(pid: int) -> dict[str, str]:
    """Refuse, with one line and before anything is stopped, a process that
    ptrace cannot snapshot without changing it."""
    st = status_fields(pid)
    state = st.get("State", "?")[:1]
    if state == "Z" or state == "X":
        raise Refused(f"process {pid} has exited (it is a zombie): there is nothing to snapshot")
    tracer = int(st.get("TracerPid", "0") or 0)
    if tracer:
        raise Refused(f"process {pid} is already traced by pid {tracer} ({_comm_of(tracer)}): "
                      f"a process has one tracer at a time; detach it (in gdb: detach) and "
                      f"try again")
    if state in ("T", "t"):
        raise Refused(f"process {pid} is stopped (state {st.get('State')}): resuming it to "
                      f"fork would change it; continue it (kill -CONT {pid}) and try again")
    mode = st.get("Seccomp", "0")
    if mode == "1":
        raise Refused(f"process {pid} runs in seccomp strict mode, which forbids fork: it "
                      f"cannot be snapshot without killing it")
    if mode == "2" and not _has_cap(21):  # CAP_SYS_ADMIN
        raise Refused(f"process {pid} runs under a seccomp filter: only CAP_SYS_ADMIN (root) "
                      f"may read it to tell whether it lets fork through; run forensics as "
                      f"root, or use gcore (which stops it for the whole dump)")
    return st


def _has_cap(bit: int) -> bool:
    st = status_fields(os.getpid())
    try:
        return bool(int(st.get("CapEff", "0"), 16) >> bit & 1)
    except ValueError:
        return False


def _in_child_userns() -> bool:
    """Whether this process runs in a user namespace other than the
    initial one (whose uid map is the identity over every uid)."""
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split()[:3] != ["0", "0", "4294967295"]
    except OSError:
        return False


def why_not_traceable(pid: int, err: OSError) -> str:
    """One line for a PTRACE_SEIZE that the kernel refused."""
    if err.errno == _errno.ESRCH:
        return f"no process with pid {pid}"
    if err.errno != _errno.EPERM:
        return f"cannot trace pid {pid}: {err.strerror}"
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = None
    try:
        same_userns = os.stat("/proc/self/ns/user").st_ino == os.stat(f"/proc/{pid}/ns/user").st_ino
    except OSError:  # its namespace is hidden from us: ours is not the first one
        same_userns = not _in_child_userns()
    st = {}
    try:
        st = status_fields(pid)
    except InputError:
        pass
    uid = st.get("Uid", "").split()[1:2]
    me = os.geteuid()
    if uid and int(uid[0]) != me and me != 0:
        return (f"no permission to trace pid {pid}: it runs as uid {uid[0]} and you are uid "
                f"{me}; run forensics as that user or as root")
    if uid and int(uid[0]) != me and not _has_cap(19):  # CAP_SYS_PTRACE
        return (f"no permission to trace pid {pid}: it runs as uid {uid[0]} and you are root "
                f"without CAP_SYS_PTRACE (a container's or a capability bounding set's rule); "
                f"run forensics as uid {uid[0]}, or with CAP_SYS_PTRACE")
    if scope in ("1", "2", "3"):
        what = {"1": "only a process's ancestors may trace it",
                "2": "only CAP_SYS_PTRACE may trace",
                "3": "no process may be traced"}[scope]
        fix = ("run forensics as root (CAP_SYS_PTRACE), or allow it with "
               "`sysctl kernel.yama.ptrace_scope=0`" if scope != "3" else
               "this is fixed until the next boot")
        return f"no permission to trace pid {pid}: Yama's ptrace_scope is {scope} ({what}); {fix}"
    if not same_userns:
        return (f"no permission to trace pid {pid}: it runs in another user namespace; run "
                f"forensics inside its namespace (nsenter -t {pid} -U -m -p) or from the one "
                f"that owns it")
    return (f"no permission to trace pid {pid} (the kernel refused PTRACE_SEIZE: it may be "
            f"setuid/undumpable, or you lack CAP_SYS_PTRACE); run forensics as root")


# ----------------------------------------------------------- the fork --

@dataclass
class Copy:
    """The forked copy of a frozen process, and what the fork cost."""
    pid: int               # the copy's pid as we see it (the clone event's)
    ns_pid: int            # ... as the process sees it (clone's result: its pid namespace)
    injected_tid: int      # the thread that ran the clone
    fork_ns: int           # the clone system call, from entering it to its return
    closed_fds: bool       # its descriptors were closed


def fork_copy(frozen: Frozen, at: int, filters) -> Copy:
    """Make stopped *frozen* fork a copy of itself (clone with flags 0) and
    return it, traced from birth.  The caller releases the process, then
    waits for the copy's stop (settle_copy), and kills it in every case."""
    live = frozen.live()
    # a thread whose stop was a signal's: its signal is handed back at the
    # detach, and a second one during the clone would take its place
    main = min(live, key=lambda t: (t.pending != 0, t.tid != frozen.pid, t.tid))
    flags = 0  # exit signal 0: no SIGCHLD, invisible to wait() without __WALL
    if filters and not seccomp_allows(filters, SYS_clone, (flags, 0, 0, 0, 0), at + 2):
        raise Refused(f"process {frozen.pid}'s seccomp filter does not let clone through: "
                      f"a fork would fail or kill it, so nothing was done")
    born: list[int] = []
    t0 = time.monotonic_ns()
    try:
        r = inject(main.tid, main.regs, SYS_clone, (flags, 0, 0, 0, 0), at, born.append)
    except _Interrupted as e:
        if main.pending == 0:
            main.pending = e.sig
        r = None
    fork_ns = time.monotonic_ns() - t0
    if r is None or r < 0 or not born:
        for c in born:
            _kill_copy(c)
        why = os.strerror(-r) if r is not None and r < 0 else "a signal interrupted it"
        raise Refused(f"process {frozen.pid} could not fork: {why}; it runs on unchanged")
    return Copy(born[0], int(r), main.tid, fork_ns, False)


def settle_copy(copy: Copy, pid: int) -> None:
    """Wait for the copy's first stop (after the process runs again: the
    pause does not wait for it) and have it killed if we die."""
    status = _wait(copy.pid)
    if _exited(status):
        raise Gone(f"the copy of process {pid} died before it could be read")
    try:
        ptrace(PTRACE_SETOPTIONS, copy.pid, 0, PTRACE_O_EXITKILL)
    except PtraceError:
        pass


def close_copy_fds(copy: Copy, at: int, filters) -> None:
    """Close every descriptor of the copy (it holds the program's sockets
    and pipes open otherwise); best effort."""
    if filters and not seccomp_allows(filters, SYS_close_range, (0, 0xFFFFFFFF, 0), at + 2):
        return
    regs = _getregs(copy.pid)
    try:
        r = inject(copy.pid, regs, SYS_close_range, (0, 0xFFFFFFFF, 0), at)
    except (_Interrupted, PtraceError):
        return
    copy.closed_fds = r == 0


def _kill_copy(child: int) -> None:
    try:
        os.kill(child, signal.SIGKILL)
    except ProcessLookupError:
        return
    while not _exited(_wait(child, None)):
        pass


def kill_copy(copy: Copy) -> None:
    _kill_copy(copy.pid)


def reap(pid: int, copy: Copy, at: int, filters) -> int | None:
    """Collect the killed copy's zombie in *pid* (it is *pid*'s child): stop
    one thread for a moment to run wait4 there.  Returns the nanoseconds
    that thread was stopped, None when it could not be done."""
    wait_args = (copy.ns_pid, 0, __WALL | WNOHANG, 0)
    if filters and not seccomp_allows(filters, SYS_wait4, wait_args, at + 2):
        return None
    try:
        tids = _tids(pid)
    except Gone:
        return None
    tid = copy.injected_tid if copy.injected_tid in tids else (tids[0] if tids else None)
    if tid is None:
        return None
    with deferred_signals():
        t0 = time.monotonic_ns()
        try:
            ptrace(PTRACE_SEIZE, tid, 0, 0)
        except PtraceError:
            return None
        th = Thread(tid, attached=True)
        frozen = Frozen(pid, {tid: th})
        try:
            ptrace(PTRACE_INTERRUPT, tid)
            if not _settle(frozen, th):
                return None
            th.regs = _getregs(tid)
            try:
                inject(tid, th.regs, SYS_wait4, wait_args, at)
            except _Interrupted as e:
                if th.pending == 0:
                    th.pending = e.sig
        except (PtraceError, NotStopping, Gone):
            return None
        finally:
            release(frozen)
        return time.monotonic_ns() - t0


_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP)


class deferred_signals:
    """While a process is stopped with injected registers, or a copy of it
    is not yet bound to die with us, forensics must not be interrupted:
    the signals that would stop or kill it (Ctrl-C, SIGTERM, SIGHUP,
    SIGQUIT, SIGTSTP) are recorded, not acted on, and raised again at the
    end.  By handlers, not a signal mask: forensics has other threads
    (numpy's, rich's) that a process-directed signal would go to.  Main
    thread only (where the command line runs); elsewhere it does nothing."""

    def __enter__(self):
        self.got: list[int] = []
        self.old = {}
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in _DEFERRED:
            try:
                self.old[sig] = signal.signal(sig, lambda s, f: self.got.append(s))
            except (OSError, ValueError):
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(self.got):
            signal.raise_signal(sig)
