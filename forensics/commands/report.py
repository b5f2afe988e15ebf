"""Write one self-contained HTML page: allocation tree, live heap over time, anomalies.

    forensics report CORE... -o FILE.html
"""

from __future__ import annotations

import argparse

from forensics.errors import ForensicsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cores", metavar="CORE", nargs="+", help="cores taken under libtag")
    parser.add_argument("-o", "--output", metavar="FILE.html", required=True,
                        help="the HTML file to write")


def main(args: argparse.Namespace) -> int:
    raise ForensicsError("report is not implemented yet")
