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



# ----------------------------------------------------------- libtag's C layers
# libtag/src/ is one folder a concept, and the folders are layers, lowest
# first: a source or header in one includes headers of its own folder and of
# folders below it, never above (docs/architecture.md draws the same order).
# A header of libtag's own is named with its folder ("stacks/thread.h"); a
# bare name is a public header of libtag/include or a system one.
C_LAYERS = ["base", "heap", "stacks", "alloc", "snapshot", "life"]
LIBTAG = ROOT / "libtag"
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def c_layer_breaks(src: Path, public: Path) -> list[str]:
    """Each include under src that breaks the layers, as 'file: line: why'."""
    rank = {name: i for i, name in enumerate(C_LAYERS)}
    breaks = []
    for f in sorted(src.rglob("*")):
        if f.suffix not in (".c", ".h"):
            continue
        rel = f.relative_to(src)
        if len(rel.parts) != 2 or rel.parts[0] not in rank:
            breaks.append(f"{rel}: not in a layer folder of {C_LAYERS}")
            continue
        mine = rank[rel.parts[0]]
        for m in INCLUDE.finditer(f.read_text()):
            name, line = m.group(1), f.read_text().count("\n", 0, m.start()) + 1
            folder = name.split("/")[0]
            if "/" not in name:
                if not (public / name).is_file():
                    breaks.append(f"{rel}:{line}: \"{name}\" is neither public (libtag/include) "
                                  f"nor named with its folder")
            elif folder not in rank or not (src / name).is_file():
                breaks.append(f"{rel}:{line}: \"{name}\" is no header of libtag/src")
            elif rank[folder] > mine:
                breaks.append(f"{rel}:{line}: {rel.parts[0]}/ includes \"{name}\" of {folder}/, "
                              f"a layer above it")
    return breaks


def test_libtag_folders_include_only_their_own_and_lower_layers():
    src = LIBTAG / "src"
    if not src.is_dir():
        pytest.skip(f"no libtag sources at {src}")
    assert sorted(p.name for p in src.iterdir()) == sorted(C_LAYERS)
    assert c_layer_breaks(src, LIBTAG / "include") == []


def test_the_c_layer_check_finds_an_include_from_above(tmp_path):
    """The check itself: an upward include, a header named without its
    folder, and one of no layer are each reported, the first with its line."""
    public = tmp_path / "include"
    public.mkdir()
    (public / "tag_abi.h").write_text("")
    for folder in C_LAYERS:
        (tmp_path / "src" / folder).mkdir(parents=True)
    (tmp_path / "src" / "stacks" / "thread.h").write_text('#include "base/base.h"\n')
    (tmp_path / "src" / "base" / "base.h").write_text('#include "tag_abi.h"\n')
    (tmp_path / "src" / "heap" / "heap.c").write_text(
        '#include "heap/heap.h"\n#include <stdint.h>\n#include "stacks/thread.h"\n#include "thread.h"\n')
    (tmp_path / "src" / "heap" / "heap.h").write_text('#include "base/base.h"\n')
    (tmp_path / "src" / "misc.c").write_text("")
    assert c_layer_breaks(tmp_path / "src", public) == [
        'heap/heap.c:3: heap/ includes "stacks/thread.h" of stacks/, a layer above it',
        'heap/heap.c:4: "thread.h" is neither public (libtag/include) nor named with its folder',
        f"misc.c: not in a layer folder of {C_LAYERS}",
    ]


def test_the_architecture_picture_is_the_c_layer_order():
    doc = ROOT / "docs" / "architecture.md"
    if not doc.is_file():
        pytest.skip(f"no source checkout at {ROOT}")
    # the picture's rows under "libtag/src", top layer first: "   life/  ..."
    picture = doc.read_text().split("libtag/src ◀")[1].split("```")[0]
    drawn = [m.group(1) for m in re.finditer(r"^   ([a-z]+)/ ", picture, re.M)]
    assert drawn == list(reversed(C_LAYERS))
