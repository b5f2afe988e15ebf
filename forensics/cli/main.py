"""The ``forensics`` command: argument parsing and the one place errors become exit codes.

Each verb lives in forensics/cli/<verb>.py with a docstring (its --help
text), ``add_arguments(parser)`` and ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import NoReturn, Sequence

from forensics import __version__
from forensics.cli import VERBS, load
from forensics.errors import ForensicsError

PROG = "forensics"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, ``forensics: error: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        hint = f"; see '{self.prog} --help'"
        sys.stderr.write(f"{PROG}: error: {message}{hint}\n")
        sys.exit(2)


def verbose_parent() -> argparse.ArgumentParser:
    """The -v flag every command accepts (the verbs here, the gdb commands):
    a traceback as well as the one line when something fails."""
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
        help="show a traceback when something fails",
    )
    return verbose


def build_parser(verbs: Sequence[str] = VERBS) -> argparse.ArgumentParser:
    """The parser of *verbs* (every one: what --help lists).  main builds
    only the verb it is given: each verb's module imported and its flags
    added cost ~40 ms of start-up for all."""
    # -v is accepted before or after the verb; SUPPRESS keeps the verb's
    # parser from resetting a -v given before it.
    verbose = verbose_parent()
    parser = _Parser(
        prog=PROG,
        description="Who allocated, freed and owns any address in a C/C++ "
                    "process or core dump (with libtag preloaded).",
        parents=[verbose],
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True
    for verb in verbs:
        module = load(verb)
        doc = (module.__doc__ or "").strip()
        summary = doc.splitlines()[0] if doc else ""
        p = sub.add_parser(
            verb, help=summary, description=doc, parents=[verbose],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_main=module.main)
    return parser


def failure(exc: BaseException, *, rerun: str) -> tuple[str, int, bool]:
    """What a command that ended in exc says, and its exit status:
    (one line, status, is it a bug).

    An expected failure (ForensicsError) says its message; an interrupt says
    so (130); anything else is a bug, said as one, with *rerun* - how to see
    its traceback.  The command line and the gdb commands both word their
    failures here; only the prefix differs ("forensics: error: ",
    "tag whoowns: ")."""
    if isinstance(exc, ForensicsError):
        return " ".join(exc.message.split("\n")).strip(), exc.exit_code, False
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", 130, False
    what = " ".join(str(exc).split("\n")).strip()
    return (f"internal error: {type(exc).__name__}: {what} ({rerun} for the traceback and report it)",
            3, True)


def _verb_of(argv: Sequence[str]) -> str | None:
    """The verb argv names (after any -v), or None: no verb, an option
    (--help, --version) or a word that is none."""
    for arg in argv:
        if arg not in ("-v", "--verbose"):
            return arg if arg in VERBS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    verb = _verb_of(argv)
    parser = build_parser((verb,) if verb else VERBS)
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    try:
        from forensics.cli._args import take_coredumps

        take_coredumps(args)  # --coredump MATCH: the core it names, as CORE
        return int(args._main(args) or 0)
    except BrokenPipeError:
        # stdout closed early (| head): not an error worth a message.
        _silence_stdout()
        return 0
    except (Exception, KeyboardInterrupt) as e:
        line, status, bug = failure(e, rerun=f"run '{PROG} -v ...'")
        if verbose and not isinstance(e, KeyboardInterrupt):
            traceback.print_exc()
            if bug:
                return status  # the traceback says it all
        if isinstance(e, KeyboardInterrupt):
            sys.stderr.write(f"{PROG}: {line}\n")
        else:
            sys.stderr.write(f"{PROG}: error: {line}\n")
        return status


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
