"""Print the path of the installed libtag.so, for a manual LD_PRELOAD.

    LD_PRELOAD=$(forensics lib-path) ./server
"""

from __future__ import annotations

import argparse

from forensics.libpath import lib_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    print(lib_path())
    return 0
