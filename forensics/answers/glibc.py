"""The answers for a core of a process that never ran libtag, from glibc's own
heap (forensics/reader/glibc_walk.py): inspect's document with the heap map,
the corruption found and the crash explained in malloc's terms, and the
chunk that holds an address for whoowns (docs/json.md, "Without libtag").

What a heap without tags cannot say - who allocated or freed a block, when,
from which stack - is said to be unknown in every answer
(``without_libtag``), with how to get it: ``forensics run``.
"""

from __future__ import annotations

from forensics.answers.shapes import frames_json, hexaddr
from forensics.reader.dump import Dump
from forensics.reader.glibc_layout import CHUNK_HDR
from forensics.reader.glibc_walk import STATES, Chunk, Finding, GlibcHeap, S
from forensics.reader.model import Frame

# The malloc family's entry points, as libc's symbols name them -> what the
# program called.
ALLOC_ENTRIES = {
    "malloc": "malloc", "__libc_malloc": "malloc", "__malloc": "malloc",
    "free": "free", "__libc_free": "free", "cfree": "free", "__free": "free",
    "calloc": "calloc", "__libc_calloc": "calloc",
    "realloc": "realloc", "__libc_realloc": "realloc", "reallocarray": "realloc",
    "memalign": "memalign", "__libc_memalign": "memalign", "_mid_memalign": "memalign",
    "aligned_alloc": "aligned_alloc", "posix_memalign": "posix_memalign",
    "__posix_memalign": "posix_memalign", "valloc": "valloc", "__libc_valloc": "valloc",
    "pvalloc": "pvalloc", "__libc_pvalloc": "pvalloc", "malloc_trim": "malloc_trim",
}
# glibc's internals that only run inside one of them
ALLOC_INTERNALS = {"_int_malloc", "_int_free", "_int_realloc", "_int_memalign", "malloc_consolidate",
                   "malloc_printerr", "tcache_get", "tcache_put", "tcache_init", "sysmalloc",
                   "unlink_chunk", "_int_free_merge_chunk", "_int_free_create_chunk",
                   "_int_free_maybe_consolidate", "tcache_double_free_verify"}

UNKNOWN_WITHOUT_LIBTAG = ("no libtag: allocation and free stacks, times and threads are unknown - "
                          "run the program under `forensics run` for them")

WITHOUT_LIBTAG = {
    "unknown": ["allocation stacks", "free stacks", "allocation and free times",
                "allocating and freeing threads"],
    "hint": "run the program under `forensics run` (libtag) to have them",
    "summary": UNKNOWN_WITHOUT_LIBTAG,
}


def chunk_json(c: Chunk, offset: int | None = None) -> dict:
    """A chunk (docs/json.md, "chunk")."""
    arena = c.arena
    return {
        "start": hexaddr(c.start),
        "user": hexaddr(c.user),
        "size": c.size,
        "usable": c.usable,
        "offset": 0 if offset is None else offset,
        "state": c.state,
        "bin": c.bin_name,
        "bin_index": c.bin,
        "tcache_thread": c.thread,
        "arena": hexaddr(arena.address) if arena is not None else None,
        "arena_kind": ("main" if arena.main else "thread") if arena is not None else None,
        "arena_threads": list(arena.threads) if arena is not None else [],
        "size_field": hexaddr(c.raw_size) if c.raw_size is not None else None,
    }


def finding_json(f: Finding) -> dict:
    return {"kind": f.kind, "chunk": hexaddr(f.chunk),
            "user": hexaddr(f.chunk + CHUNK_HDR) if f.chunk is not None else None,
            "arena": hexaddr(f.arena), "value": hexaddr(f.value), "message": f.message}


def chunk_note(c: Chunk, addr: int) -> str:
    """whoowns' note for an address in chunk c."""
    off = addr - c.user
    where = (f"{off} bytes into" if off >= 0 else f"{-off} bytes before the user bytes of")
    state = {"inuse": "a block in use", "tcache": "a free block in a tcache",
             "fastbin": "a free block in a fastbin", "unsorted": "a free block in the unsorted bin",
             "smallbin": "a free block in a small bin", "largebin": "a free block in a large bin",
             "top": "the top chunk (never allocated)", "mmapped": "an mmapped block in use",
             "free": "a free chunk on no list", "damaged": "a chunk whose header is damaged"}[c.state]
    return f"{where} {state} of {c.usable} usable bytes (glibc chunk {c.start:#x}, {c.size} bytes)"


def is_block(c: Chunk | None) -> bool:
    """A chunk that is (or was) a block the program had: not the top."""
    return c is not None and c.state != "top"


# ------------------------------------------------------------------ inspect --


def heap_doc(heap: GlibcHeap, *, top: int) -> dict:
    """The ``glibc`` object of inspect's document."""
    lay = heap.layout
    arenas = []
    for i, a in enumerate(heap.arenas):
        sel = heap.arena_ix == i
        per = {}
        for name, code in S.items():
            m = sel & (heap.state == code)
            if m.any():
                per[name] = {"chunks": int(m.sum()), "bytes": int(heap.size[m].sum())}
        arenas.append({"address": hexaddr(a.address), "kind": "main" if a.main else "thread",
                       "threads": list(a.threads), "top": hexaddr(a.top), "top_size": a.top_size,
                       "system_mem": a.system_mem,
                       "heaps": [{"start": hexaddr(s), "end": hexaddr(e)} for s, e in a.heaps],
                       "chunks": per})
    by_size = heap.by_size(("inuse", "mmapped"))
    by_count = sorted(by_size, key=lambda t: (-t[1], t[0]))
    return {
        "libc": lay.libc_path,
        "build_id": lay.build_id,
        "version": lay.version,
        "layout_from": lay.source,
        "arenas": arenas,
        "chunks": heap.totals(),
        "tcaches": [{"thread": tid, "address": hexaddr(tc)} for tid, tc in sorted(heap.tcaches.items())],
        "top_sizes": {
            "by_bytes": [_size_row(s, n, b) for s, n, b in by_size[:top]],
            "by_count": [_size_row(s, n, b) for s, n, b in by_count[:top]],
        },
        "corruption": [finding_json(f) for f in heap.findings],
        "abort_message": heap.abort_message,
    }


def _size_row(size: int, n: int, nbytes: int) -> dict:
    return {"size": size, "usable": size - 8, "chunks": n, "bytes": nbytes}


def plain_inspect_doc(dump: Dump, *, top: int = 10) -> dict:
    """inspect's document for a core without libtag: the shape of a libtag
    core's (docs/json.md, "inspect") with its blocks from glibc's chunks,
    no anomalies, stacks or counters, and the ``glibc`` heap map."""
    heap = dump.glibc
    inuse = heap.state == S["inuse"]
    mapped = heap.state == S["mmapped"]
    free = _free_mask(heap)
    live = inuse | mapped
    crash = plain_crash_doc(dump)
    threads = [{"tid": t.tid, "sp": hexaddr(t.sp), "stack": frames_json(dump.thread_frames(t))}
               for t in dump.threads]
    return {
        "core": dump.core.path if dump.core is not None else dump.mem.name,
        "process": {"pid": dump.pid, "exe": dump.exe},
        "reason": "crash" if crash is not None else "on-demand",
        "payload": "kept",
        "libtag": False,
        "crash": crash,
        "heap": {
            "live_blocks": int(live.sum()),
            "live_bytes": int(heap.usable(live).sum()),
            "freed_blocks": int(free.sum()),
            "freed_bytes": int(heap.usable(free).sum()),
        },
        "anomalies": [],
        "top_stacks": [],
        "threads": threads,
        "counters": None,
        "glibc": heap_doc(heap, top=top),
        "without_libtag": WITHOUT_LIBTAG,
        "warnings": dump.warnings,
    }


def _free_mask(heap: GlibcHeap):
    import numpy as np

    return np.isin(heap.state, [S[s] for s in ("tcache", "fastbin", "unsorted", "smallbin", "largebin")])


# -------------------------------------------------------------------- crash --

_FATAL = {"SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE", "SIGTRAP", "SIGSYS"}


def plain_crash_doc(dump: Dump) -> dict | None:
    """The crash of a core the kernel wrote for a fatal signal: the signal
    (NT_SIGINFO), the thread that took it (the core's first thread) and its
    stack, and, when it happened inside the malloc family or glibc left a
    fatal message, what it means for the heap.  None for a core without a
    fatal signal (gcore of a running process)."""
    from forensics.answers.inspect import (
        FAULT_CODES,
        SI_CODES,
        SI_KERNEL,
        _crash_summary,
    )
    from forensics.answers.owners import classify, near_note
    from forensics.core.notes import signal_name

    core = dump.core
    si = core.siginfo if core is not None else None
    if si is None or not dump.threads:
        return None
    name = signal_name(si.signo)
    if name not in _FATAL:
        return None
    thread = dump.threads[0]
    code = si.code
    codes = {**SI_CODES, **FAULT_CODES.get(name, {})} if 0 < code != SI_KERNEL else SI_CODES
    code_name = codes.get(code)
    sender = None
    address = source = None
    if si.sender_pid is not None and code <= 0:
        sender = {"pid": si.sender_pid, "uid": si.sender_uid, "self": si.sender_pid == dump.pid}
    elif code > 0 and code != SI_KERNEL and si.addr is not None:
        address = si.addr
        source = "instruction" if name in ("SIGFPE", "SIGILL", "SIGTRAP") else "fault"
    summary = _crash_summary(name, code, code_name, address, source, sender, None, None)
    frames = dump.thread_frames(thread)
    owner = None
    if address is not None:
        where = classify(dump, address)
        owner = {"owner": where.owner, "region": where.region_name,
                 "note": where.note or (near_note(where.near) if where.near else ""), "block": None,
                 "chunk": chunk_json(where.chunk, offset=address - where.chunk.user)
                 if where.chunk is not None else None}
    return {
        "signal": name,
        "address": hexaddr(address),
        "address_source": source,
        "sender": sender,
        "instruction": None,
        "cause": None,
        "summary": summary,
        "thread": thread.tid,
        "time": None,
        "time_ms": None,
        "stack": frames_json(frames),
        "code": code,
        "code_name": code_name,
        "address_owner": owner,
        "malloc": malloc_explanation(dump, thread, frames),
    }


def _alloc_call(frames: list[Frame]) -> tuple[str | None, int | None]:
    """(the malloc-family function the crash is inside, the index of its
    outermost frame), or (None, None)."""
    found = None, None
    for i, f in enumerate(frames):
        fn = (f.function or "").split("(")[0]
        if fn in ALLOC_ENTRIES:
            found = ALLOC_ENTRIES[fn], i
        elif fn in ALLOC_INTERNALS and found[0] is None:
            found = None, i
    return found


def malloc_explanation(dump: Dump, thread, frames: list[Frame]) -> dict | None:
    """What the crash means for the heap: inside which malloc-family call,
    glibc's own message, the chunk its check is about, and a sentence; None
    when the crash has nothing to do with the heap (not inside the malloc
    family, no glibc message and no corruption found)."""
    heap = dump.glibc
    msg = heap.abort_message
    call, outer = _alloc_call(frames)
    if call is None and outer is None and msg is None:
        return None
    call = call or _call_from_message(msg)
    chunk, why = _culprit(dump, heap, msg, thread, frames, outer)
    head = f"the crash is inside glibc's {call}()" if call else "glibc aborted"
    text = head + (f": \"{msg}\"" if msg else "")
    if why:
        text += f" - {why}"
    elif heap.findings:
        text += f" - {heap.findings[0].message}"
    else:
        text += " - no inconsistency was found in the heap's structures"
    return {
        "call": call,
        "glibc_message": msg,
        "chunk": chunk_json(chunk) if chunk is not None else None,
        "summary": text,
    }


def _call_from_message(msg: str | None) -> str | None:
    if not msg:
        return None
    head = msg.split("(", 1)[0].strip()
    return head if head in ALLOC_ENTRIES.values() else None


def _culprit(dump: Dump, heap: GlibcHeap, msg: str | None, thread, frames,
             outer: int | None) -> tuple[Chunk | None, str | None]:
    """The chunk glibc's check is about and why, where it can be named."""
    findings = heap.findings
    text = msg or ""
    if "double free" in text and "tcache" in text:
        cands = [c for c in _frame_pointers(dump, heap, thread, frames, outer) if c.state == "tcache"]
        if len(cands) == 1:
            c = cands[0]
            who = f"thread {c.thread}'s " if c.thread else ""
            return c, (f"block {c.user:#x} was freed twice: it is already in {who}"
                       f"{c.bin_name} (its pointer is in free()'s frames)")
        return None, ("a block was freed twice: glibc found it already in this thread's tcache "
                      f"({len(cands)} tcache blocks are named in free()'s frames)")
    order = {"tcache": ("tcache-next", "tcache-orphan", "tcache-count"),
             "fast": ("fastbin-next", "bad-size"),
             "double-linked": ("bin-link",),
             "prev_size": ("prev-size", "bad-size"),
             "top": ("top-size",),
             "next size": ("bad-size", "prev-size"),
             "corruption": ("bad-size", "prev-size", "bin-link"),
             "size": ("bad-size",)}
    kinds: tuple[str, ...] = ()
    for word, ks in order.items():
        if word in text:
            kinds = ks
            break
    picked = next((f for k in kinds for f in findings if f.kind == k), None) or (
        findings[0] if findings else None)
    if picked is None:
        return None, None
    chunk = heap.chunk_at(picked.chunk) if picked.chunk is not None else None
    why = picked.message
    if picked.kind == "bad-size" and chunk is not None:
        before = heap.chunk_at(picked.chunk - 1)
        if before is not None and before.state == "inuse" and before.end == picked.chunk:
            why += (f"; the block before it, {before.user:#x} ({before.usable} usable bytes, in use), "
                    f"ends at its header: most likely overrun from there")
    return chunk, why


def _frame_pointers(dump: Dump, heap: GlibcHeap, thread, frames: list[Frame],
                    outer: int | None) -> list[Chunk]:
    """The chunks whose user pointer is a word of the crashing thread's
    stack from its stack pointer to the frame of the malloc-family call
    (outer): what that call was working on (saved registers, locals)."""
    if outer is None or thread.regs is None or thread.stack_region is None:
        return []
    steps = dump.unwinder.unwind(thread.regs, stack=(thread.stack_region.start, thread.stack_region.end))
    # the physical frame (unwind step) that holds the outermost malloc-family
    # frame: inlined frames share the step of the physical frame after them
    k = sum(1 for f in frames[:outer] if not f.inlined)
    if k >= len(steps) or steps[k].cfa is None:
        return []
    lo, hi = thread.regs["rsp"], steps[k].cfa
    if not 0 < hi - lo <= 1 << 16:
        return []
    raw = dump.mem.read(lo & ~7, (hi - (lo & ~7)) & ~7)
    seen: dict[int, Chunk] = {}
    for i in range(0, len(raw), 8):
        v = int.from_bytes(raw[i:i + 8], "little")
        c = heap.chunk_at(v)
        if c is not None and v == c.user and c.start not in seen:
            seen[c.start] = c
    return list(seen.values())


__all__ = [
    "STATES",
    "WITHOUT_LIBTAG",
    "chunk_json",
    "chunk_note",
    "finding_json",
    "heap_doc",
    "is_block",
    "plain_crash_doc",
    "plain_inspect_doc",
]


def plain_diff_doc(old: Dump, new: Dump, *, min_bytes: int = 0) -> dict:
    """diff's document for two cores without libtag (docs/json.md, "diff"
    without libtag): growth by size class - glibc's usable size of the
    chunks in use (the program's blocks: in use in an arena, or mmapped) -
    in place of by allocation stack.  In one process (same pid), a chunk at
    the same address with the same usable size in both counts as kept; the
    others are new or gone.  min_bytes keeps the classes whose bytes changed
    by at least that much (either way)."""
    import numpy as np

    (os_, ou), (ns, nu) = old.blocks, new.blocks
    same = old.pid == new.pid and old.pid != 0
    if same:
        kept_old, kept_new = _kept(os_, ou, ns, nu), _kept(ns, nu, os_, ou)
    else:
        kept_old, kept_new = np.zeros(len(os_), bool), np.zeros(len(ns), bool)
    # per usable size, in one pass each: chunks before and after, and the
    # kept, added and gone among them
    sizes = np.union1d(ou, nu)
    io, inn = np.searchsorted(sizes, ou), np.searchsorted(sizes, nu)

    def count(idx, mask=None):
        return np.bincount(idx if mask is None else idx[mask], minlength=len(sizes)).tolist()

    old_n, new_n = count(io), count(inn)
    kept, added, gone = count(inn, kept_new), count(inn, ~kept_new), count(io, ~kept_old)
    rows = []
    for k, s in enumerate(sizes.tolist()):
        oc, nc = old_n[k], new_n[k]
        row = {"usable_size": s, "old_chunks": oc, "new_chunks": nc,
               "old_bytes": oc * s, "new_bytes": nc * s,
               "chunks": nc - oc, "bytes": (nc - oc) * s,
               "kept": kept[k], "added": added[k], "gone": gone[k]}
        if (row["chunks"] or row["added"] or row["gone"]) and abs(row["bytes"]) >= min_bytes:
            rows.append(row)
    rows.sort(key=lambda r: (r["bytes"], r["chunks"], r["added"]), reverse=True)

    def side(d: Dump, us) -> dict:
        return {"core": d.mem.name.removeprefix("core "), "pid": d.pid,
                "chunks": int(len(us)), "bytes": int(us.sum())}

    return {
        "libtag": False,
        "without_libtag": WITHOUT_LIBTAG,
        "old": side(old, ou),
        "new": side(new, nu),
        "same_process": same,
        "new_chunks": int((~kept_new).sum()),
        "gone_chunks": int((~kept_old).sum()),
        "kept_chunks": int(kept_new.sum()),
        "size_classes": rows,
        "warnings": old.warnings + [w for w in new.warnings if w not in old.warnings],
    }


def _kept(starts, sizes, other_starts, other_sizes):
    """Which chunks (sorted starts, usable sizes) the other core has at the
    same address with the same usable size."""
    import numpy as np

    if not len(other_starts) or not len(starts):
        return np.zeros(len(starts), bool)
    pos = np.minimum(np.searchsorted(other_starts, starts), len(other_starts) - 1)
    return (other_starts[pos] == starts) & (other_sizes[pos] == sizes)
