"""What a heap block is, without its allocation stack: C++ classes by vtable.

A C++ object of a class with virtual functions starts with its vtable
pointer: the address of the class's ``_ZTV<class>`` object in a module's
``.data.rel.ro`` plus 16 (the offset-to-top and typeinfo words come first;
a base subobject's vtable of a class with several bases lies further in).
So a block whose first word points into a ``_ZTV`` symbol of a loaded
module, 16 bytes or more past its start, holds an object of that class
(or of a class derived from it whose vtable is that one: the most derived
class, since a constructor stores its own vtable last).  The name is the
symbol demangled (``c++filt``, once for all the names a question needs);
anything else is "unknown" (None).

    types = BlockTypes(dump)
    types.of(block_start)           # "Session", "std::runtime_error", None
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Iterable

import numpy as np

_VTABLE = "_ZTV"


class BlockTypes:
    """The C++ class of blocks of a Dump (a libtag or a plain one), by the
    vtable pointer in their first word; answers are cached."""

    def __init__(self, dump) -> None:
        self.dump = dump
        self._by_vtable: dict[int, str | None] = {}
        self._names: dict[str, str] = {}

    def of(self, start: int) -> str | None:
        """The class of the object at block start *start*, or None."""
        try:
            word = int.from_bytes(self.dump.mem.read(start, 8), "little")
        except Exception:  # an address the core does not hold
            return None
        return self._vtable_class(word)

    def of_many(self, starts: Iterable[int]) -> dict[int, str | None]:
        """{start: class or None} for many blocks, demangling in one batch."""
        words = {}
        for s in starts:
            try:
                words[s] = int.from_bytes(self.dump.mem.read(s, 8), "little")
            except Exception:
                words[s] = 0
        self._demangle_batch([self._vtable_symbol(w) for w in set(words.values())])
        return {s: self._vtable_class(w) for s, w in words.items()}

    def count(self, starts: np.ndarray, sizes: np.ndarray) -> list[tuple[str, int, int]]:
        """[(class, blocks, bytes)] of the blocks at *starts* (sizes: their
        bytes) whose class can be told, most bytes first.  The first words
        are gathered in bulk from the memory's regions, and each distinct
        word is looked up once."""
        words = first_words(self.dump.mem, np.asarray(starts, dtype=np.uint64))
        sizes = np.asarray(sizes, dtype=np.uint64)
        # a vtable pointer is 8-aligned and points into a module's mapping
        cand = (words >= 4096) & ((words & np.uint64(7)) == 0)
        mods = sorted((m.start, m.end) for m in self.dump.symbolizer.modules)
        if mods:
            lo = np.array([a for a, _ in mods], dtype=np.uint64)
            hi = np.array([b for _, b in mods], dtype=np.uint64)
            j = np.searchsorted(lo, words, side="right") - 1
            inside = (j >= 0) & (words < hi[np.maximum(j, 0)])
            cand &= inside
        else:
            cand[:] = False
        uniq, inverse = np.unique(words[cand], return_inverse=True)
        self._demangle_batch([self._vtable_symbol(int(w)) for w in uniq])
        classes = [self._vtable_class(int(w)) for w in uniq]
        out: dict[str, list[int]] = {}
        cand_sizes = sizes[cand]
        for u, cls in enumerate(classes):
            if cls is None:
                continue
            sel = inverse == u
            row = out.setdefault(cls, [0, 0])
            row[0] += int(sel.sum())
            row[1] += int(cand_sizes[sel].sum())
        return sorted(((c, n, b) for c, (n, b) in out.items()), key=lambda r: (-r[2], r[0]))

    def _vtable_symbol(self, word: int) -> str | None:
        if word < 4096 or word & 7:
            return None
        symbolizer = self.dump.symbolizer
        module = symbolizer.module_at(word)
        if module is None:
            return None
        sym = symbolizer.data_symbol(module.path, word)
        if sym is None or not sym.name or not sym.name.startswith(_VTABLE) or sym.offset < 16:
            return None
        return sym.name

    def _vtable_class(self, word: int) -> str | None:
        if word in self._by_vtable:
            return self._by_vtable[word]
        name = self._vtable_symbol(word)
        cls = None
        if name is not None:
            self._demangle_batch([name])
            cls = self._names.get(name)
        self._by_vtable[word] = cls
        return cls

    def _demangle_batch(self, names: Iterable[str | None]) -> None:
        todo = sorted({n for n in names if n and n not in self._names})
        if not todo:
            return
        out = None
        tool = shutil.which("c++filt")
        if tool is not None:
            try:
                done = subprocess.run([tool], input="\n".join(todo) + "\n", capture_output=True,
                                      text=True, timeout=30)
                out = done.stdout.splitlines() if done.returncode == 0 else None
            except (OSError, subprocess.SubprocessError):
                out = None
        for i, name in enumerate(todo):
            text = out[i] if out is not None and i < len(out) else name
            self._names[name] = text[len("vtable for "):] if text.startswith("vtable for ") \
                else name[len(_VTABLE):]


def first_words(mem, starts: np.ndarray) -> np.ndarray:
    """The 8-byte word at each of *starts* (8-aligned addresses) in memory
    *mem*, 0 where the memory does not hold it."""
    out = np.zeros(len(starts), dtype=np.uint64)
    if not len(starts):
        return out
    regions = sorted(mem.regions(), key=lambda r: r.start)
    rstarts = np.array([r.start for r in regions], dtype=np.uint64)
    which = np.searchsorted(rstarts, starts, side="right") - 1
    for i in np.unique(which[which >= 0]):
        r = regions[int(i)]
        sel = np.flatnonzero(which == i)
        arr = r.array
        words = arr[: len(arr) // 8 * 8].view("<u8") if r.start % 8 == 0 else None
        if words is None:
            continue
        offs = (starts[sel] - np.uint64(r.start)) // np.uint64(8)
        ok = ((starts[sel] & np.uint64(7)) == 0) & (offs < np.uint64(len(words)))
        out[sel[ok]] = words[offs[ok].astype(np.int64)]
    return out
