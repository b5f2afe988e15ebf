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

A block without a vtable can still be told when it is the characters of a
``std::string`` (libstdc++'s layout since GCC 5: a pointer to the
characters, the length, then the capacity or the short string itself):
some word points at the block's start and the two words after it read as
a length and a capacity that fit it - a capacity of 16 or more (shorter
strings live inside the object), the length no more than the capacity, a
NUL at [length], and the block capacity + 1 bytes (libtag's exact size;
glibc's chunk, whose usable size is rounded up, capacity + 1 to capacity +
16).  Such a block is "std::string buffer"; a string whose object is gone
(a leaked buffer) cannot be told.

    types = BlockTypes(dump)
    types.of(block_start)           # "Session", "std::runtime_error", None
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Iterable

from forensics._np import np

_VTABLE = "_ZTV"
STRING_BUFFER = "std::string buffer"
# Up to this many blocks, _is_string reads only the edges to them: on a
# core of 1 M blocks every edge's string test costs ~0.5 s, one block's ~0.02 s.
_FEW = 64


class BlockTypes:
    """The C++ class of blocks of a Dump (a libtag or a plain one), by the
    vtable pointer in their first word; answers are cached."""

    def __init__(self, dump) -> None:
        self.dump = dump
        self._by_vtable: dict[int, str | None] = {}
        self._names: dict[str, str] = {}
        self._strings: np.ndarray | None = None  # block starts holding a string's characters

    def of(self, start: int) -> str | None:
        """The class of the object at block start *start* (or a string's
        characters), or None."""
        try:
            word = int.from_bytes(self.dump.mem.read(start, 8), "little")
        except Exception:  # an address the core does not hold
            return None
        cls = self._vtable_class(word)
        if cls is None and self._is_string(np.array([start], np.uint64))[0]:
            return STRING_BUFFER
        return cls

    def _is_string(self, starts: np.ndarray) -> np.ndarray:
        """Which of *starts* (block starts) hold a std::string's characters.
        A few blocks (whoowns' one) read only the edges that point at them;
        more read every edge once and keep the answer."""
        if self._strings is not None:
            found = self._strings
        elif len(starts) <= _FEW:
            found = string_buffers(self.dump, among=starts)
        else:
            self._strings = found = string_buffers(self.dump)
        if not len(found):
            return np.zeros(len(starts), bool)
        i = np.minimum(np.searchsorted(found, starts), len(found) - 1)
        return found[i] == starts

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
        told = np.zeros(len(words), bool)
        cand_at = np.flatnonzero(cand)
        for u, cls in enumerate(classes):
            if cls is None:
                continue
            sel = inverse == u
            told[cand_at[sel]] = True
            row = out.setdefault(cls, [0, 0])
            row[0] += int(sel.sum())
            row[1] += int(cand_sizes[sel].sum())
        strings = ~told & self._is_string(np.asarray(starts, dtype=np.uint64))
        if strings.any():
            out[STRING_BUFFER] = [int(strings.sum()), int(sizes[strings].sum())]
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


def string_buffers(dump, among: np.ndarray | None = None) -> np.ndarray:
    """The starts (sorted) of the blocks that hold a std::string's
    characters (the module's docstring says how they are told), from the
    pointer edges: each word that points at a block's start is read as a
    string object's first word.  *among*: only these block starts are
    asked about (the edges to other blocks are not read)."""
    starts, sizes, live, tagged = dump.targets
    edges = dump.edges
    at_start = ~edges.interior
    if among is not None:
        at_start &= np.isin(starts[edges.target], np.asarray(among, np.uint64))
    src = edges.source[at_start].astype(np.uint64)
    dst = edges.target[at_start].astype(np.int64)
    keep = live[dst]
    src, dst = src[keep], dst[keep]
    if not len(src):
        return np.zeros(0, np.uint64)
    mem = dump.mem
    length = first_words(mem, src + np.uint64(8))
    cap = first_words(mem, src + np.uint64(16))
    size = sizes[dst].astype(np.uint64)
    need = cap + np.uint64(1)
    fits = np.where(tagged[dst], size == need, (size >= need) & (size <= cap + np.uint64(16)))
    ok = (cap >= np.uint64(16)) & (cap < np.uint64(1 << 40)) & (length <= cap) & fits
    idx = np.flatnonzero(ok)
    if not len(idx):
        return np.zeros(0, np.uint64)
    # the NUL after the characters
    end = starts[dst[idx]].astype(np.uint64) + length[idx]
    word = first_words(mem, end & ~np.uint64(7))
    byte = (word >> ((end & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
    found = starts[dst[idx[byte == 0]]].astype(np.uint64)
    return np.unique(found)


def first_words(mem, starts: np.ndarray) -> np.ndarray:
    """The 8-byte word at each of *starts* (8-aligned addresses) in memory
    *mem*, 0 where the memory does not hold it."""
    out = np.zeros(len(starts), dtype=np.uint64)
    if not len(starts):
        return out
    regions = sorted(mem.regions(), key=lambda r: r.start)
    rstarts = np.array([r.start for r in regions], dtype=np.uint64)
    which = np.searchsorted(rstarts, starts, side="right") - 1
    # the starts grouped by region: one sort, not a pass over every start a region
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(regions) + 1), side="left")
    for i in range(len(regions)):
        sel = order[bounds[i]:bounds[i + 1]]
        if not len(sel):
            continue
        r = regions[i]
        arr = r.array
        words = arr[: len(arr) // 8 * 8].view("<u8") if r.start % 8 == 0 else None
        if words is None:
            continue
        offs = (starts[sel] - np.uint64(r.start)) // np.uint64(8)
        ok = ((starts[sel] & np.uint64(7)) == 0) & (offs < np.uint64(len(words)))
        out[sel[ok]] = words[offs[ok].astype(np.int64)]
    return out
