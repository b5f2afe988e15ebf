"""The file gdb sources to get the ``tag`` commands (``forensics_gdb.py`` here).

``python3 -m forensics.gdb`` prints the line for ``~/.gdbinit``::

    python3 -m forensics.gdb >> ~/.gdbinit

The commands themselves are in ``forensics.gdb.commands``; this package only ships
the loader inside the wheel so that it sits beside the installed package.
"""

from __future__ import annotations

import os

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forensics_gdb.py")

__all__ = ["SCRIPT"]
