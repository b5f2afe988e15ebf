"""``python -m forensics``: the ``forensics`` command (forensics.cli.main)."""

from forensics.cli.main import entry

if __name__ == "__main__":
    entry()
