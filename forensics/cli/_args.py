"""What the verbs (and the gdb commands) share in their arguments: the types
(addresses, pids, counts, seconds) and the --json flag."""

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


def pid(text: str) -> int:
    """A process id: a positive decimal integer."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


def json_flag(parser: argparse.ArgumentParser) -> None:
    """--json: one JSON document on stdout (docs/json.md), nothing else there."""
    parser.add_argument("--json", action="store_true", help="print one JSON document")
