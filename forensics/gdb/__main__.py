"""Print the ``source`` line that loads forensics' tag commands into gdb."""

from forensics.gdb import SCRIPT

print(f"source {SCRIPT}")
