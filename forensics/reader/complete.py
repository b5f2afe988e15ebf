"""Completing a kernel-written snapshot core: every thread's registers in its notes.

A snapshot's core is written by its fork child, a process of one thread.
When libtag writes it itself (LIBTAG_CORE=self), its notes hold an
NT_PRSTATUS for each of the program's threads, from the registers each thread
saved just before the fork.  When the kernel writes it (the child aborts), its
notes describe the child alone - deep in libtag's snapshot code, under a pid
of its own - and gdb finds the program's threads in memory (libthread_db) with
no registers: "Couldn't find general-purpose registers in core file", no bt.

complete_core(path) rewrites such a core's notes as libtag's writer would
have: an NT_PRSTATUS per thread from libtag's saved registers (the thread
that took the snapshot first), the process notes (NT_PRPSINFO with the
program's pid, NT_AUXV, NT_FILE) after the first; the child's own notes
(its registers, FPU state, siginfo) are left out.  The new notes are appended
at the end of the file and the PT_NOTE program header is pointed at them, so
the memory in the core is never moved; a reader that stops half-way (before
the header is rewritten) leaves a core that is as it was, plus unused bytes.

It touches only a regular file owned by us (opened with O_NOFOLLOW: never
through a symlink; its mode, 0600, is kept) that is the very file parsed
(same device and inode, same size), and only a snapshot core (reason
on-demand, anomaly or exit) whose notes lack a thread libtag saved
registers for; anything else - another user's core, a read-only file, a
crash core, a core already complete - is left alone.

Completion is an explicit step, never a side effect of reading:
``forensics.reader.dump.open_core(path, complete=True)`` (what every verb
that opens a core does) parses the core once, finds the control block once,
and hands both to ``complete``; forensics run, snapshot and list call
``complete_core(path)`` when they first see a finished core.  gdb's
commands open the core gdb has open without completing it.
"""

from __future__ import annotations

import os

from forensics._np import np
from construct import ConstructError

from forensics.core.core import Core
from forensics.core.elf import EHDR_SIZE, Elf64_Phdr, PHDR_SIZE, PT_NOTE
from forensics.core.notes import (
    NT_AUXV,
    NT_FILE,
    NT_PRPSINFO,
    NT_PRSTATUS,
    elf_prpsinfo,
    elf_prstatus,
    note_bytes,
    prstatus_bytes,
)
from forensics.errors import ForensicsError
from forensics.files import open_own_file
from forensics.reader import abi
from forensics.reader.memory import CoreMemory

_SNAPSHOT_REASONS = (abi.TAG_REASON_ON_DEMAND, abi.TAG_REASON_ANOMALY, abi.TAG_REASON_EXIT)
_MAX_THREADS = 1 << 16


def _prstatus(tid: int, regs, like) -> bytes:
    return prstatus_bytes(tid, regs, ppid=like.pr_ppid if like is not None else 0,
                          pgrp=like.pr_pgrp if like is not None else 0,
                          sid=like.pr_sid if like is not None else 0)


def _new_notes(core: Core, raw, ctl, records) -> bytes | None:
    """The notes the core should have, or None when it has them already."""
    saved = [(int(r["tid"]), r["regs"]) for r in records
             if int(r["tid"]) and int(r["flags"]) & abi.TAG_THREAD_REGS
             and not int(r["flags"]) & abi.TAG_THREAD_EXITED]
    have = {t.tid for t in core.threads}
    if not saved or all(tid in have for tid, _ in saved):
        return None
    snap_tid = int(ctl.snapshot_tid)
    saved.sort(key=lambda tr: tr[0] != snap_tid)  # the snapshot's thread first
    like = next((elf_prstatus.parse(n.desc) for n in raw
                 if n.type == NT_PRSTATUS and len(n.desc) >= elf_prstatus.sizeof()), None)
    process = []
    for n in raw:
        if n.name != b"CORE":
            continue
        if n.type == NT_PRPSINFO and len(n.desc) >= elf_prpsinfo.sizeof():
            ps = elf_prpsinfo.parse(n.desc)
            ps.pr_pid = int(ctl.pid)
            process.append(note_bytes(b"CORE", NT_PRPSINFO, elf_prpsinfo.build(ps) + n.desc[elf_prpsinfo.sizeof():]))
        elif n.type in (NT_AUXV, NT_FILE):
            process.append(note_bytes(b"CORE", n.type, n.desc))
    out = []
    for i, (tid, regs) in enumerate(saved):
        out.append(note_bytes(b"CORE", NT_PRSTATUS, _prstatus(tid, regs, like)))
        if i == 0:
            out += process
    return b"".join(out)


def complete(core: Core, found: tuple[int, object] | None = None, *, note=None) -> bool:
    """Give the parsed snapshot core every thread's registers (see the module
    docstring); found: the control block (address, parsed), when the caller
    has it.  True when the file was rewritten: the caller reparses core
    (Core.reparse) to see the new notes.  Never raises for a core it cannot
    or need not complete.

    A core of another user's (a server's snapshot read by root) is completed
    when we are root; otherwise, when it needs it, note() is told why not.
    A compressed core is left as it is: what was parsed is its private
    decompressed copy, which goes when the core is closed."""
    if core.compressed is not None:
        return False
    try:
        if found is None:
            found = abi.find_control(CoreMemory(core))
        notes = _notes_to_add(core, found[1])
    except (ForensicsError, OSError, ValueError, ConstructError):
        # ConstructError: a value from libtag's records that no note can
        # hold (a damaged thread record's tid past INT32_MAX, say)
        return False
    if notes is None:
        return False
    opened = open_own_file(core.path, os.O_RDWR)
    if opened is None and os.geteuid() == 0:
        opened = open_own_file(core.path, os.O_RDWR, any_owner=True)
    if opened is None:
        if note is not None:
            _why_not(core, note)
        return False
    fd, st = opened
    try:
        if (st.st_dev, st.st_ino) != core.identity or st.st_size != core.file_size:
            return False  # not the file that was parsed (replaced, or written since)
        _append_notes(fd, core, *notes)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def complete_core(path: str | os.PathLike[str], note=None) -> bool:
    """complete() for a core not opened yet (forensics run, snapshot, list:
    a snapshot they just saw finished)."""
    try:
        with Core(path) as core:
            return complete(core, note=note)
    except (ForensicsError, OSError, ValueError, ConstructError):
        return False


def _why_not(core: Core, note) -> None:
    opened = open_own_file(core.path, os.O_RDONLY, any_owner=True)
    if opened is None:
        return
    fd, st = opened
    os.close(fd)
    if st.st_uid != os.geteuid():
        note(f"{core.path} belongs to uid {st.st_uid}: gdb sees only the thread that took "
             f"the snapshot; run forensics once as its owner (or root) to add every "
             f"thread's registers to it")


def _notes_to_add(core: Core, ctl) -> tuple[bytes, int, dict] | None:
    """(the notes to append, the PT_NOTE header's file offset, that header's
    fields) for a snapshot core that lacks threads; None to leave it alone."""
    ehdr, phdrs = core.ehdr, core.phdrs
    notes_at = [i for i, ph in enumerate(phdrs) if ph.p_type == PT_NOTE]
    if len(notes_at) != 1 or ctl.reason not in _SNAPSHOT_REASONS:
        return None
    count = min(int(ctl.thread_count), int(ctl.thread_capacity), _MAX_THREADS)
    data = core.read(int(ctl.threads), count * abi.THREAD_RECORD_SIZE)
    records = np.frombuffer(data, dtype=abi.THREAD_RECORD_DTYPE)
    notes = _new_notes(core, core.raw_notes, ctl, records)
    if notes is None:
        return None
    phoff = ehdr.e_phoff + notes_at[0] * ehdr.e_phentsize
    if ehdr.e_phentsize != PHDR_SIZE or phoff < EHDR_SIZE:
        return None
    ph = phdrs[notes_at[0]]
    return notes, phoff, {k: v for k, v in ph.items() if not k.startswith("_")}


def _append_notes(fd: int, core: Core, notes: bytes, phoff: int, new_ph: dict) -> None:
    """The notes at the end of the file, then the PT_NOTE header pointed at
    them: a reader stopped half-way leaves the core as it was."""
    size = core.file_size
    start = (size + 7) & ~7
    os.pwrite(fd, b"\0" * (start - size) + notes, size)
    os.fsync(fd)
    new_ph.update(p_offset=start, p_filesz=len(notes), p_memsz=0, p_align=4)
    os.pwrite(fd, Elf64_Phdr.build(new_ph), phoff)
    os.fsync(fd)


__all__ = ["complete", "complete_core"]
