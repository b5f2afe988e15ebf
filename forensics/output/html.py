"""The ``report`` page: one self-contained HTML file from the report's data
(a ReportDoc, built by forensics.answers.report; its JSON is ``to_json``'s,
docs/json.md, "forensics report").

Every string from a core (function names, file paths, the executable) reaches
the page only as JSON inside ``<script type="application/json">`` with ``<``,
``>`` and ``&`` escaped, and the page's script puts it in the DOM with
textContent, never as markup.  A Content-Security-Policy allows no network
and only the page's own script and style (by hash), so the page works offline
and a string that got through anyway could not run.

The page is written 0600 (it names the program's functions, files and
paths) and atomically (forensics.files.write_private).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
from importlib import resources
from typing import Any

from forensics.answers.documents import ReportDoc, to_json
from forensics.errors import InputError
from forensics.files import write_private


def _asset(name: str) -> str:
    return resources.files("forensics.output").joinpath("report_assets", name).read_text("utf-8")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def json_for_script(data: Any) -> str:
    """JSON that is inert inside a <script> element: no '<', '>' or '&' at all
    (so no '</script>' and no '<!--'), non-ASCII as \\u escapes."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(doc: ReportDoc) -> str:
    """The whole page: markup, the style and script inline, the data as JSON."""
    css = _asset("report.css")
    js = _asset("report.js")
    csp = (f"default-src 'none'; script-src {_csp_hash(js)}; style-src {_csp_hash(css)}; "
           "img-src data:; base-uri 'none'; form-action 'none'")
    title = html.escape(doc.title or "forensics report", quote=True)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{html.escape(csp, quote=False)}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="generator" content="forensics report">\n'
        f"<title>{title}</title>\n"
        f"<style>{css}</style>\n</head>\n<body>\n"
        '<div id="fx-status" data-errors="0" data-ready="0"><ol id="fx-errors"></ol></div>\n'
        '<main id="fx-app"><noscript>This report needs JavaScript to draw its charts.</noscript></main>\n'
        f'<script type="application/json" id="fx-data">{json_for_script(to_json(doc))}</script>\n'
        f"<script>{js}</script>\n"
        "</body>\n</html>\n"
    )


def write_page(path: str | os.PathLike[str], page: str) -> str:
    """Write the page to path (0600, atomically); returns the absolute path."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise InputError(f"cannot write the report: {path} is a directory; give a file name")
    try:
        write_private(path, lambda f: f.write(page.encode("utf-8")), durable=True)
    except FileNotFoundError:
        raise InputError(f"cannot write the report: no such folder {folder}") from None
    except OSError as e:
        raise InputError(f"cannot write the report {path}: {e.strerror}") from None
    return path
