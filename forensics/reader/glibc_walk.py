"""glibc's own heap in the memory of a process that never ran libtag: every
chunk, its state and the inconsistencies found, read with the layout of
forensics/reader/glibc_layout.py.

    heap = GlibcHeap(mem, layout, threads={tid: fs_base})
    chunk = heap.chunk_at(0x55d0c0a012a0)                 # Chunk | None
    heap.findings                                         # what is inconsistent

The chunk walk follows each heap's size fields from its first chunk to its
top; a size that cannot be right (too small, misaligned, past the heap)
is a finding, and the walk resynchronises at the first later address from
which a chain of sane sizes reaches the top.  Every list is then walked and
checked the way glibc's own checks would (safe-linking's mangled pointers
demangled: ``next = (pos >> 12) ^ stored``), and each chunk is classified.
The arrays (start, size, state, bin, arena, thread) are sorted by start;
``chunk_at`` is one ``searchsorted``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from forensics._np import np

from forensics.errors import InputError
from forensics.reader.glibc_layout import (
    ALIGN,
    CHUNK_HDR,
    FLAG_BITS,
    HEAP_MAX_SIZE,
    IS_MMAPPED,
    MINSIZE,
    NBINS,
    NFASTBINS,
    NON_MAIN_ARENA,
    NSMALLBINS,
    PAGE,
    PREV_INUSE,
    SIZE_SZ,
    TCACHE_MAX_BINS,
    GlibcError,
    Layout,
)
from forensics.reader.memory import Memory, Region

MAX_ARENAS = 1024
MAX_LIST = 1 << 22  # entries followed on one list before it is called a loop
_RESYNC_CANDIDATES = 1 << 16  # 16-byte steps tried after a bad size
_RESYNC_CHAIN = 64  # sane chunks in a row that make a resync point trusted

# Chunk states, in the order the arrays store them.
STATES = ("inuse", "tcache", "fastbin", "unsorted", "smallbin", "largebin", "top", "mmapped",
          "free", "damaged")
S = {name: i for i, name in enumerate(STATES)}
FREE_STATES = ("tcache", "fastbin", "unsorted", "smallbin", "largebin", "free")


# ------------------------------------------------------------------ chunks --


@dataclass(frozen=True)
class Arena:
    address: int
    main: bool
    top: int
    top_size: int
    system_mem: int
    heaps: tuple[tuple[int, int], ...]  # [start, end) of each heap (main: the sbrk heap)
    threads: tuple[int, ...] = ()  # tids whose thread_arena is this one


@dataclass(frozen=True)
class Chunk:
    """One chunk as glibc's structures describe it."""

    start: int  # the chunk header (prev_size)
    size: int  # chunksize: the whole chunk, header included
    state: str  # one of STATES
    arena: Arena | None  # None for an mmapped chunk
    bin: int | None = None  # tcache/fastbin index, or bin number (unsorted 1, small 2-63, large 64-126)
    thread: int | None = None  # tcache: whose
    raw_size: int | None = None  # the size field as found (a damaged chunk's)

    @property
    def user(self) -> int:
        """The pointer malloc returned for it."""
        return self.start + CHUNK_HDR

    @property
    def usable(self) -> int:
        """malloc_usable_size: what the block could hold."""
        if self.state == "mmapped":
            return self.size - CHUNK_HDR
        return max(self.size - SIZE_SZ, 0)

    @property
    def end(self) -> int:
        return self.start + self.size

    def __contains__(self, addr: int) -> bool:
        return self.start <= addr < self.start + self.size

    @property
    def bin_name(self) -> str | None:
        return bin_name(self.state, self.bin, self.size)


def bin_name(state: str, index: int | None, size: int) -> str | None:
    if index is None:
        return None
    if state == "tcache":
        return f"tcache bin {index} ({(index + 2) * ALIGN}-byte chunks)"
    if state == "fastbin":
        return f"fastbin {index} ({(index + 2) * ALIGN}-byte chunks)"
    if state == "unsorted":
        return "the unsorted bin"
    if state == "smallbin":
        return f"small bin {index} ({index * ALIGN}-byte chunks)"
    if state == "largebin":
        return f"large bin {index}"
    return None


@dataclass(frozen=True)
class Finding:
    """One inconsistency in glibc's structures, with the chunk it is about."""

    kind: str  # bad-size, prev-size, bin-link, fastbin-next, tcache-next, tcache-count,
    #            tcache-orphan, top-size, list-loop, not-a-chunk
    chunk: int | None  # the chunk concerned (its header)
    message: str  # one line: what is wrong, glibc's words where it has them
    arena: int | None = None
    value: int | None = None  # the bad value found (a size, a pointer)
    detail: dict = field(default_factory=dict)


def _c(p: int) -> str:
    """A chunk as messages name it: its header, and the pointer malloc gave."""
    return f"chunk {p:#x} (block {p + CHUNK_HDR:#x})"


def demangle(pos: int, stored: int) -> int:
    """glibc 2.32's safe-linking: a next pointer stored at pos is
    ``(pos >> 12) ^ next``."""
    return ((pos >> 12) ^ stored) & ((1 << 64) - 1)


def tcache_index(chunk_size: int) -> int:
    return (chunk_size - MINSIZE + ALIGN - 1) // ALIGN


def fastbin_index(chunk_size: int) -> int:
    return (chunk_size >> 4) - 2


def bin_index(chunk_size: int) -> int:
    """glibc's bin_index (64-bit): the bin a free chunk of this size sorts into."""
    sz = chunk_size
    if sz < 1024:
        return sz >> 4
    if (sz >> 6) <= 48:
        return 48 + (sz >> 6)
    if (sz >> 9) <= 20:
        return 91 + (sz >> 9)
    if (sz >> 12) <= 10:
        return 110 + (sz >> 12)
    if (sz >> 15) <= 4:
        return 119 + (sz >> 15)
    if (sz >> 18) <= 2:
        return 124 + (sz >> 18)
    return 126


class _Words:
    """Reads of 64-bit words, served from the regions' arrays."""

    def __init__(self, mem: Memory) -> None:
        self.mem = mem
        self.regions = [r for r in mem.regions()]
        self._starts = [r.start for r in self.regions]
        self._last: Region | None = None

    def region(self, addr: int) -> Region | None:
        r = self._last
        if r is not None and r.start <= addr < r.end:
            return r
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self.regions[i].end:
            self._last = self.regions[i]
            return self._last
        return None

    def u64(self, addr: int) -> int | None:
        r = self.region(addr)
        if r is None or addr & 7:
            return self._slow(addr, 8)
        off = addr - r.start
        try:
            arr = r.array
        except InputError:
            return self._slow(addr, 8)
        if off + 8 > len(arr):
            return None
        return int.from_bytes(arr[off:off + 8].tobytes(), "little")

    def gather(self, addrs: np.ndarray) -> np.ndarray:
        """The 64-bit words at many 8-aligned addresses at once (uint64; 0
        where this memory does not hold one)."""
        addrs = np.asarray(addrs, np.uint64)
        out = np.zeros(len(addrs), np.uint64)
        if not len(addrs):
            return out
        starts = np.array(self._starts, np.uint64)
        which = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
        for k in np.unique(which[which >= 0]).tolist():
            r = self.regions[k]
            try:
                arr = r.array
            except InputError:
                continue
            words = arr[:len(arr) // 8 * 8].view("<u8")
            sel = np.flatnonzero(which == k)
            off = (addrs[sel] - np.uint64(r.start)) // np.uint64(8)
            ok = (off < np.uint64(len(words))) & (addrs[sel] % np.uint64(8) == 0)
            out[sel[ok]] = words[off[ok].astype(np.int64)]
        return out

    def u32(self, addr: int) -> int | None:
        raw = self.read(addr, 4)
        return int.from_bytes(raw, "little") if raw is not None else None

    def read(self, addr: int, n: int) -> bytes | None:
        try:
            return self.mem.read(addr, n)
        except InputError:
            return None

    def _slow(self, addr: int, n: int) -> int | None:
        raw = self.read(addr, n)
        return int.from_bytes(raw, "little") if raw is not None else None


class GlibcHeap:
    """glibc's heap in mem (see the module's docstring).

    threads: {tid: fs_base} of the process's threads (NT_PRSTATUS), for
    their tcache and thread_arena; stacks: [start, end) of their stacks,
    which are never taken for mmapped chunks."""

    def __init__(self, mem: Memory, layout: Layout, *, threads: dict[int, int] | None = None,
                 stacks: Iterable[tuple[int, int]] = (), counted_mmaps: bool = False) -> None:
        self.mem = mem
        self.layout = layout
        self.words = _Words(mem)
        self.warnings: list[str] = []
        self.findings: list[Finding] = []
        self._threads = dict(threads or {})
        self._stacks = list(stacks)
        # look for chunks of their own mmap only when mp_ counts some (a
        # process whose blocks are another allocator's: libtag's)
        self._counted_mmaps = counted_mmaps
        base = layout.libc_base
        self.main_arena = base + layout.main_arena
        self.mp = base + layout.mp
        self.tcache_key = self.words.u64(base + layout.tcache_key) if layout.tcache_key else None
        self._starts: list[np.ndarray] = []
        self._sizes: list[np.ndarray] = []
        self._states: list[np.ndarray] = []
        self._arena_of: list[np.ndarray] = []
        self._raw: dict[int, int] = {}  # damaged chunk -> its size field
        self.arenas: list[Arena] = []
        self.tcaches: dict[int, int] = {}  # tid -> its tcache_perthread_struct (user pointer)
        self._read_arenas()
        self._walk_all()
        self._index()
        self._classify()

    # ----------------------------------------------------------- reading --

    def _u64(self, addr: int, what: str) -> int:
        v = self.words.u64(addr)
        if v is None:
            raise GlibcError(f"{what} at {addr:#x} is not in {getattr(self.mem, 'name', 'memory')}")
        return v

    def _state(self, arena: int, member: str) -> int:
        return self._u64(arena + self.layout.state[member], f"malloc_state.{member}")

    def _par(self, member: str, size: int = 8) -> int:
        addr = self.mp + self.layout.par[member]
        v = self._u64(addr & ~7, f"mp_.{member}")
        if size == 4:
            v = (v >> (8 * (addr & 7))) & 0xFFFFFFFF
        return v

    def _tls(self, got: int | None, fs_base: int, add: int = 0) -> int | None:
        """A thread's value of one of libc's initial-exec TLS variables
        (fs_base: its thread pointer, aarch64's tpidr_el0 alike)."""
        if got is None or not fs_base:
            return None
        tpoff = self.words.u64(self.layout.libc_base + got)
        if tpoff is None:
            return None
        return self.words.u64((fs_base + tpoff + add) & ((1 << 64) - 1))

    # ------------------------------------------------------------ arenas --

    def _read_arenas(self) -> None:
        lay = self.layout
        owners: dict[int, list[int]] = {}
        for tid, fs in sorted(self._threads.items()):
            a = self._tls(lay.arena_got, fs)
            if a:
                owners.setdefault(a, []).append(tid)
            t = self._tls(lay.tcache_got, fs, lay.tcache_tls_add)
            if t:
                self.tcaches[tid] = t
        if lay.arena_got is None and self._threads:
            self.warnings.append("libc's thread_arena TLS slot is unknown: which thread uses "
                                 "which arena is not said")
        hp = self._par("hp_pagesize") if "hp_pagesize" in lay.par else 0
        self.heap_max = hp * 4 if hp else HEAP_MAX_SIZE
        seen = set()
        a = self.main_arena
        while a not in seen and len(seen) < MAX_ARENAS:
            seen.add(a)
            main = a == self.main_arena
            top = self._state(a, "top")
            top_size = (self.words.u64(top + SIZE_SZ) or 0) & ~FLAG_BITS if top else 0
            heaps = self._main_heaps(top, top_size) if main else self._thread_heaps(a, top, top_size)
            self.arenas.append(Arena(a, main, top, top_size, self._state(a, "system_mem"),
                                     tuple(heaps), tuple(owners.get(a, ()))))
            nxt = self._state(a, "next")
            if nxt == self.main_arena or not nxt:
                break
            if self.words.region(nxt) is None:
                self.findings.append(Finding("bin-link", None, f"arena {a:#x}: its next arena "
                                             f"{nxt:#x} is not in memory: the arena list ends here",
                                             arena=a, value=nxt))
                break
            a = nxt

    def _main_heaps(self, top: int, top_size: int) -> list[tuple[int, int]]:
        sbrk = self._par("sbrk_base")
        if not sbrk or not top:
            return []  # malloc never ran, or the main heap is not where brk was
        first = ((sbrk + CHUNK_HDR + ALIGN - 1) & ~(ALIGN - 1)) - CHUNK_HDR
        end = top + top_size
        if not first <= top:
            self.warnings.append(f"main arena: top chunk {top:#x} lies below the sbrk heap at "
                                 f"{sbrk:#x} (a non-contiguous main arena): its heap is not walked")
            return []
        return [(first, end)]

    def _thread_heaps(self, arena: int, top: int, top_size: int) -> list[tuple[int, int]]:
        """The arena's heaps, oldest first: heap_info chain from its top's."""
        heaps = []
        h = top & ~(self.heap_max - 1) if top else 0
        seen = set()
        while h and h not in seen and len(seen) < 4096:
            seen.add(h)
            ar = self.words.u64(h)
            size = self.words.u64(h + 16)
            if ar != arena or size is None:
                self.findings.append(Finding(
                    "bin-link", None, f"arena {arena:#x}: heap_info at {h:#x} names arena "
                    f"{ar if ar is not None else 0:#x}: its chain of heaps ends here", arena=arena, value=ar))
                break
            start = h + self.layout.heap_info_size
            if start == arena:  # the arena's first heap holds the malloc_state too
                start += self.layout.state["sizeof"]
            start = ((start + CHUNK_HDR + ALIGN - 1) & ~(ALIGN - 1)) - CHUNK_HDR
            end = top + top_size if top and h <= top < h + self.heap_max else h + size
            heaps.append((start, end))
            h = self.words.u64(h + 8) or 0
        return heaps[::-1]

    # ------------------------------------------------------------ walking --

    def _walk_all(self) -> None:
        for ai, arena in enumerate(self.arenas):
            for start, end in arena.heaps:
                self._walk(ai, arena, start, end)
        self._scan_mmapped()

    def _walk(self, ai: int, arena: Arena, start: int, end: int) -> None:
        region = self.words.region(start)
        if region is None:
            self.warnings.append(f"arena {arena.address:#x}: heap {start:#x}-{end:#x} is not in memory")
            return
        arr = region.array
        n8 = len(arr) // 8
        words = arr[:n8 * 8].view("<u8")
        lo = region.start
        limit = min(end, lo + n8 * 8)
        if limit < end:
            self.warnings.append(f"arena {arena.address:#x}: heap {start:#x}-{end:#x} is cut at "
                                 f"{limit:#x} in this memory: chunks beyond are not read")
        starts: list[int] = []
        sizes: list[int] = []
        raws: list[int] = []
        p = start
        top = arena.top
        while p < limit:
            if p == top:
                starts.append(p)
                sizes.append(arena.top_size)
                raws.append(int(words[(p - lo) // 8 + 1]))
                break
            if p + CHUNK_HDR > limit:
                break
            raw = int(words[(p - lo) // 8 + 1])
            size = raw & ~FLAG_BITS
            if size == 0 and not arena.main and raw & PREV_INUSE and p + CHUNK_HDR >= end - MINSIZE:
                break  # the fencepost that ends an older heap of a thread arena
            if size == CHUNK_HDR and not arena.main and p + 2 * CHUNK_HDR <= limit \
                    and int(words[(p - lo) // 8 + 3]) & ~FLAG_BITS == 0:
                break  # the fencepost pair (16, then 0) that ends an older heap
            # (a free chunk of a thread arena has lost NON_MAIN_ARENA: glibc sets
            # the head without it when it consolidates; only the main arena's
            # chunks are certain of the bit)
            if size < MINSIZE or size & (ALIGN - 1) or p + size > end or (
                    raw & IS_MMAPPED) or (arena.main and raw & NON_MAIN_ARENA):
                why = _bad_size_reason(raw, size, p, end, arena.main)
                q = self._resync(words, lo, p, limit, top, arena.main)
                extent = (q if q is not None else limit) - p
                more = (f"; the next sane chunk header is at {q:#x}, {q - p} bytes on" if q is not None
                        else "; no sane chunk header follows it: the rest of this heap is not read")
                self.findings.append(Finding(
                    "bad-size", p, f"{_c(p)}: size field {raw:#x} {why}{more}",
                    arena=arena.address, value=raw, detail={"next": q}))
                starts.append(p)
                sizes.append(extent)
                raws.append(raw)
                self._raw[p] = raw
                if q is None:
                    break
                p = q
                continue
            starts.append(p)
            sizes.append(size)
            raws.append(raw)
            p += size
        if not starts:
            return
        self._starts.append(np.array(starts, np.uint64))
        self._sizes.append(np.array(sizes, np.uint64))
        raw_arr = np.array(raws, np.uint64)
        self._states.append(raw_arr)  # raw sizes for now: classified in _index
        self._arena_of.append(np.full(len(starts), ai, np.int32))

    def _resync(self, words: np.ndarray, lo: int, bad: int, limit: int, top: int,
                main: bool) -> int | None:
        """The first 16-aligned address after the bad chunk at which a chain
        of sane sizes begins that reaches the top (or the heap's end), or
        runs _RESYNC_CHAIN chunks; None when there is none."""
        end = top if top and bad < top <= limit else limit
        q = bad + ALIGN
        tries = 0
        while q < end and tries < _RESYNC_CANDIDATES:
            tries += 1
            p, n = q, 0
            while p < end and n < _RESYNC_CHAIN:
                raw = int(words[(p - lo) // 8 + 1])
                size = raw & ~FLAG_BITS
                if size < MINSIZE or size & (ALIGN - 1) or p + size > end or raw & IS_MMAPPED \
                        or (main and raw & NON_MAIN_ARENA):
                    break
                p += size
                n += 1
            if p == end or n >= _RESYNC_CHAIN:
                return q
            q += ALIGN
        return None

    def _scan_mmapped(self) -> None:
        """Chunks of their own mmap: at the start of a page of an anonymous
        writable mapping that is no arena's heap and no thread's stack,
        prev_size 0 and a size with IS_MMAPPED, a whole number of pages
        that fits the mapping (adjacent ones are one mapping in a core)."""
        if self._counted_mmaps:
            try:
                if not self._par("n_mmaps", 4):
                    return
            except GlibcError:
                return
        heaps = [(s & ~(PAGE - 1), e) for a in self.arenas for s, e in a.heaps]
        heaps += [(a.address & ~(self.heap_max - 1), a.address) for a in self.arenas if not a.main]
        skip = heaps + self._stacks
        starts, sizes = [], []
        for r in self.words.regions:
            if not r.writable or (r.path and not r.path.startswith("[anon")):
                continue
            if any(s < r.end and r.start < e for s, e in skip):
                continue
            try:
                arr = r.array
            except InputError:
                continue
            npages = len(arr) // PAGE
            if not npages:
                continue
            w = arr[:npages * PAGE].view("<u8").reshape(npages, PAGE // 8)
            prev, size = w[:, 0], w[:, 1]
            cand = np.flatnonzero((prev == 0) & ((size & np.uint64(FLAG_BITS)) == IS_MMAPPED)
                                  & ((size & np.uint64(PAGE - 1)) == IS_MMAPPED) & (size > PAGE))
            page = -1
            for k in cand.tolist():
                if k < page:
                    continue
                sz = int(size[k]) & ~FLAG_BITS
                if r.start + k * PAGE + sz > r.end:
                    continue
                starts.append(r.start + k * PAGE)
                sizes.append(sz)
                page = k + sz // PAGE
        if starts:
            self._starts.append(np.array(starts, np.uint64))
            self._sizes.append(np.array(sizes, np.uint64))
            self._states.append(np.full(len(starts), IS_MMAPPED | 0, np.uint64))
            self._arena_of.append(np.full(len(starts), -1, np.int32))
        try:
            n = self._par("n_mmaps", 4)
            total = self._par("mmapped_mem")
        except GlibcError:
            return
        if (n, total) != (len(starts), sum(sizes)):
            self.warnings.append(f"mp_ counts {n} mmapped chunks of {total} bytes; {len(starts)} of "
                                 f"{sum(sizes)} bytes were found in the core")

    # ------------------------------------------------------------ classify --

    def _index(self) -> None:
        if self._starts:
            start = np.concatenate(self._starts)
            size = np.concatenate(self._sizes)
            raw = np.concatenate(self._states)
            arena = np.concatenate(self._arena_of)
        else:
            start = size = raw = np.zeros(0, np.uint64)
            arena = np.zeros(0, np.int32)
        order = np.argsort(start, kind="stable")
        self.start, self.size, raw, self.arena_ix = start[order], size[order], raw[order], arena[order]
        n = len(self.start)
        # in use: the next chunk's PREV_INUSE bit (the next in the same heap)
        state = np.full(n, S["inuse"], np.uint8)
        nxt_raw = np.zeros(n, np.uint64)
        if n > 1:
            nxt_raw[:-1] = raw[1:]
        contiguous = np.zeros(n, bool)
        if n > 1:
            contiguous[:-1] = (self.start[:-1] + self.size[:-1]) == self.start[1:]
        prev_free = contiguous & ((nxt_raw & np.uint64(PREV_INUSE)) == 0)
        state[prev_free] = S["free"]
        state[self.arena_ix < 0] = S["mmapped"]
        for a in self.arenas:
            if a.top:
                i = self._find(a.top)
                if i >= 0 and int(self.start[i]) == a.top:
                    state[i] = S["top"]
        for p in self._raw:
            i = self._find(p)
            state[i] = S["damaged"]
        self.state = state
        self.bin = np.full(n, -1, np.int16)
        self.thread = np.zeros(n, np.int64)
        self.raw = raw

    def _find(self, addr: int) -> int:
        if not 0 <= addr < 1 << 64:
            return -1
        return int(np.searchsorted(self.start, np.uint64(addr), side="right")) - 1

    def _chunk_index(self, addr: int) -> int:
        """The index of the chunk that starts at addr, -1 if none does."""
        i = self._find(addr)
        return i if i >= 0 and int(self.start[i]) == addr else -1

    def _classify(self) -> None:
        lay = self.layout
        for ai, a in enumerate(self.arenas):
            self._fastbins(a)
            self._bins(a)
        for tid, tc in sorted(self.tcaches.items()):
            self._tcache(tid, tc)
        if lay.tcache_got is None:
            self.warnings.append("libc's tcache TLS slot is unknown: chunks in a tcache are found by "
                                 "their key, without their thread or order")
        self._orphans()
        self._prev_sizes()
        self._top_sizes()
        free = np.flatnonzero(self.state == S["free"])
        if len(free) > 20:
            self.findings.append(Finding(
                "not-a-chunk", None, f"{len(free)} chunks are free by the next chunk's PREV_INUSE bit "
                f"but on no bin; the first 20 follow"))
        for i in free.tolist()[:20]:
            p = int(self.start[i])
            self.findings.append(Finding(
                "not-a-chunk", p, f"{_c(p)} ({int(self.size[i])} bytes) is free by the next "
                f"chunk's PREV_INUSE bit but on no bin: a bin link or a size was damaged",
                arena=self._arena_addr(i)))

    def _arena_addr(self, i: int) -> int | None:
        ai = int(self.arena_ix[i])
        return self.arenas[ai].address if ai >= 0 else None

    def _mark(self, p: int, state: str, index: int, *, arena: Arena, what: str,
              thread: int | None = None) -> bool:
        i = self._chunk_index(p)
        if i < 0:
            inside = self._find(p)
            where = (f"inside chunk {int(self.start[inside]):#x}" if inside >= 0
                     and p < int(self.start[inside] + self.size[inside]) else "in no chunk")
            self.findings.append(Finding("not-a-chunk", p, f"{what} links to {p:#x}, which is not "
                                         f"the start of a chunk ({where})", arena=arena.address, value=p))
            return False
        if self.state[i] in (S["tcache"], S["fastbin"], S["unsorted"], S["smallbin"], S["largebin"]):
            self.findings.append(Finding(
                "list-loop", p, f"{_c(p)} is on two free lists: {what} and "
                f"{bin_name(STATES[self.state[i]], int(self.bin[i]), int(self.size[i]))} "
                f"(freed twice)", arena=arena.address))
            return False
        if self.state[i] == S["damaged"]:
            return False
        self.state[i] = S[state]
        self.bin[i] = index
        if thread is not None:
            self.thread[i] = thread
        return True

    def _fastbins(self, a: Arena) -> None:
        base = a.address + self.layout.state["fastbinsY"]
        for idx in range(NFASTBINS):
            slot = base + idx * 8
            p = self.words.u64(slot) or 0
            name = f"arena {a.address:#x} fastbin {idx}"
            steps = 0
            while p and steps < MAX_LIST:
                steps += 1
                if p & (ALIGN - 1):
                    self.findings.append(Finding(
                        "fastbin-next", p, f"{name}: malloc(): unaligned fastbin chunk detected - "
                        f"{p:#x}", arena=a.address, value=p))
                    break
                if not self._mark(p, "fastbin", idx, arena=a, what=name):
                    break
                size = (self.words.u64(p + SIZE_SZ) or 0) & ~FLAG_BITS
                if fastbin_index(size) != idx:
                    self.findings.append(Finding(
                        "bad-size", p, f"{name}: {_c(p)} has size {size:#x}, not the "
                        f"{(idx + 2) * ALIGN} bytes of its bin (malloc(): memory corruption (fast))",
                        arena=a.address, value=size))
                stored = self.words.u64(p + CHUNK_HDR) or 0
                p = demangle(p + CHUNK_HDR, stored) if self.layout.safe_linking else stored
            if steps >= MAX_LIST:
                self.findings.append(Finding("list-loop", None, f"{name} loops", arena=a.address))

    def _bins(self, a: Arena) -> None:
        base = a.address + self.layout.state["bins"]
        for b in range(1, NBINS - 1):
            head = base + (b - 1) * 16 - CHUNK_HDR  # bin_at(b): a fake chunk whose fd/bk are the bin
            state = "unsorted" if b == 1 else "smallbin" if b < NSMALLBINS else "largebin"
            name = bin_name(state, b, 0)
            name = f"arena {a.address:#x} {name}"
            prev, p = head, self.words.u64(head + CHUNK_HDR)
            if not p:
                continue  # never initialised (malloc never ran in this arena)
            steps = 0
            while p is not None and p != head and steps < MAX_LIST:
                steps += 1
                bk = self.words.u64(p + CHUNK_HDR + 8)
                if not self._mark(p, state, b, arena=a, what=name):
                    break
                if bk != prev:
                    self.findings.append(Finding(
                        "bin-link", p, f"{name}: {_c(p)}: its bk is {bk or 0:#x}, not the chunk "
                        f"before it {prev:#x} (malloc(): corrupted double-linked list)",
                        arena=a.address, value=bk))
                size = (self.words.u64(p + SIZE_SZ) or 0) & ~FLAG_BITS
                if b > 1 and bin_index(size) != b:
                    self.findings.append(Finding(
                        "bad-size", p, f"{name}: {_c(p)} has size {size:#x}, which belongs in "
                        f"bin {bin_index(size)}", arena=a.address, value=size))
                prev, p = p, self.words.u64(p + CHUNK_HDR)
            if steps >= MAX_LIST:
                self.findings.append(Finding("list-loop", None, f"{name} loops", arena=a.address))

    def _tcache(self, tid: int, tc: int) -> None:
        lay = self.layout
        cs = lay.tcache_count_size
        raw = self.words.read(tc, lay.tcache_entries + TCACHE_MAX_BINS * 8)
        if raw is None:
            self.warnings.append(f"thread {tid}: its tcache at {tc:#x} is not in memory")
            return
        counts = np.frombuffer(raw[:TCACHE_MAX_BINS * cs], "<u2" if cs == 2 else "u1")
        entries = np.frombuffer(raw[lay.tcache_entries:], "<u8")
        for idx in range(TCACHE_MAX_BINS):
            e = int(entries[idx])
            want = int(counts[idx])
            name = f"thread {tid}'s tcache bin {idx} ({(idx + 2) * ALIGN}-byte chunks)"
            n = 0
            src = None  # the chunk whose next pointer gave e (None: the bin's head)
            while e and n < MAX_LIST:
                chunk = e - CHUNK_HDR
                if e & (ALIGN - 1) or self._chunk_index(chunk) < 0:
                    self._bad_tcache_next(tid, idx, name, e, src)
                    break
                i = self._chunk_index(chunk)
                size = int(self.size[i])
                a = self.arenas[int(self.arena_ix[i])] if self.arena_ix[i] >= 0 else None
                if a is None or not self._mark(chunk, "tcache", idx, arena=a, what=name, thread=tid):
                    break
                n += 1
                if tcache_index(size) != idx:
                    self.findings.append(Finding(
                        "bad-size", chunk, f"{name}: {_c(chunk)} has size {size:#x}, not the "
                        f"{(idx + 2) * ALIGN} bytes of its bin", arena=a.address, value=size))
                stored = self.words.u64(e) or 0
                src = chunk
                e = demangle(e, stored) if lay.safe_linking else stored
            if n != want and not any(f.kind == "tcache-next" and f.detail.get("bin") == idx
                                     and f.detail.get("thread") == tid for f in self.findings):
                self.findings.append(Finding(
                    "tcache-count", None, f"{name}: counts {want} chunks, its list holds {n}",
                    detail={"thread": tid, "bin": idx}))

    def _bad_tcache_next(self, tid: int, idx: int, name: str, e: int, src: int | None) -> None:
        """A tcache link that is no chunk: say where it came from - the
        chunk whose next pointer holds it (a write after free), or for the
        bin's head, the chunk last taken from it (its first word still holds
        the mangled pointer malloc followed)."""
        if src is None:
            src = self._mangled_source(e)
            how = (f"; it is the next pointer left in {_c(src)}, now in use, the last one "
                   f"malloc took from this bin: that chunk was written after it was freed" if src is not None
                   else "")
            where = "starts at"
        else:
            how = f"; it is the next pointer of {_c(src)}, written after that chunk was freed"
            where = f"links {_c(src)} to"
        unaligned = " (malloc(): unaligned tcache chunk detected)" if e & (ALIGN - 1) else ""
        self.findings.append(Finding(
            "tcache-next", src, f"{name} {where} {e:#x}, which is not a chunk{unaligned}{how}",
            value=e, detail={"thread": tid, "bin": idx, "target": e}))

    def _mangled_source(self, e: int) -> int | None:
        """The in-use chunk whose first user word demangles (or, without
        safe-linking, is) e: vectorised over every chunk."""
        mask = self.state == S["inuse"]
        idx = np.flatnonzero(mask)
        if not len(idx):
            return None
        users = self.start[idx] + np.uint64(CHUNK_HDR)
        firsts = self.words.gather(users)
        got = (users >> np.uint64(12)) ^ firsts if self.layout.safe_linking else firsts
        hit = np.flatnonzero(got == np.uint64(e))
        return int(self.start[idx[hit[0]]]) if len(hit) == 1 else None

    def _orphans(self) -> None:
        """Chunks freed into a tcache (their key word holds tcache_key) that
        no tcache list reaches: lost when a list was broken - or, with the
        tcaches unknown, simply in a tcache."""
        if self.tcache_key is None:
            return
        cand = np.flatnonzero((self.state == S["inuse"]) & (self.size <= np.uint64(1040)))
        if not len(cand):
            return
        keys = self.words.gather(self.start[cand] + np.uint64(CHUNK_HDR + 8))
        hit = cand[keys == np.uint64(self.tcache_key)]
        for i in hit.tolist():
            p = int(self.start[i])
            self.state[i] = S["tcache"]
            self.bin[i] = tcache_index(int(self.size[i]))
            if self.layout.tcache_got is not None and self.tcaches:
                self.findings.append(Finding(
                    "tcache-orphan", p, f"{_c(p)} ({int(self.size[i])} bytes) was freed into a "
                    f"tcache (its key is set) but no tcache list reaches it: the list was broken "
                    f"after it", arena=self._arena_addr(i)))

    def _prev_sizes(self) -> None:
        """A free chunk on a bin (not a tcache or fastbin) is followed by a
        chunk whose prev_size is its size and whose PREV_INUSE is clear."""
        binned = np.flatnonzero(np.isin(self.state, [S["unsorted"], S["smallbin"], S["largebin"]]))
        for i in binned.tolist():
            if i + 1 >= len(self.start):
                continue
            p, size = int(self.start[i]), int(self.size[i])
            q = int(self.start[i + 1])
            if p + size != q:
                continue
            prev_size = self.words.u64(q) or 0
            if prev_size != size:
                self.findings.append(Finding(
                    "prev-size", q, f"{_c(q)}: prev_size {prev_size:#x} but the free chunk "
                    f"before it, {p:#x}, is {size:#x} bytes (corrupted size vs. prev_size)",
                    arena=self._arena_addr(i), value=prev_size))
            if int(self.raw[i + 1]) & PREV_INUSE:
                self.findings.append(Finding(
                    "prev-size", q, f"{_c(q)}: PREV_INUSE is set but the chunk before it, "
                    f"{p:#x}, is free on {bin_name(STATES[self.state[i]], int(self.bin[i]), size)}",
                    arena=self._arena_addr(i)))

    def _top_sizes(self) -> None:
        for a in self.arenas:
            if not a.top or not a.heaps:
                continue
            end = a.heaps[-1][1]
            region = self.words.region(a.top)
            limit = region.end if region is not None else end
            if a.top + a.top_size > limit or a.top_size < MINSIZE:
                self.findings.append(Finding(
                    "top-size", a.top, f"arena {a.address:#x}: top chunk {a.top:#x} has size "
                    f"{a.top_size:#x}, past its mapping's end {limit:#x} (corrupted top size)",
                    arena=a.address, value=a.top_size))

    # ------------------------------------------------------------ answers --

    def __len__(self) -> int:
        return len(self.start)

    def chunk(self, i: int) -> Chunk:
        ai = int(self.arena_ix[i])
        b = int(self.bin[i])
        p = int(self.start[i])
        return Chunk(start=p, size=int(self.size[i]), state=STATES[int(self.state[i])],
                     arena=self.arenas[ai] if ai >= 0 else None, bin=b if b >= 0 else None,
                     thread=int(self.thread[i]) or None, raw_size=self._raw.get(p))

    def chunk_at(self, addr: int) -> Chunk | None:
        """The chunk whose bytes [start, start + size) hold addr, or None."""
        i = self._find(addr)
        if i >= 0 and addr < int(self.start[i] + self.size[i]):
            return self.chunk(i)
        return None

    def chunks(self, state: str | None = None) -> list[Chunk]:
        idx = range(len(self.start)) if state is None else np.flatnonzero(self.state == S[state]).tolist()
        return [self.chunk(i) for i in idx]

    def totals(self) -> dict[str, dict[str, int]]:
        """{state: {"chunks": n, "bytes": chunk bytes}} for every state present."""
        out = {}
        for name, code in S.items():
            sel = self.state == code
            n = int(sel.sum())
            if n:
                out[name] = {"chunks": n, "bytes": int(self.size[sel].sum())}
        return out

    def in_use(self) -> np.ndarray:
        """The chunks the program holds: in use in an arena, or mmapped."""
        return np.isin(self.state, [S["inuse"], S["mmapped"]])

    def usable(self, sel: np.ndarray) -> np.ndarray:
        """malloc_usable_size of the chunks selected."""
        sizes = self.size[sel].astype(np.int64)
        mm = self.state[sel] == S["mmapped"]
        return np.where(mm, sizes - CHUNK_HDR, sizes - SIZE_SZ)

    def by_size(self, states: tuple[str, ...] = ("inuse", "mmapped")) -> list[tuple[int, int, int]]:
        """[(chunk size, chunks, bytes)] of the chunks in these states, most bytes first."""
        sel = np.isin(self.state, [S[s] for s in states])
        sizes = self.size[sel]
        if not len(sizes):
            return []
        uniq, counts = np.unique(sizes, return_counts=True)
        out = [(int(s), int(c), int(s) * int(c)) for s, c in zip(uniq.tolist(), counts.tolist())]
        out.sort(key=lambda t: (-t[2], t[0]))
        return out

    def arena_of(self, addr: int) -> Arena | None:
        return next((a for a in self.arenas if a.address == addr), None)

    @property
    def abort_message(self) -> str | None:
        """glibc's last fatal message (``__abort_msg``: "free(): invalid
        pointer" ...), None when it wrote none."""
        if self.layout.abort_msg is None:
            return None
        buf = self.words.u64(self.layout.libc_base + self.layout.abort_msg)
        if not buf:
            return None
        size = self.words.u32(buf)
        if size is None or not 4 < size <= 1 << 16:
            return None
        raw = self.words.read(buf + 4, min(size - 4, 4096))
        if raw is None:
            return None
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip() or None


def _bad_size_reason(raw: int, size: int, p: int, end: int, main: bool) -> str:
    if size < MINSIZE:
        return f"is below the {MINSIZE}-byte minimum"
    if size & (ALIGN - 1):
        return f"is not a multiple of {ALIGN}"
    if p + size > end:
        return f"runs past the heap's end {end:#x}"
    if raw & IS_MMAPPED:
        return "has IS_MMAPPED set inside an arena's heap"
    return "has NON_MAIN_ARENA set in the main arena"



__all__ = [
    "STATES",
    "Arena",
    "Chunk",
    "Finding",
    "GlibcHeap",
    "bin_index",
    "demangle",
    "fastbin_index",
    "tcache_index",
]
