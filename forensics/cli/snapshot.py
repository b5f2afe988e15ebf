"""Take a core of a running process and wait until it is complete.

    forensics snapshot PID [--children] [--ptrace] [--dir DIR] [--signal SIG] [--timeout S] [--json]

The process pauses for a few milliseconds (a fork) and runs on.  Exit 0, or 2
with the reason: no such process, no permission, a process that cannot be
traced (another tracer, a seccomp filter that forbids fork, stopped), no
trigger, timeout.

A process that does not run libtag (or any, with --ptrace) is forked from
outside by ptrace (forensics/snapshots/ptrace.py): its threads are stopped,
one of them runs a clone system call, all run on; the copy, which never
runs, is read into a core in --dir (default: your snapshot directory).
The core holds every thread's registers and glibc's heap; every verb reads
it.  The rest of this describes a process that runs libtag.

How the process is asked and where its core goes are read from libtag's
control block in the process's memory, not from its environment (daemons
rewrite theirs): the request goes by libtag's own real-time signal, never
by a signal the program installed a handler for; the core goes to the
snapshot directory the process resolved at start (its LIBTAG_DIR, else its
$XDG_STATE_HOME/forensics/snapshots).  When the process cannot write there
(a worker that dropped to another user, a directory of another user), its
core is handed over through a pipe and written to --dir, else to your own
snapshot directory.  When its memory cannot be read (another user's
process, Yama's ptrace_scope), its environment is the fallback and --dir
names its LIBTAG_DIR if that cannot be read either.

A program run by a user-mode emulator (qemu-user) is, to the kernel, the
emulator's process: it is asked by its LIBTAG_SIGNAL (a standard signal,
SIGUSR2 unless set), never by libtag's real-time request signal, which the
emulator renumbers (qemu-user's program gets host signal n as n - 2 and
cannot be sent its two highest); --ptrace is refused for it (ptrace would
fork the emulator, not the program).

--children snapshots PID and every descendant that runs libtag (an nginx
master and its workers, the postmaster and its backends), one core each.
--signal SIG sends SIG instead of libtag's request signal, for a process
known to handle it (LIBTAG_SIGNAL set to it).  Each snapshot is recorded in
the catalog (forensics list).
"""

from __future__ import annotations

import argparse
import signal

from forensics.cli import _args
from forensics.errors import ForensicsError, InputError


def _signal(value: str) -> int:
    v = value.upper()
    if v.isdigit():
        n = int(v)
    else:
        v = v[3:] if v.startswith("SIG") else v
        if v.startswith("RTMIN+") and v[6:].isdigit():
            n = int(signal.SIGRTMIN) + int(v[6:])
        elif v.startswith("RTMAX-") and v[6:].isdigit():
            n = int(signal.SIGRTMAX) - int(v[6:])
        else:
            try:
                n = int(signal.Signals[f"SIG{v}"])
            except KeyError:
                raise argparse.ArgumentTypeError(
                    f"{value!r} is not a signal (USR1, SIGWINCH, RTMIN+3, 34...)") from None
    if not 1 <= n <= int(signal.SIGRTMAX):
        raise argparse.ArgumentTypeError(f"{value!r} is not a signal number")
    if n in (signal.SIGKILL, signal.SIGSTOP):
        raise argparse.ArgumentTypeError(f"{value!r} cannot be handled by any program")
    return n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", metavar="PID", type=_args.pid, help="the process to snapshot")
    parser.add_argument("--children", action="store_true",
                        help="also snapshot every descendant of PID that runs libtag "
                             "(a server's workers), one core each")
    parser.add_argument("--dir", metavar="DIR",
                        help="where a core handed over goes (default: your snapshot "
                             "directory); where to look when neither the process's memory "
                             "nor its environment can be read")
    parser.add_argument("--signal", metavar="SIG", type=_signal, dest="signal",
                        help="send SIG (USR1, WINCH, RTMIN+3, a number) instead of "
                             "libtag's request signal: only for a process whose "
                             "LIBTAG_SIGNAL is SIG")
    parser.add_argument("--timeout", metavar="S", type=_args.seconds, default=30.0,
                        help="seconds to wait for each core (default: 30)")
    parser.add_argument("--ptrace", action="store_true",
                        help="fork the process from outside by ptrace even when it runs "
                             "libtag (a process without libtag always is)")
    _args.json_flag(parser)


def _targets(pid: int, children: bool, note) -> list[int]:
    if not children:
        return [pid]
    import psutil  # deferred, start-up time: psutil

    # deferred, start-up time: psutil, pyelftools, sqlite3
    from forensics.snapshots.take import libtag_loaded, open_process  # deferred, start-up time: psutil, pyelftools

    proc = open_process(pid)
    out = [pid]
    try:
        kids = proc.children(recursive=True)
    except psutil.Error:
        kids = []
    skipped = 0
    for k in kids:
        try:
            if libtag_loaded(k.pid):
                out.append(k.pid)
            else:
                skipped += 1
        except InputError:
            skipped += 1  # exited meanwhile, or not ours
    if skipped:
        note(f"{skipped} descendant(s) of pid {pid} do not run libtag (or exited): skipped")
    return out


def main(args: argparse.Namespace) -> int:
    from forensics.output import text  # deferred, start-up time: rich
    from forensics.output.jsonout import print_json  # deferred, start-up time: the documents
    from forensics.snapshots.take import take  # deferred, start-up time: psutil, pyelftools, sqlite3

    err = text.err_console()

    def note(msg: str) -> None:
        err.print(f"forensics: note: {msg}", markup=False, highlight=False, soft_wrap=True)

    pids = _targets(args.pid, args.children, note)
    docs, failed = [], 0
    for pid in pids:
        kw = dict(timeout=args.timeout, fallback_dir=args.dir, signal_override=args.signal,
                  use_ptrace=args.ptrace, note=note)
        try:
            if err.is_terminal:
                with err.status(f"snapshot of pid {pid}...") as status:
                    docs.append(take(pid, status=status, **kw))
            else:
                docs.append(take(pid, **kw))
        except ForensicsError as e:
            if not args.children:
                raise
            failed += 1
            err.print(f"forensics: error: {e.message}", markup=False, highlight=False,
                      soft_wrap=True)

    if args.json:
        print_json(docs if args.children else docs[0])
        return 2 if failed else 0
    out = text.out_console()
    for doc in docs:
        out.print(doc.core, markup=False, soft_wrap=True)
        how = ", handed over" if doc.handed_over else \
            ", by ptrace" if doc.method == "ptrace" else ""
        out.print(f"  pid {doc.pid} ({doc.exe or 'unknown executable'}), "
                  f"reason {doc.reason}, paused {doc.pause_ms:.2f} ms, "
                  f"core {text.core_size_text(doc.core_bytes, doc.disk_bytes)}{how}",
                  markup=False, soft_wrap=True)
    if len(docs) == 1:
        out.print(f"  next: forensics inspect {docs[0].core}", markup=False, soft_wrap=True)
    elif docs:
        out.print(f"  {len(docs)} snapshots; next: forensics inspect CORE", markup=False,
                  soft_wrap=True)
    return 2 if failed else 0
