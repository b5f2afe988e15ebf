"""No undefined names, unused imports or dead assignments in the Python code.

Merging parallel work once dropped an import (`abi` in answers/inspect.py)
and every inspect of a crash core died with a NameError: a mistake of that
kind is found here, in seconds, instead of by 100 integration tests.

GIVEN this checkout's forensics/, tests/ and bench/
WHEN ruff checks them with the pyflakes rules (F: undefined names, unused
imports and variables, f-strings without placeholders, ...)
THEN it finds nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_pyflakes_finds_nothing():
    if not (ROOT / "forensics").is_dir():
        pytest.skip(f"no source checkout at {ROOT}")
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        ruff = Path(shutil.which("ruff") or "ruff")
    done = subprocess.run([str(ruff), "check", "--no-cache", "--isolated", "--select", "F",
                           "--output-format", "concise", "forensics", "tests", "bench"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff (pyflakes rules) found:\n{done.stdout}\n{done.stderr}"
