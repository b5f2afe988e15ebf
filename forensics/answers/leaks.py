"""Leaks: a conservative reachability scan of the live heap from the roots.

    scan = find_leaks(dump)             # LeakScan, computed once per Dump
    scan.kind_of(addr)                  # "reachable" | "possible" | "indirect" | "definite" | None
    scan.how_reached(addr)              # [Step]: the root, then every block on the way
    scan.roots_of(addr)                 # every root word / register pointing straight at it
    scan.groups()                       # [LeakGroup] by (kind, allocation stack)
    leaks_doc(dump)                     # inspect's "leaks": [LeakGroupDoc] (docs/json.md)

Roots (docs/leaks.md says why each, and what is left out):

- registers: the x86_64 general registers of every live thread, as values -
  from libtag's thread records (saved by each thread's own signal handler just
  before the snapshot's fork) for a snapshot, from the core's NT_PRSTATUS notes
  for a crash core (there the records are from an older snapshot, so stale);
- stacks: every live thread's stack from its stack pointer to the end of its
  stack mapping (for a thread made by pthread that end holds its descriptor
  and its static TLS);
- globals: every module's writable data (a writable file mapping) and .bss (the
  anonymous writable mapping right after the module,
  forensics.reader.memory.module_of_data), and shared memory (SysV, POSIX,
  memfd, MAP_SHARED anonymous) and files mapped for writing (ROOT_MAPPINGS),
  unless it holds tagged blocks (then it is the brk heap, not .bss) - but not
  libtag's own (it references no block of the program's; in a snapshot child
  its core writer's buffers hold copies of the threads' registers);
- TLS: for a thread whose thread pointer (fs_base) lies outside its stack
  mapping - the main thread, whose static TLS ld.so allocates - the static TLS
  block below fs_base (its lowest address from the DTV), the thread
  descriptor above it, and the DTV array itself.

libtag's own per-thread state in every thread (struct tag_thread_state, a
mapping of libtag's found through one TLS pointer: shadow stack, caches, the
last 64 allocations for the overflow sweep) lies inside these ranges and is
cut out of them.

The words themselves come from the pointer edge index (forensics.reader.pointers,
cached beside the core): every aligned word of writable memory, libtag's own
left out, that points into a tagged block.  Here they are split by where the
word lies: in a root range, in the payload of a live block (an edge of the heap
graph), or elsewhere (free heap memory, freed blocks in the quarantine, dead
stack below a stack pointer, anonymous mappings that are not roots): ignored.

Classification, as valgrind's memcheck does it (tests/integration/test_leaks.py
compares the two on the same victims):

- reachable: a chain of pointers to block starts leads to it from a root;
- possible: reached from a root only by chains with an interior pointer (a
  word pointing inside the block, not at its start) or through a possible block;
- indirect: not reached, and pointed to by another unreached block;
- definite: not reached, and no other unreached block points to it - or it is
  the lowest-addressed block of a group of unreached blocks that point to each
  other in a cycle with nothing outside pointing in (somebody lost the last
  pointer into that cycle: one definite record owns it, as valgrind's clique
  leader does, so a leaked ring never shows zero definitely-lost bytes).

Vectorised: the graph is numpy arrays; the walk goes breadth-first with one
numpy step per level while the frontier is wide and finishes depth-first in
plain Python when it is narrow (a long linked list would otherwise cost a
numpy step per node).  Each block is visited once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from forensics._np import np

from forensics.answers.documents import LeakAge, LeakGroupDoc
from forensics.answers.shapes import frames_doc, hexaddr
from forensics.heaps import heap_of
from forensics.reader.dump import Dump
from forensics.reader.memory import module_of_data, name_mapping
from forensics.reader.model import Thread
from forensics.reader.pointers import hits

KINDS = ("reachable", "possible", "indirect", "definite")
_UNSET, _REACHABLE, _POSSIBLE, _INDIRECT, _DEFINITE = 0, 1, 2, 3, 4
_KIND_NAME = {_REACHABLE: "reachable", _POSSIBLE: "possible",
              _INDIRECT: "indirect", _DEFINITE: "definite"}

# Below this frontier size the walk continues in plain Python (see above).
_NARROW = 64
# sizeof(struct pthread) on x86_64 glibc 2.3x is 2304 bytes: the descriptor
# (thread pointer self-link, DTV pointer, pthread_setspecific slots ...) lies
# at [fs_base, fs_base + this).
_TCB_BYTES = 0x900
# Register roots are numbered below this: a "via" address under it names a
# register, never a memory word (the NULL page is never mapped).
_REG_VIA_LIMIT = 1 << 12
_NO_PARENT = -1
# Mappings that are no module's globals but whose words are roots all the
# same (forensics.reader.memory.name_mapping's kinds): shared memory, and
# files mapped for writing.
ROOT_MAPPINGS = ("sysv-shm", "posix-shm", "memfd", "shared-anon", "file")


@dataclass(frozen=True)
class RootRange:
    """A range of memory whose words are roots."""

    start: int
    end: int
    kind: str  # "stack" | "global" | "tls"
    thread: int | None = None
    module: str | None = None
    name: str | None = None  # a mapping that is no module's: its name (forensics.reader.memory)

    def describe(self) -> str:
        if self.kind == "stack":
            return f"stack of thread {self.thread}"
        if self.kind == "tls":
            return f"TLS of thread {self.thread}"
        if self.name:
            return self.name
        return f"globals of {os.path.basename(self.module or '') or 'anonymous'}"


@dataclass(frozen=True)
class Root:
    """One root word (or register) that points into a block."""

    kind: str  # "register" | "stack" | "global" | "tls"
    address: int | None  # the word's address; None for a register
    thread: int | None = None
    register: str | None = None
    module: str | None = None
    interior: bool = False

    def json(self) -> dict:
        return {"kind": self.kind, "address": hexaddr(self.address), "thread": self.thread,
                "register": self.register, "module": self.module, "interior": self.interior}


@dataclass(frozen=True)
class Step:
    """One block on the way from a root: the word at ``via`` (in the previous
    block, or the root) points into it."""

    block_start: int
    size: int
    via: int | None  # address of the pointing word; None for a register root
    interior: bool  # the word points inside the block, not at its start


@dataclass(frozen=True)
class Link:
    """One block on a retention path: the word at ``via`` inside it (``via -
    block_start`` bytes in) points into the next block of the path."""

    block_start: int
    size: int
    via: int
    interior: bool  # the word points inside the next block, not at its start


@dataclass(frozen=True)
class Retention:
    """Who keeps a live block alive (LeakScan.retainers)."""

    paths: list[tuple[Root, list[Link]]]  # shortest first: the root, then the blocks after it
    count: int  # roots (words, registers) from which some chain reaches the block
    depth_limited: bool  # the search stopped at max_depth links with blocks left to look at


@dataclass
class LeakGroup:
    kind: str
    stack_id: int
    blocks: int
    bytes: int
    oldest_ms: int  # earliest allocation time (ms since libtag started)
    newest_ms: int
    examples: list[int] = field(default_factory=list)  # block starts, lowest first
    indirect_blocks: int = 0  # definite groups: blocks lost through these
    indirect_bytes: int = 0
    cycle_leaders: int = 0  # definite blocks chosen as the owner of a cycle
    size: int | None = None  # without libtag: the blocks' usable size (they have no stack)


# A leak group's key: the kind above _KIND_SHIFT, then the site - an
# allocation stack id, or for blocks without stacks _BY_SIZE and the usable
# size (glibc's chunks).
_KIND_SHIFT = 48
_BY_SIZE = 1 << 47
_SITE_MASK = (1 << _KIND_SHIFT) - 1


class LeakScan:
    """The classification of every live block of a dump."""

    MAX_EXAMPLES = 8

    def __init__(self, dump: Dump, *, classify: bool = True) -> None:
        """classify=False: the roots only, for ``retainers`` (which follows
        the references into each block it reaches, not the whole graph),
        without the heap graph and the walk that classifies every block."""
        self.dump = dump
        self._starts, self._sizes, self._live = _blocks(dump)
        n = len(self._starts)
        self.contexts = thread_contexts(dump)
        self.root_ranges = root_ranges(dump, self.contexts)
        self._reg_names: list[tuple[int, str]] = []  # via id -> (tid, register)
        self._roots = _merge([(r.start, r.end) for r in self.root_ranges])
        # libtag's own TLS (the last allocations, for its overflow sweep) is
        # not the program's: it lies inside stacks and static TLS, cut it out
        self.excluded = libtag_tls_ranges(dump)
        self._excluded = _merge(self.excluded) if self.excluded else None
        # register values, by target
        rv, rd, ri = self._register_hits()
        order = np.argsort(rd, kind="stable")
        self._regs = (rv[order], rd[order], ri[order])

        self.kind = np.zeros(n, np.int8)
        self.parent = np.full(n, _NO_PARENT, np.int64)
        self.parent_via = np.zeros(n, np.uint64)
        self.parent_int = np.zeros(n, bool)
        self.leader = np.arange(n, dtype=np.int64)
        if not classify:
            return
        edges = dump.edges
        keep = self._live[edges.target] if n else np.zeros(0, bool)
        (self._h_src, self._h_dst, self._h_via, self._h_int), (root_via, root_dst, root_int) = \
            self._split(edges.source[keep], edges.target[keep], edges.interior[keep])
        rv, rd, ri = self._regs
        self._root_via = np.concatenate([root_via, rv])
        self._root_dst = np.concatenate([root_dst, rd])
        self._root_int = np.concatenate([root_int, ri])
        order = np.argsort(self._root_dst, kind="stable")
        self._root_via, self._root_dst, self._root_int = (
            self._root_via[order], self._root_dst[order], self._root_int[order])
        self._walk()

    def _split(self, src: np.ndarray, dst: np.ndarray, interior: np.ndarray):
        """References (word, target block, interior) to live blocks, split
        into the heap graph's - (holder, target, word, interior) of each word
        in the payload of a live block - and the roots' - (word, target,
        interior) of each word in a root range - in their order; the rest
        (words in libtag's TLS, in dead blocks, elsewhere) is no reference."""
        starts, sizes, live = self._starts, self._sizes, self._live
        holder = np.searchsorted(starts, src, side="right").astype(np.int64) - 1
        okh = holder >= 0
        hh = np.where(okh, holder, 0)
        in_block = okh & (src < starts[hh] + sizes[hh]) & live[hh]
        heap = (holder[in_block], dst[in_block], src[in_block], interior[in_block])
        rest = ~in_block
        s2, d2, i2 = src[rest], dst[rest], interior[rest]
        r_lo, r_hi = self._roots
        k = np.searchsorted(r_lo, s2, side="right").astype(np.int64) - 1
        okr = k >= 0
        in_root = okr & (s2 < r_hi[np.where(okr, k, 0)])
        if self._excluded is not None:
            x_lo, x_hi = self._excluded
            kx = np.searchsorted(x_lo, s2, side="right").astype(np.int64) - 1
            okx = kx >= 0
            in_root &= ~(okx & (s2 < x_hi[np.where(okx, kx, 0)]))
        return heap, (s2[in_root], d2[in_root], i2[in_root])

    def _into(self, frontier: np.ndarray):
        """The references to the (live) blocks of frontier, as _split gives
        them, the roots' with the registers' after them: from the pointer
        edges, whose targets are sorted, so only these blocks' are read."""
        edges = self.dump.edges
        sel = _spans(np.searchsorted(edges.target, frontier, side="left"),
                     np.searchsorted(edges.target, frontier, side="right"))
        heap, (root_via, root_dst, root_int) = self._split(edges.source[sel], edges.target[sel],
                                                           edges.interior[sel])
        rv, rd, ri = self._regs
        rs = _spans(np.searchsorted(rd, frontier, side="left"), np.searchsorted(rd, frontier, side="right"))
        return heap, (np.concatenate([root_via, rv[rs]]), np.concatenate([root_dst, rd[rs]]),
                      np.concatenate([root_int, ri[rs]]))

    # ------------------------------------------------------------- roots --

    def _register_hits(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        vals, vias = [], []
        not_data = self.dump.arch.not_data
        for ctx in self.contexts:
            for name, value in (ctx.regs or {}).items():
                if name.split(":")[-1] in not_data:
                    continue  # segment/thread state and code: never a data pointer
                if len(self._reg_names) + 1 >= _REG_VIA_LIMIT:
                    break
                self._reg_names.append((ctx.tid, name))
                vals.append(value & ((1 << 64) - 1))
                vias.append(len(self._reg_names))  # 1-based: 0 stays "no word"
        if not vals or not len(self._starts):
            return np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, bool)
        words = np.array(vals, np.uint64)
        lo = int(self._starts[0])
        hi = int((self._starts + np.maximum(self._sizes, 1)).max())
        pos, j, interior = hits(words, self._starts, self._sizes, lo, hi)
        ok = self._live[j]
        return (np.array(vias, np.uint64)[pos[ok]], j[ok], interior[ok])

    # -------------------------------------------------------------- walk --

    def _walk(self) -> None:
        n = len(self._starts)
        if n == 0:
            return
        live = self._live
        # phase 1: start pointers only, from the roots' start pointers
        exact = ~self._h_int
        g1 = _Graph(n, self._h_src[exact], self._h_dst[exact], self._h_via[exact],
                    np.zeros(int(exact.sum()), bool))
        seeds = ~self._root_int
        visited = np.zeros(n, bool)
        _closure(g1, self._root_dst[seeds], self._root_via[seeds], self._root_int[seeds],
                 visited, self.parent, self.parent_via, self.parent_int)
        self.kind[visited] = _REACHABLE
        # phase 2: any pointer, from every root and from every edge leaving a
        # reachable block (its interior pointers are the new ways in)
        g2 = _Graph(n, self._h_src, self._h_dst, self._h_via, self._h_int)
        out1 = visited[self._h_src] & ~visited[self._h_dst]
        seed_dst = np.concatenate([self._root_dst, self._h_dst[out1]])
        seed_via = np.concatenate([self._root_via, self._h_via[out1]])
        seed_int = np.concatenate([self._root_int, self._h_int[out1]])
        seed_par = np.concatenate([np.full(len(self._root_dst), _NO_PARENT, np.int64),
                                   self._h_src[out1]])
        before = visited.copy()
        _closure(g2, seed_dst, seed_via, seed_int, visited, self.parent, self.parent_via,
                 self.parent_int, seed_parent=seed_par)
        self.kind[visited & ~before] = _POSSIBLE
        # unreached: definite / indirect
        unreached = live & ~visited
        self._classify_unreached(unreached, g2)

    def _classify_unreached(self, unreached: np.ndarray, g: _Graph) -> None:
        if not unreached.any():
            return
        e = unreached[g.src] & unreached[g.dst] & (g.src != g.dst)
        src, dst = g.src[e], g.dst[e]
        n = len(self._starts)
        indeg = np.bincount(dst, minlength=n)
        kind, leader = self.kind, self.leader
        d0 = unreached & (indeg == 0)
        kind[unreached] = _UNSET
        if not len(src):
            kind[unreached] = _DEFINITE
            return
        # CSR of the unreached subgraph, as lists for the depth-first walk
        order = np.argsort(src, kind="stable")
        nodes = np.flatnonzero(unreached)
        local = np.full(n, -1, np.int64)
        local[nodes] = np.arange(len(nodes))
        ls, ld = local[src[order]], local[dst[order]]
        indptr = np.zeros(len(nodes) + 1, np.int64)
        np.cumsum(np.bincount(ls, minlength=len(nodes)), out=indptr[1:])
        ip, ad = indptr.tolist(), ld.tolist()
        state = bytearray(len(nodes))  # 0 unset, 1 indirect, 2 leader
        lead = list(range(len(nodes)))
        # leaders with nothing pointing at them first (order does not change
        # the result: see the module docstring), then the rest by address
        visit = np.concatenate([np.flatnonzero(d0[nodes]), np.flatnonzero(~d0[nodes])]).tolist()
        for b in visit:
            if state[b]:
                continue
            state[b] = 2
            stack = [b]
            while stack:
                x = stack.pop()
                for t in ad[ip[x]:ip[x + 1]]:
                    if t == b:
                        continue
                    s = state[t]
                    if s == 0:
                        state[t] = 1
                        lead[t] = b
                        stack.append(t)
                    elif s == 2:  # an earlier leader: its clique is lost through b
                        state[t] = 1
                        lead[t] = b
        st = np.frombuffer(bytes(state), np.uint8)
        kind[nodes[st == 2]] = _DEFINITE
        kind[nodes[st == 1]] = _INDIRECT
        ld_arr = np.array(lead, np.int64)
        while True:  # follow demoted leaders to the final one
            nxt = ld_arr[ld_arr]
            if np.array_equal(nxt, ld_arr):
                break
            ld_arr = nxt
        leader[nodes] = nodes[ld_arr]
        self._cycle = d0  # leaders not in d0 own a cycle

    # ----------------------------------------------------------- answers --

    def _index_of(self, addr: int) -> int:
        i = int(np.searchsorted(self._starts, np.uint64(addr), side="right")) - 1
        if i < 0 or not addr < int(self._starts[i]) + max(int(self._sizes[i]), 1):
            return -1
        return i

    def kind_of(self, addr: int) -> str | None:
        """The kind of the live block holding addr; None if no live block does."""
        i = self._index_of(addr)
        if i < 0 or not self._live[i]:
            return None
        return _KIND_NAME.get(int(self.kind[i]))

    def describe_via(self, via: int) -> Root:
        if via < _REG_VIA_LIMIT:
            tid, reg = self._reg_names[via - 1]
            return Root("register", None, thread=tid, register=reg)
        for r in self.root_ranges:
            if r.start <= via < r.end:
                return Root(r.kind, via, thread=r.thread, module=r.module)
        return Root("unknown", via)

    def roots_of(self, addr: int) -> list[Root]:
        """Every root word or register that points straight into the block at addr."""
        i = self._index_of(addr)
        if i < 0:
            return []
        lo = int(np.searchsorted(self._root_dst, i, side="left"))
        hi = int(np.searchsorted(self._root_dst, i, side="right"))
        out = []
        for via, inner in zip(self._root_via[lo:hi].tolist(), self._root_int[lo:hi].tolist()):
            r = self.describe_via(int(via))
            out.append(Root(r.kind, r.address, r.thread, r.register, r.module, bool(inner)))
        return out

    def how_reached(self, addr: int) -> tuple[Root, list[Step]] | None:
        """How the block at addr is reached: the root, then each block from the
        one the root points into down to this one.  None if it is not reached."""
        i = self._index_of(addr)
        if i < 0 or int(self.kind[i]) not in (_REACHABLE, _POSSIBLE):
            return None
        steps: list[Step] = []
        seen = set()
        while i != _NO_PARENT and i not in seen:
            seen.add(i)
            via = int(self.parent_via[i])
            steps.append(Step(int(self._starts[i]), int(self._sizes[i]),
                              None if via < _REG_VIA_LIMIT else via, bool(self.parent_int[i])))
            last_via = via
            i = int(self.parent[i])
        steps.reverse()
        root = self.describe_via(last_via)
        return Root(root.kind, root.address, root.thread, root.register, root.module,
                    steps[0].interior), steps

    def retainers(self, addr: int, *, limit: int = 10, max_depth: int = 256,
                  skip_module=None) -> Retention | None:
        """The shortest chains of references from a root to the live block at
        addr (None: no live block holds addr): a breadth-first search
        backwards from the block over the heap graph of live blocks, one
        numpy step per level, each block visited once.  A block's words that
        point into itself are never a link (the block is visited first).
        Up to limit paths, from distinct roots, shortest first (then
        globals, stacks, TLS, registers, by address); ``count`` says how
        many roots reach it in all (within max_depth links).  skip_module:
        a predicate on a module's path whose globals are not roots here
        (without libtag, glibc's arenas point at the top chunk)."""
        i = self._index_of(addr)
        if i < 0 or not self._live[i]:
            return None
        n = len(self._starts)
        visited = np.zeros(n, bool)
        visited[i] = True
        nxt = np.full(n, _NO_PARENT, np.int64)
        nxt_via = np.zeros(n, np.uint64)
        nxt_int = np.zeros(n, bool)
        frontier = np.array([i], np.int64)
        skipped = [(r.start, r.end) for r in self.root_ranges
                   if skip_module is not None and r.kind == "global" and r.module and skip_module(r.module)]
        x_lo, x_hi = _merge(skipped) if skipped else (None, None)
        found: list[tuple[int, int, bool]] = []  # (via, block, interior)
        count = 0
        depth = 0
        limited = False
        while len(frontier):
            (h_src, h_dst, h_via, h_int), (r_via, r_dst, r_int) = self._into(frontier)
            if skipped:
                k = np.searchsorted(x_lo, r_via, side="right").astype(np.int64) - 1
                keep = ~((k >= 0) & (r_via < x_hi[np.maximum(k, 0)]))
                r_via, r_dst, r_int = r_via[keep], r_dst[keep], r_int[keep]
            count += len(r_via)
            if len(found) < limit and len(r_via):
                pick = np.lexsort((r_via, self._root_rank(r_via)))[:limit - len(found)]
                found.extend(zip(r_via[pick].tolist(), r_dst[pick].tolist(), r_int[pick].tolist()))
            new = ~visited[h_src]
            if depth == max_depth:
                limited = bool(new.any())
                break
            h_src, h_dst, h_via, h_int = h_src[new], h_dst[new], h_via[new], h_int[new]
            src, first = np.unique(h_src, return_index=True)
            visited[src] = True
            nxt[src] = h_dst[first]
            nxt_via[src] = h_via[first]
            nxt_int[src] = h_int[first]
            frontier = src
            depth += 1
        paths = []
        for via, b, inner in found:
            links = []
            while b != i:
                links.append(Link(int(self._starts[b]), int(self._sizes[b]), int(nxt_via[b]),
                                  bool(nxt_int[b])))
                b = int(nxt[b])
            r = self.describe_via(int(via))
            paths.append((Root(r.kind, r.address, r.thread, r.register, r.module, bool(inner)), links))
        return Retention(paths, count, limited)

    def _root_rank(self, via: np.ndarray) -> np.ndarray:
        """For root words (or register numbers): 0 global, 1 stack, 2 TLS,
        3 register, 4 anything else - the order retention paths of one
        length are listed in."""
        order = {"global": 0, "stack": 1, "tls": 2}
        ranges = sorted(self.root_ranges, key=lambda r: r.start)
        lo = np.array([r.start for r in ranges], np.uint64)
        hi = np.array([r.end for r in ranges], np.uint64)
        kind = np.array([order.get(r.kind, 4) for r in ranges] + [4], np.int64)
        k = np.searchsorted(lo, via, side="right").astype(np.int64) - 1
        kk = np.where(k >= 0, k, len(ranges))
        inside = (k >= 0) & (via < np.append(hi, np.uint64(0))[kk])
        out = np.where(inside, kind[kk], 4)
        return np.where(via < np.uint64(_REG_VIA_LIMIT), 3, out)

    def counts(self) -> dict[str, dict[str, int]]:
        out = {}
        sizes = self._sizes
        for code, name in _KIND_NAME.items():
            m = self._live & (self.kind == code)
            out[name] = {"blocks": int(m.sum()), "bytes": int(sizes[m].sum())}
        return out

    def _sites(self) -> tuple[np.ndarray, np.ndarray]:
        """Each block's group within its kind, and its allocation time: a
        tagged block's allocation stack and time; a block without a tag
        (glibc's chunk: without libtag, or from before libtag was attached)
        its usable size with _BY_SIZE set, and time 0."""
        n = len(self._starts)
        site = self._sizes.astype(np.int64) | _BY_SIZE
        when = np.zeros(n, np.int64)
        if self.dump.libtag and n:
            idx = self.dump.heap.index
            tagged = self.dump.targets[3]
            if tagged.all():
                site = idx["alloc_stack"].astype(np.int64)
                when = idx["alloc_time"].astype(np.int64)
            else:
                pos = np.searchsorted(idx["start"], self._starts[tagged])
                site[tagged] = idx["alloc_stack"][pos].astype(np.int64)
                when[tagged] = idx["alloc_time"][pos].astype(np.int64)
        return site, when

    def groups(self, kinds=("definite", "indirect", "possible")) -> list[LeakGroup]:
        """Lost blocks by (kind, allocation stack): definite first, then most
        bytes.  Without libtag there are no stacks: by (kind, usable size),
        the size in ``stack_id``'s place (LeakGroup.size)."""
        site, when = self._sites()
        codes = [c for c, nm in _KIND_NAME.items() if nm in kinds]
        sel = np.flatnonzero(self._live & np.isin(self.kind, codes))
        if not len(sel):
            return []
        kind = self.kind[sel].astype(np.int64)
        key = kind << _KIND_SHIFT | site[sel]
        keys, inv = np.unique(key, return_inverse=True)
        m = len(keys)
        size = self._sizes[sel].astype(np.float64)
        blocks = np.bincount(inv, minlength=m)
        nbytes = np.bincount(inv, weights=size, minlength=m)
        t = when[sel]
        oldest = np.full(m, np.iinfo(np.int64).max)
        newest = np.full(m, -1)
        np.minimum.at(oldest, inv, t)
        np.maximum.at(newest, inv, t)
        # indirect blocks and bytes charged to their leader's group
        ind_blocks = np.zeros(m, np.int64)
        ind_bytes = np.zeros(m, np.float64)
        cyc = np.zeros(m, np.int64)
        if _DEFINITE in codes:
            ind = np.flatnonzero(self._live & (self.kind == _INDIRECT))
            if len(ind):
                ld = self.leader[ind]
                lkey = (np.int64(_DEFINITE) << _KIND_SHIFT) | site[ld]
                pos = np.searchsorted(keys, lkey)
                ok = (pos < m) & (keys[np.minimum(pos, m - 1)] == lkey)
                np.add.at(ind_blocks, pos[ok], 1)
                np.add.at(ind_bytes, pos[ok], self._sizes[ind[ok]].astype(np.float64))
            cycle = getattr(self, "_cycle", None)
            if cycle is not None:
                lead = (self.kind[sel] == _DEFINITE) & ~cycle[sel]
                np.add.at(cyc, inv[lead], 1)
        out = []
        by_group = sel[np.argsort(inv, kind="stable")]  # by group, lowest address first
        first = np.concatenate([[0], np.cumsum(blocks)[:-1]])
        for j in range(m):
            kcode, sid = int(keys[j] >> _KIND_SHIFT), int(keys[j] & _SITE_MASK)
            by_size = bool(sid & _BY_SIZE)
            sid &= ~_BY_SIZE
            b0 = int(first[j])
            ex = self._starts[by_group[b0:b0 + min(int(blocks[j]), self.MAX_EXAMPLES)]].tolist()
            out.append(LeakGroup(_KIND_NAME[kcode], 0 if by_size else sid, int(blocks[j]), int(nbytes[j]),
                                 int(oldest[j]) if not by_size else 0, int(newest[j]) if not by_size else 0,
                                 ex, int(ind_blocks[j]), int(ind_bytes[j]), int(cyc[j]),
                                 size=sid if by_size else None))
        rank = {"definite": 0, "indirect": 1, "possible": 2, "reachable": 3}
        out.sort(key=lambda g: (rank[g.kind], -g.bytes, g.stack_id, g.size or 0))
        return out


class _Graph:
    """Edges src -> dst (block indexes) in CSR order by src."""

    def __init__(self, n: int, src, dst, via, interior) -> None:
        order = np.argsort(src, kind="stable")
        self.src = src
        self.dst = dst
        self.s_dst = dst[order]
        self.s_via = via[order]
        self.s_int = interior[order]
        self.indptr = np.zeros(n + 1, np.int64)
        if len(src):
            np.cumsum(np.bincount(src, minlength=n), out=self.indptr[1:])
        self._lists = None

    def lists(self):
        if self._lists is None:
            self._lists = (self.indptr.tolist(), self.s_dst.tolist())
        return self._lists


def _closure(g: _Graph, seeds, seed_via, seed_int, visited, parent, parent_via, parent_int,
             seed_parent=None) -> None:
    """Mark everything reachable from seeds along g's edges in visited,
    recording for each newly visited block the edge that found it."""
    if seed_parent is None:
        seed_parent = np.full(len(seeds), _NO_PARENT, np.int64)
    m = ~visited[seeds]
    s, first = np.unique(seeds[m], return_index=True)
    visited[s] = True
    parent[s] = seed_parent[m][first]
    parent_via[s] = seed_via[m][first]
    parent_int[s] = seed_int[m][first]
    frontier = s
    indptr = g.indptr
    while len(frontier) >= _NARROW:
        starts = indptr[frontier]
        counts = indptr[frontier + 1] - starts
        total = int(counts.sum())
        if total == 0:
            return
        base = np.repeat(starts - (np.cumsum(counts) - counts), counts)
        offs = base + np.arange(total)
        t = g.s_dst[offs]
        new = ~visited[t]
        offs, t = offs[new], t[new]
        t, first = np.unique(t, return_index=True)
        src = np.repeat(frontier, counts)[new][first]
        visited[t] = True
        parent[t] = src
        parent_via[t] = g.s_via[offs[first]]
        parent_int[t] = g.s_int[offs[first]]
        frontier = t
    if not len(frontier):
        return
    # narrow: depth-first in plain Python, each block once
    ip, ad = g.lists()
    vis = bytearray(visited.view(np.uint8).tobytes())
    found, found_par, found_edge = [], [], []
    stack = frontier.tolist()
    while stack:
        x = stack.pop()
        for k in range(ip[x], ip[x + 1]):
            t = ad[k]
            if not vis[t]:
                vis[t] = 1
                found.append(t)
                found_par.append(x)
                found_edge.append(k)
                stack.append(t)
    if found:
        f = np.array(found, np.int64)
        e = np.array(found_edge, np.int64)
        visited[f] = True
        parent[f] = np.array(found_par, np.int64)
        parent_via[f] = g.s_via[e]
        parent_int[f] = g.s_int[e]


def _spans(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The indexes of every [lo[k], hi[k]) range, concatenated."""
    counts = (hi - lo).astype(np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    return np.repeat(lo.astype(np.int64) - np.cumsum(counts) + counts, counts) + np.arange(total)


def _merge(ranges: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    out: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    lo = np.array([a for a, _ in out], np.uint64)
    hi = np.array([b for _, b in out], np.uint64)
    return lo, hi


# ------------------------------------------------------------------ roots --


def thread_contexts(dump: Dump) -> list[Thread]:
    """Every live thread at the snapshot, with the registers the scan takes
    as roots: Dump.threads' (Dump.saved_registers_first says whose) and,
    where those are the ones libtag saved, conservatively any other value
    the core's own note of that thread holds (a kernel core's child
    registers, named "core:NAME"); a thread libtag has no record of is not
    the program's (the fork child).  Without libtag: the core's notes,
    every thread."""
    if dump.control is None:  # no libtag: the core's own notes, every thread as it died
        return list(dump.threads)
    notes = dump.core_registers
    out = []
    for t in dump.threads:
        if not t.recorded:
            continue
        regs = dict(t.regs or {})
        extra = notes.get(t.tid)
        if dump.saved_registers_first and t.saved_regs and extra:
            have = set(regs.values())
            for name, v in extra.items():
                if v not in have:
                    regs[f"core:{name}"] = v
        out.append(replace(t, regs=regs))
    return out


def libtag_tls_ranges(dump: Dump) -> list[tuple[int, int]]:
    """[start, end) of libtag's per-thread block in every thread (struct
    tag_thread_state: shadow stacks, caches, the last allocations for the overflow
    sweep): libtag's references, not the program's (Control.libtag_tls_ranges)."""
    return dump.control.libtag_tls_ranges() if dump.control is not None else []


def _blocks(dump: Dump) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, sizes, live mask) of the dump's blocks, sorted: the tagged
    blocks, or without libtag glibc's chunks the program holds (user
    pointers and usable sizes, every one live)."""
    return heap_of(dump).blocks()


def _u64(mem, addr: int) -> int | None:
    try:
        return int.from_bytes(mem.read(addr, 8), "little")
    except Exception:  # noqa: BLE001 - an unreadable word is only "unknown"
        return None


def _tls_ranges(dump: Dump, ctx: Thread, fs: int) -> list[tuple[int, int]]:
    """The static TLS block below fs (from the DTV's lowest static entry), the
    thread descriptor above it, and the DTV array."""
    regions = dump.mem.regions()
    region = next((r for r in regions if fs in r), None)
    if region is None:
        return []
    lo = region.start
    out = []
    found = _dtv(dump, _u64(dump.mem, fs + 8))  # tcbhead_t: tcb, dtv, self
    if found is not None:
        blocks, span = found
        static = blocks[(blocks >= region.start) & (blocks < fs)]
        if len(static):
            lo = int(static.min())
        out.append(span)
    out.append((lo, min(region.end, fs + _TCB_BYTES)))
    return out


def _dtv(dump: Dump, dtv: int | None) -> tuple[np.ndarray, tuple[int, int]] | None:
    """A thread's DTV at *dtv*: (the TLS block address of each module's
    entry, the [start, end) of the array with its counter before it); None
    when there is none or its length is not believable."""
    if not dtv:
        return None
    length = _u64(dump.mem, dtv - 16)  # dtv[-1].counter: slots
    if length is None or not 0 < length < 1 << 16:
        return None
    try:
        raw = dump.mem.read(dtv, 16 * (int(length) + 1))
    except Exception:  # noqa: BLE001 - unreadable: no entries
        raw = b""
    blocks = np.frombuffer(raw[: len(raw) // 16 * 16], "<u8")[0::2][1:]
    return blocks, (dtv - 16, dtv + 16 * (int(length) + 1))


def _tls_ranges_above(dump: Dump, tp: int) -> list[tuple[int, int]]:
    """TLS variant I (aarch64): the thread descriptor below tp (glibc's
    struct pthread, under _TCB_BYTES), the TCB at tp and the static TLS
    blocks above it up to the highest static DTV entry's block (its
    bytes to the end of that page), and the DTV array."""
    regions = dump.mem.regions()
    region = next((r for r in regions if tp in r), None)
    if region is None:
        return []
    hi = min(region.end, tp + 16)
    out = []
    found = _dtv(dump, _u64(dump.mem, tp))  # tcbhead_t: dtv, private
    if found is not None:
        blocks, span = found
        static = blocks[(blocks >= tp) & (blocks < region.end)]
        if len(static):
            hi = min(region.end, (int(static.max()) + 4096) & ~4095)
        out.append(span)
    out.append((max(region.start, tp - _TCB_BYTES), hi))
    return out


def root_ranges(dump: Dump, contexts: list[Thread] | None = None) -> list[RootRange]:
    """Every memory range whose words are roots: live stack frames, module
    globals, static TLS (see the module docstring)."""
    if contexts is None:
        contexts = thread_contexts(dump)
    regions = dump.mem.regions()
    starts = _blocks(dump)[0]
    out: list[RootRange] = []
    stacks = []
    for ctx in contexts:
        live = ctx.live_stack
        if live is not None:
            out.append(RootRange(live[0], live[1], "stack", thread=ctx.tid))
            stacks.append(live)
    arch = dump.arch
    for ctx in contexts:
        fs = (ctx.regs or {}).get(arch.tp)
        if not fs:
            continue
        if any(a <= fs < b for a, b in stacks):
            continue  # a pthread's TLS and descriptor: at the top of its stack
        ranges = _tls_ranges(dump, ctx, fs) if arch.name == "x86_64" else _tls_ranges_above(dump, fs)
        for a, b in ranges:
            out.append(RootRange(a, b, "tls", thread=ctx.tid))
    # libtag's data is no root; linked into the program (libtag.a), its data
    # is the program's and stays one (the edges leave the control block out)
    libtag_module = dump.libtag_module
    for r in regions:
        if not r.writable:
            continue
        module = module_of_data(regions, r)
        what = None
        if module is None and r.path:
            # shared memory and files mapped for writing: roots as a module's
            # globals are (a pointer kept there keeps its block alive)
            what = name_mapping(regions, r)
            if what.kind in ROOT_MAPPINGS:
                module = r.path
        if module is None or module == libtag_module:
            # libtag's own data holds no reference of the program's; in a
            # snapshot child it holds copies of registers (libtag's own core
            # writer's buffers) that would make every block they name reachable
            continue
        if not r.path:
            # .bss is anonymous; the brk heap can sit right after it
            i = int(np.searchsorted(starts, np.uint64(r.start)))
            if i < len(starts) and int(starts[i]) < r.end:
                continue
        if any(a < r.end and r.start < b for a, b in stacks):
            continue
        out.append(RootRange(r.start, r.end, "global", module=module,
                             name=what.name if what is not None else None))
    return out


# ------------------------------------------------------------------ answers --


def find_leaks(dump: Dump) -> LeakScan:
    """The leak scan of a dump (computed once, then kept on it)."""
    scan = getattr(dump, "_leak_scan", None)
    if scan is None:
        scan = LeakScan(dump)
        dump._leak_scan = scan
    return scan


def retention_scan(dump: Dump) -> LeakScan:
    """The leak scan's roots and heap graph, enough for ``retainers``: the
    full scan when one was made, else one without the classifying walk
    (whoowns needs no more; kept on the dump too)."""
    scan = getattr(dump, "_leak_scan", None) or getattr(dump, "_retain_scan", None)
    if scan is None:
        scan = LeakScan(dump, classify=False)
        dump._retain_scan = scan
    return scan


def _common_type(dump: Dump, starts) -> str | None:
    """The C++ class all these blocks hold (by vtable), or None."""
    found = {dump.types.of(a) for a in starts}
    return found.pop() if len(found) == 1 else None


def leaks_doc(dump: Dump) -> list[LeakGroupDoc]:
    """inspect's "leaks" (docs/json.md): one entry per (kind, allocation stack), with
    leak age (allocation times, ms since libtag started, and ages at the
    snapshot) and, for definite groups, what is lost through them."""
    scan = find_leaks(dump)
    groups = scan.groups()
    dump.prefetch([g.stack_id for g in groups if g.size is None])
    # blocks without tags (glibc's) have no stacks and no times: their groups
    # are by usable size
    now = int(dump.control.fields.snapshot_time_ms) if dump.libtag else 0
    out = []
    for g in groups:
        tagged = g.size is None
        definite = g.kind == "definite"
        out.append(LeakGroupDoc(
            kind=g.kind,
            blocks=g.blocks,
            bytes=g.bytes,
            stack=frames_doc(dump.stack(g.stack_id)) if tagged else [],
            stack_id=g.stack_id if tagged else None,
            usable_size=g.size,
            oldest_alloc_ms=g.oldest_ms if tagged else None,
            newest_alloc_ms=g.newest_ms if tagged else None,
            age_ms=LeakAge(oldest=max(0, now - g.oldest_ms), newest=max(0, now - g.newest_ms))
            if now and tagged else None,
            examples=[hexaddr(a) for a in g.examples],
            type=_common_type(dump, g.examples),
            indirect_blocks=g.indirect_blocks if definite else None,
            indirect_bytes=g.indirect_bytes if definite else None,
            cycle_leaders=g.cycle_leaders if definite else None,
        ))
    return out


__all__ = ["KINDS", "LeakGroup", "LeakScan", "Link", "Retention", "Root", "RootRange", "Step", "find_leaks",
           "leaks_doc", "retention_scan", "root_ranges", "thread_contexts"]
