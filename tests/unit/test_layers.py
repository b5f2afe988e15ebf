"""The layers of forensics hold: each package imports only the ones below it,
and only forensics.output imports rich.

GIVEN the import-linter contracts in pyproject.toml ([tool.importlinter])
WHEN lint-imports checks this checkout's forensics/ (run from the checkout's
root, which import-linter puts first on sys.path)
THEN every contract is kept, and the picture of the layers in
docs/architecture.md names the contract's packages in the contract's order.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
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


def test_the_architecture_picture_is_the_layer_contract():
    doc, project = ROOT / "docs" / "architecture.md", ROOT / "pyproject.toml"
    if not doc.is_file() or not project.is_file():
        pytest.skip(f"no source checkout at {ROOT}")
    with open(project, "rb") as f:
        contract = tomllib.load(f)["tool"]["importlinter"]["contracts"][0]["layers"]
    want = [name.strip().removeprefix("forensics.") for layer in contract for name in layer.split("|")]
    # the picture's rows under "forensics": "   answers/  ...", "   output/ | snapshots/  ...",
    # and its last one, "   files, libpath, errors  ..."
    picture = doc.read_text().split("```")[1]
    drawn = []
    for line in picture.split("forensics ◀")[1].splitlines()[1:]:
        head = re.match(r"   ((?:[a-z]+/(?: \| )?)+|[a-z]+(?:, [a-z]+)+) ", line)
        if head:
            drawn += re.findall(r"[a-z]+", head.group(1))
    assert drawn == want

