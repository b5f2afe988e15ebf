"""One module per verb of the ``forensics`` command.

A verb module has:

- a docstring: its first line is the one-line help in ``forensics --help``,
  the whole text is the description in ``forensics VERB --help``;
- ``add_arguments(parser)``: its flags (docs/guide.md; --json's documents:
  docs/json.md);
- ``main(args) -> int``: the exit status.  Expected failures raise
  forensics.errors.ForensicsError subclasses; never print a traceback or
  call sys.exit here.

Every verb module is imported to build the parser, so keep imports of heavy
modules (numpy, rich, the core reader) inside ``main``: start-up time counts
(``whoowns`` on a cached index must answer in under 0.5 s).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# verb -> module name under forensics.cli, in the order --help lists them.
_MODULES = {
    "run": "run",
    "snapshot": "snapshot",
    "attach": "attach",
    "inspect": "inspect",
    "whoowns": "whoowns",
    "diff": "diff",
    "trend": "trend",
    "triage": "triage",
    "list": "list",
    "report": "report",
    "lib-path": "lib_path",
}

VERBS = tuple(_MODULES)


def load(verb: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{_MODULES[verb]}")
