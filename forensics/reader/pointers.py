"""Who points where: every pointer-sized, aligned word in memory that holds an
address inside a tagged block.

One vectorised pass over the writable memory (numpy, in bounded chunks)
produces an edge list ``(source address, target block)``, sorted by target so
that "who points into this block" is a binary search.  ``whoowns`` reads its
referrers from it and the leak scan walks it as a graph, so it is computed
once per core and cached beside the heap index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from forensics._np import np

# Words examined per numpy step: bounds the temporaries to a few hundred MB
# whatever the size of a region.
_CHUNK_WORDS = 1 << 23


@dataclass
class Edges:
    """Pointer words that hit a block, sorted by (target, source).

    ``source[i]`` is the address of a word whose value lies inside block
    ``target[i]`` (an index into the heap index's sorted arrays);
    ``interior[i]`` is True when the value is not the block's start.
    """

    source: np.ndarray    # uint64
    target: np.ndarray    # int64 block index
    interior: np.ndarray  # bool

    @classmethod
    def empty(cls) -> "Edges":
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, bool))

    def into(self, block: int) -> slice:
        """The slice of edges whose target is block (binary search)."""
        lo = int(np.searchsorted(self.target, block, side="left"))
        hi = int(np.searchsorted(self.target, block, side="right"))
        return slice(lo, hi)

    def to_arrays(self, prefix: str = "edges_") -> dict[str, np.ndarray]:
        return {f"{prefix}source": self.source, f"{prefix}target": self.target,
                f"{prefix}interior": self.interior}

    @classmethod
    def from_arrays(cls, arrays, prefix: str = "edges_") -> "Edges":
        return cls(np.asarray(arrays[f"{prefix}source"], np.uint64),
                   np.asarray(arrays[f"{prefix}target"], np.int64),
                   np.asarray(arrays[f"{prefix}interior"], bool))


def hits(words: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
         lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For an array of uint64 words: (positions, block indexes, interior) of
    the words that point into a block.  starts must be sorted."""
    m = (words >= np.uint64(lo)) & (words < np.uint64(hi))
    pos = np.flatnonzero(m)
    if pos.size == 0:
        return pos, pos.astype(np.int64), np.zeros(0, bool)
    vals = words[pos]
    j = np.searchsorted(starts, vals, side="right").astype(np.int64) - 1
    ok = j >= 0
    jj = np.where(ok, j, 0)
    # a zero-size block still owns its start address
    ok &= (vals - starts[jj]) < np.maximum(sizes[jj], 1)
    return pos[ok], j[ok], vals[ok] != starts[j[ok]]


def build_edges(regions: Iterable, starts: np.ndarray, sizes: np.ndarray, *,
                progress: Callable[[int, int], None] | None = None) -> Edges:
    """Scan regions (objects with .start and .array, a uint8 numpy view) for
    words pointing into the blocks (starts sorted, sizes alike).  The caller
    leaves libtag's own memory out (forensics.reader.memory.clip_regions with
    Control.own_ranges()): it holds stack ids and pointers to freed blocks, not
    the program's references."""
    starts = np.asarray(starts, np.uint64)
    sizes = np.asarray(sizes, np.uint64)
    if starts.size == 0:
        return Edges.empty()
    lo = int(starts[0])
    hi = int((starts + np.maximum(sizes, 1)).max())
    regions = list(regions)
    total = sum(len(r.array) for r in regions)
    done = 0
    src, dst, inner = [], [], []
    for r in regions:
        arr = r.array
        head = (-r.start) % 8  # first 8-aligned address in the region
        n = (len(arr) - head) // 8
        if n > 0:
            words = arr[head:head + n * 8].view("<u8")
            for off in range(0, n, _CHUNK_WORDS):
                chunk = words[off:off + _CHUNK_WORDS]
                pos, j, interior = hits(chunk, starts, sizes, lo, hi)
                if pos.size:
                    src.append(np.uint64(r.start + head) + (pos + off).astype(np.uint64) * np.uint64(8))
                    dst.append(j)
                    inner.append(interior)
        done += len(arr)
        if progress:
            progress(done, total)
    if not src:
        return Edges.empty()
    source = np.concatenate(src)
    target = np.concatenate(dst)
    interior = np.concatenate(inner)
    order = np.lexsort((source, target))
    return Edges(source[order], target[order], interior[order])
