"""Headless Chromium for the report tests: load a page, dump its DOM (after
the page's script ran) or take a screenshot, and a small DOM tree to query.
Import as ``forensics_test_browser`` (tests/conftest.py registers it)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = shutil.which("chromium")
TIMEOUT = 180


def chromium(page: Path, profile: Path, *, fragment: str = "", screenshot: Path | None = None):
    """Load page (file://) in headless Chromium: (dumped DOM, Chromium's stderr)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-extensions", "--hide-scrollbars", "--enable-logging=stderr",
           "--v=0", f"--user-data-dir={profile}", "--window-size=1400,1000"]
    if screenshot is not None:
        cmd += ["--window-size=1400,1700", f"--screenshot={screenshot}"]
    else:
        cmd += ["--dump-dom"]
    cmd.append(page.resolve().as_uri() + fragment)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"expected chromium to exit 0, got {r.returncode}: {r.stderr[-2000:]}"
    return r.stdout, r.stderr


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [n for n in self.iter()
                if (tag is None or n.tag == tag)
                and all((n.attrs.get(k) == v) if v is not True else k in n.attrs for k, v in want.items())]

    def one(self, tag: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, **attrs)
        assert len(found) == 1, f"expected exactly one <{tag} {attrs}>, found {len(found)}"
        return found[0]

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class DomParser(HTMLParser):
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
            "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag not in self.VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, dict(attrs), self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def dom(text: str) -> Node:
    p = DomParser()
    p.feed(text)
    p.close()
    return p.root


def assert_clean(doc: Node, stderr: str) -> None:
    status = doc.one(id="fx-status")
    errors = [li.text() for li in status.find_all("li")]
    assert status.attrs.get("data-errors") == "0", f"expected no page errors, got {errors}"
    assert status.attrs.get("data-ready") == "1", "expected the page's script to finish (data-ready=1)"
    bad = [ln for ln in stderr.splitlines() if "Uncaught" in ln or "Refused to" in ln
           or ("CONSOLE" in ln and "error" in ln.lower())]
    assert bad == [], f"expected no console errors or CSP refusals from chromium, got {bad}"


