"""The layers of forensics hold: each package imports only the ones below it,
and only forensics.output imports rich.

GIVEN the import-linter contracts in pyproject.toml ([tool.importlinter])
WHEN lint-imports checks this checkout's forensics/ (run from the checkout's
root, which import-linter puts first on sys.path)
THEN every contract is kept.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_layers_are_kept():
    if not (ROOT / "pyproject.toml").is_file() or not (ROOT / "forensics").is_dir():
        pytest.skip(f"no source checkout at {ROOT}")
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        lint = Path(shutil.which("lint-imports") or "lint-imports")
    done = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"lint-imports found broken contracts:\n{done.stdout}\n{done.stderr}"
    assert "2 kept, 0 broken" in done.stdout, done.stdout
