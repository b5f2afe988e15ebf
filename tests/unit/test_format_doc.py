"""docs/format.md names every array of the block index cache (core.fxidx).

GIVEN the reader's list of index fields (forensics.reader.heap._INDEX_FIELDS,
which is also what the cache holds) and the smashed-canary array saved beside it
WHEN the core.fxidx item of docs/format.md is read
THEN it names each of those arrays, and no array the reader does not have.
"""

from __future__ import annotations

import re
from pathlib import Path

from forensics.reader.heap import _INDEX_FIELDS

FORMAT = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def _fxidx_item() -> str:
    text = FORMAT.read_text()
    start = text.index("- `core.fxidx`:")
    end = text.index("- `core.fxptr`:", start)
    return text[start:end]


def test_format_md_names_every_cached_index_array():
    item = _fxidx_item()
    # the arrays come after "one array per field of the blocks sorted by start:"
    arrays = item.split("sorted by start:", 1)[1]
    named = set(re.findall(r"`([a-z_]+)`", arrays))
    assert named == set(_INDEX_FIELDS) | {"smashed"}, (
        f"docs/format.md's core.fxidx lists {sorted(named)}; "
        f"the reader caches {sorted(set(_INDEX_FIELDS) | {'smashed'})}")
