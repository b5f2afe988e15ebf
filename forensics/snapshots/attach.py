"""Loading libtag into a running process: ``forensics attach PID``.

One thread of the process - one waiting in a system call, so that it holds
no lock of the allocator's or the dynamic linker's - is stopped by ptrace
and made to call ``dlopen(libtag.so, RTLD_NOW)`` and then
``libtag_attach()`` (libtag/src/attach.c: every module's GOT entries of the
malloc family pointed at libtag's), on its own stack, returning to address
0 (forensics/snapshots/ptrace.py call_function).  Its registers are put back
and it is released: the system call it was in restarts.  The other threads
run on throughout; a GOT entry changes in one store.

Refused with one line, nothing changed: a process that already runs
libtag, a static binary (no glibc ``dlopen`` to call), a glibc older than
2.34 (``dlopen`` in libdl), a process under a seccomp filter (dlopen's
system calls cannot all be checked), one whose files are another mount
namespace's where libtag.so is not the same file, and whatever the ptrace
snapshot refuses (ptrace.preflight).
"""

from __future__ import annotations

import os
import re
import struct
import time

from forensics.errors import InputError
from forensics.reader.live import read_maps
from forensics.snapshots import ptrace

RTLD_NOW = 2
SYS_futex = 202
_LIBC = re.compile(r"/libc\.so\.6$")
_TRIES = 50


def _symbol(path: str, name: str) -> int | None:
    """st_value of dynamic symbol *name* of the ELF file at *path*."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

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


def _in_syscall(pid: int, tid: int) -> int | None:
    """The system call *tid* waits in (/proc/PID/task/TID/syscall), or None."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            first = f.read().split()[:1]
    except OSError:
        return None
    if not first or not first[0].lstrip("-").isdigit():
        return None
    nr = int(first[0])
    return nr if nr >= 0 else None


def _pick_thread(pid: int) -> int | None:
    """A thread waiting in a system call other than a futex (a thread
    waiting on a futex may be waiting for a lock the call would need)."""
    tids = ptrace._tids(pid)
    waiting = [(t != pid, t) for t in tids
               if (nr := _in_syscall(pid, t)) is not None and nr != SYS_futex]
    return min(waiting)[1] if waiting else None


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


def attach(pid: int, lib: str) -> dict:
    """Load *lib* (libtag.so) into *pid* and rebind its malloc family.
    Returns the `forensics attach --json` document."""
    from forensics.snapshots.take import libtag_loaded

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

    for _ in range(_TRIES):
        tid = _pick_thread(pid)
        if tid is None:
            time.sleep(0.02)
            continue
        done = _attach_through(pid, tid, lib, libc_base + dlopen_at, libc_base + dlerror_at,
                               attach_at)
        if done is not None:
            return done
    raise ptrace.Refused(f"no thread of process {pid} waited in a system call (other than a "
                         f"futex) long enough to be used: attach runs dlopen in such a thread "
                         f"so that it holds no lock; try again when the process is idler")


def _attach_through(pid: int, tid: int, lib: str, dlopen_at: int, dlerror_at: int,
                    attach_rel: int) -> dict | None:
    """Stop *tid*; if it still waits in a system call, load libtag through
    it and return the document; None to try another moment."""
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
        if orig < 0 or orig == SYS_futex:
            return None  # it left its system call: not a safe moment
        try:
            handle, _ = ptrace.call_function(tid, th.regs, dlopen_at, (-1, RTLD_NOW),
                                             os.fsencode(lib) + b"\0")
            if handle == 0:
                msg, _ = ptrace.call_function(tid, th.regs, dlerror_at)
                why = _read_cstring(pid, msg) if msg else "unknown"
                raise InputError(f"dlopen of libtag failed in process {pid}: {why}")
            mod = _module(pid, lambda p: os.path.exists(p) and _same(p, lib))
            if mod is None:
                raise InputError(f"libtag was loaded into process {pid} but is not in its maps")
            rebound, _ = ptrace.call_function(tid, th.regs, mod[1] + attach_rel)
        finally:
            ptrace._setregs(tid, th.regs)
    finally:
        ptrace.release(frozen)
    held_ms = (time.monotonic_ns() - t0) / 1e6
    if rebound < 0:
        raise InputError(f"libtag is loaded in process {pid} but could not take over its "
                         f"allocations: {os.strerror(-rebound)}")
    return {"pid": pid, "tid": tid, "library": lib, "rebound": int(rebound),
            "held_ms": held_ms}


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
