"""Every cross-reference in the documentation resolves.

GIVEN README.md and every markdown file under docs/
WHEN each relative link `[text](path#anchor)` and each repository path quoted
in backquotes (`libtag/src/heap.c`, `docs/format.md:86`) is read
THEN the link's file exists and, where an anchor is given, the file has a
heading with that anchor (GitHub's slugs); and each quoted path exists (and
has the quoted line).

docs/history/ is an archive of pages as they stood: its links are checked, its
quoted paths are not (they name the tree of their day, prototypes since
removed included).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
HISTORY = DOCS / "history"

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
PATH_LINE = re.compile(r"^(?P<path>[^:]+?)(?::(?P<line>\d+)(?:-(?P<end>\d+))?)?$")


def _pages() -> list[Path]:
    if not DOCS.is_dir():
        pytest.skip(f"no source checkout at {ROOT}")
    pages = sorted(DOCS.rglob("*.md"))
    readme = ROOT / "README.md"
    return ([readme] if readme.is_file() else []) + pages


def _prose(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their numbers."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, every
    character but letters, digits, '_', '-' and spaces removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "")
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_follows_github():
    assert slug("The heap: libtag's own (`libtag/src/heap.c`)") == "the-heap-libtags-own-libtagsrcheapc"
    assert slug("1c. Guarded blocks (`LIBTAG_GUARD_RATE`)") == "1c-guarded-blocks-libtag_guard_rate"
    assert slug("Real programs: -O2, fp, instr") == "real-programs--o2-fp-instr"


def _links(page: Path):
    for n, line in _prose(page.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...
                continue
            yield n, target


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        for n, target in _links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{n}: ({target})"
            if not dest.exists():
                broken.append(f"{where} - no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} - no heading with anchor #{anchor}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def _top_dirs() -> set[str]:
    return {p.name for p in ROOT.iterdir()
            if p.is_dir() and not p.name.startswith(".") and p.name not in ("build", "dist")} | {".ci"}


def _quoted_paths(page: Path):
    """Backquoted tokens that name a file of this repository: a first
    component that is one of its top folders, and a slash."""
    tops = _top_dirs()
    for n, line in _prose(page.read_text()):
        for _, span in CODE_SPAN.findall(line):
            for token in span.split():
                token = token.strip("\"'(),;.")
                if "/" not in token or re.search(r"[<>*{}$~=|\[\]]", token):
                    continue
                m = PATH_LINE.match(token)
                if m and m.group("path").split("/", 1)[0] in tops:
                    yield n, m.group("path"), m.group("line"), m.group("end")


def test_every_quoted_repo_path_exists():
    missing = []
    for page in _pages():
        if HISTORY in page.parents:
            continue
        for n, path, line, end in _quoted_paths(page):
            target = ROOT / path
            where = f"{page.relative_to(ROOT)}:{n}: `{path}`"
            if not target.exists():
                missing.append(f"{where} - no such path")
            elif line:
                last = int(end or line)
                count = len(target.read_text(errors="replace").splitlines())
                if last > count:
                    missing.append(f"{where}:{line} - the file has {count} lines")
    assert not missing, "quoted paths that do not exist:\n" + "\n".join(missing)
