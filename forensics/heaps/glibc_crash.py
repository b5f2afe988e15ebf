"""What a crash inside glibc's malloc family means for its heap: which call
it was in, glibc's own message, the chunk its check is about, and a
sentence that says it (docs/json.md, "Without libtag": crash.malloc)."""

from __future__ import annotations

from dataclasses import dataclass

from forensics.reader.dump import Dump
from forensics.reader.glibc_walk import Chunk, GlibcHeap
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

@dataclass(frozen=True)
class MallocCrash:
    call: str | None  # the malloc-family function the program called ("free")
    glibc_message: str | None  # glibc's fatal message (__abort_msg)
    chunk: Chunk | None  # the chunk its check is about, where it can be named
    summary: str  # one sentence for people


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


def malloc_explanation(dump: Dump, thread, frames: list[Frame]) -> MallocCrash | None:
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
    return MallocCrash(call, msg, chunk, text)


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
    lo, hi = thread.regs[dump.arch.sp], steps[k].cfa
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


__all__ = ["ALLOC_ENTRIES", "MallocCrash", "malloc_explanation"]
