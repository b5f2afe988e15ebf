"""The errors forensics raises on purpose.

Library code raises these; only forensics.cli.main turns them into a one-line
``forensics: error: ...`` on stderr and the error's ``exit_code``.  The message
says what is wrong and, where there is one, what to do about it.
"""

from __future__ import annotations


class ForensicsError(Exception):
    """An expected failure: bad input, a missing file, a refused operation."""

    exit_code: int = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class UsageError(ForensicsError):
    """The command line asks for something that cannot be done as written."""


class InputError(ForensicsError):
    """An input file, directory, process or address is missing or unusable."""


class CoreParseError(InputError):
    """A core (or something in it) does not parse; says where it failed."""


class NotFoundError(ForensicsError):
    """A lookup found nothing: e.g. an address in no tagged block.

    Exit 1, not 2: the question was fine, the answer is "no".
    """

    exit_code = 1
