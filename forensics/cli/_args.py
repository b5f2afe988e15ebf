"""What the verbs (and the gdb commands) share in their arguments: the types
(addresses, pids, counts, seconds), the --json flag and the flags that say
where a core's binaries and debug files are."""

from __future__ import annotations

import argparse


def address(text: str) -> int:
    """An address as ``0x...`` hex or decimal."""
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an address: {text!r} (write it as 0x... hex or decimal)"
        ) from None
    if value < 0 or value >= 1 << 64:
        raise argparse.ArgumentTypeError(f"address out of range: {text!r}")
    return value


def _number(text: str, parse, ok, not_a: str, out_of_range: str):
    """parse(text), refused with "<not_a>: 'text'" when it does not parse and
    "<out_of_range>: 'text'" when ok(value) is false."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{not_a}: {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{out_of_range}: {text!r}")
    return value


def pid(text: str) -> int:
    """A process id: a positive decimal integer."""
    return _number(text, int, lambda v: v > 0, "not a process id", "not a process id")


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v > 0, "not a whole number", "must be at least 1")


def non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "not a whole number", "must be 0 or more")


def seconds(text: str) -> float:
    return _number(text, float, lambda v: v > 0, "not a number of seconds", "must be more than 0 seconds")


def json_flag(parser: argparse.ArgumentParser) -> None:
    """--json: one JSON document on stdout (docs/json.md), nothing else there."""
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def symbol_flags(parser: argparse.ArgumentParser) -> None:
    """--debug-dir DIR (repeatable) and --sysroot DIR: where the files that
    name a core's frames are (docs/guide.md, "Which binary names a frame")."""
    parser.add_argument(
        "--debug-dir", metavar="DIR", action="append", default=[], dest="debug_dirs",
        help="also look here for a module's file or debug file by build-id "
             "(DIR/.build-id/xx/rest.debug, DIR/xx/rest.debug, or DIR/<module name>), "
             "before /usr/lib/debug; repeatable")
    parser.add_argument(
        "--sysroot", metavar="DIR",
        help="the process's files are under DIR here (a core from another machine)")


def symbol_options(args: argparse.Namespace):
    """The forensics.reader.symbols.SymbolOptions that args ask for."""
    from forensics.reader.symbols import SymbolOptions  # deferred, start-up time: numpy, via the reader

    return SymbolOptions(tuple(getattr(args, "debug_dirs", None) or ()), getattr(args, "sysroot", None))


def runtime_flags(parser: argparse.ArgumentParser) -> None:
    """--runtime and --runtime-function PATTERN: the C and C++ runtimes' own
    blocks, folded into one line by default (docs/guide.md, "Runtime blocks")."""
    parser.add_argument(
        "--runtime", action="store_true",
        help="list the C and C++ runtimes' own allocation stacks (stdio buffers, libstdc++'s "
             "emergency pool, the loader's TLS) among the others instead of one folded line")
    parser.add_argument(
        "--runtime-function", metavar="PATTERN", action="append", default=[],
        dest="runtime_functions",
        help="also count a stack whose runtime frames include a function matching PATTERN "
             "(shell-style) as the runtime's; repeatable")


def coredump_flag(parser: argparse.ArgumentParser, *, many: bool = False, every: bool = False,
                  group=None) -> None:
    """--coredump MATCH: a core systemd-coredump holds, in place of a CORE
    argument (forensics.snapshots.coredumps; take_coredumps resolves it);
    every: all the cores of MATCH, not only the newest (triage)."""
    if every:
        what = ("every core systemd-coredump holds (`forensics list` shows them) of pid MATCH, "
                "or of the program MATCH (its name or path); a crash whose core "
                "systemd no longer holds is listed as skipped; repeatable, after the CORE_OR_DIR "
                "arguments")
    else:
        what = ("a core systemd-coredump holds (`forensics list` shows them): the newest of "
                "pid MATCH, or of the program MATCH (its name or path)"
                + ("; repeatable, after the CORE arguments" if many else ""))
    (group or parser).add_argument(
        "--coredump", metavar="MATCH", action="append", default=[], dest="coredumps", help=what)


# the core arguments of each verb: (attribute, how many: 1, 2, "+", or
# "every": each MATCH names all its cores, not the newest)
_CORE_ARGS = {"inspect": ("core", 1), "whoowns": ("core", 1), "diff": (("old", "new"), 2),
              "trend": ("cores", "+"), "report": ("cores", "+"), "triage": ("paths", "every")}


def take_coredumps(args: argparse.Namespace) -> None:
    """Put the cores --coredump MATCH names where the verb reads its core
    arguments, and refuse a verb left without its cores."""
    if args.verb not in _CORE_ARGS:
        return
    from forensics.errors import UsageError

    matches = getattr(args, "coredumps", None) or []
    attr, count = _CORE_ARGS[args.verb]
    if count == "every":
        _take_every_coredump(args, attr, matches)
        return
    paths = []
    if matches:
        from forensics.snapshots.coredumps import match

        paths = [match(m).path for m in matches]
    if count == 1:
        if getattr(args, attr) is not None and paths:
            raise UsageError(f"{args.verb}: give a CORE or --coredump MATCH, not both")
        if paths:
            if len(paths) > 1:
                raise UsageError(f"{args.verb}: --coredump takes one MATCH here")
            setattr(args, attr, paths[0])
        elif getattr(args, attr) is None and args.verb == "inspect":
            raise UsageError("inspect: give a CORE or --coredump MATCH")
    elif count == 2:
        given = [getattr(args, a) for a in attr if getattr(args, a) is not None] + paths
        if len(given) != 2:
            raise UsageError(f"diff: give two cores (OLD NEW, or --coredump MATCH for either), "
                             f"not {len(given)}")
        args.old, args.new = given
    else:
        args.cores = list(getattr(args, attr) or []) + paths
        if not args.cores:
            raise UsageError(f"{args.verb}: give at least one CORE or --coredump MATCH")


def _take_every_coredump(args: argparse.Namespace, attr: str, matches: list[str]) -> None:
    """triage: each MATCH's cores, newest first, after the CORE_OR_DIR
    arguments; in args.coredump_skipped, a line for each crash whose core
    systemd no longer holds (once, however many MATCHes name it)."""
    from forensics.errors import UsageError

    given = list(getattr(args, attr) or [])
    if not given and not matches:
        raise UsageError(f"{args.verb}: give at least one CORE_OR_DIR or --coredump MATCH")
    paths: list[str] = []
    gone: dict[tuple, str] = {}
    if matches:
        from forensics.snapshots.coredumps import match_all, no_file

        for m in matches:
            for c in match_all(m):
                if c.path is not None:
                    paths.append(c.path)  # a core named twice is read once (triage.core_files)
                else:
                    gone.setdefault((c.pid, c.time, c.exe), no_file(m, c))
    setattr(args, attr, given + paths)
    args.coredump_skipped = list(gone.values())
