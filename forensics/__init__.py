"""forensics: who allocated, freed and owns any address in a C/C++ process or core.

The C half, libtag, is shipped inside this package (see forensics.libpath);
the ``forensics`` command is forensics.cli.main.
"""

__version__ = "0.1.0"
