"""glibc's heap rules on fake memory: a main arena, a thread's tcache and a
handful of chunks laid out byte for byte as glibc 2.36 lays them out, then
damaged one way at a time.  forensics.reader.glibc_walk reads it unchanged
(tests/integration/test_glibc_heap.py does the same on real cores)."""

from __future__ import annotations

import struct

import forensics_test_fakes as F
import pytest

from forensics.reader import glibc_layout as G
from forensics.reader import glibc_walk as W
from forensics.reader.symbols import Module

LIBC = 0x7F0000000000  # libc's load bias; its data at LIBC..LIBC+0x3000
FS = 0x7F0000100000  # the thread's fs_base
TID = 77
HEAP = 0x555500000000
KEY = 0x1122334455667788
LAYOUT = G.Layout(
    version="2.36", source="test", main_arena=0x2000, mp=0x1000, tcache_key=0x1800,
    tcache_got=0x1900, arena_got=0x1908, abort_msg=0x1910, state=G.KNOWN_BUILDS[
        "93ac61ec5a8eb1396f9fbd350e3169a558528a40"].state,
    par=G.KNOWN_BUILDS["93ac61ec5a8eb1396f9fbd350e3169a558528a40"].par,
    tcache_count_size=2, tcache_entries=128, heap_info_size=48, safe_linking=True,
    libc_base=LIBC, libc_path="/lib/libc.so.6")
ARENA = LIBC + 0x2000
# the chunks: (offset in the heap, size field)
TC, A, B, GUARD, D, E, TOP = 0x0, 0x290, 0x2C0, 0x2F0, 0x310, 0x410, 0x430
HEAP_LEN = 0x2000


class Image:
    """libc's data, the thread's TLS and the heap, as bytearrays."""

    def __init__(self) -> None:
        self.libc = bytearray(0x3000)
        self.tls = bytearray(0x1000)  # FS - 0x800 .. FS + 0x800
        self.heap = bytearray(HEAP_LEN)
        st, par = LAYOUT.state, LAYOUT.par
        self.q(LIBC + 0x1000 + par["sbrk_base"], HEAP)
        self.q(LIBC + 0x1800, KEY)
        self.q(LIBC + 0x1900, (-0x100) & (2**64 - 1))  # tcache's TP offset
        self.q(LIBC + 0x1908, (-0x108) & (2**64 - 1))  # thread_arena's
        self.q(FS - 0x100, HEAP + TC + 16)
        self.q(FS - 0x108, ARENA)
        self.q(ARENA + st["top"], HEAP + TOP)
        self.q(ARENA + st["next"], ARENA)
        self.q(ARENA + st["system_mem"], HEAP_LEN)
        for b in range(1, G.NBINS):  # empty bins point at themselves
            head = ARENA + st["bins"] + (b - 1) * 16 - 16
            self.q(head + 16, head)
            self.q(head + 24, head)
        unsorted = ARENA + st["bins"] - 16
        self.q(unsorted + 16, HEAP + D)
        self.q(unsorted + 24, HEAP + D)
        for off, size in ((TC, 0x291), (A, 0x31), (B, 0x31), (GUARD, 0x21), (D, 0x101),
                          (E, 0x20), (TOP, (HEAP_LEN - TOP) | 1)):
            self.q(HEAP + off + 8, size)
        self.q(HEAP + E, 0x100)  # E's prev_size: D is free
        self.q(HEAP + D + 16, unsorted)
        self.q(HEAP + D + 24, unsorted)
        # the tcache: bin 1 holds B
        struct.pack_into("<H", self.heap, TC + 16 + 2 * 1, 1)
        self.q(HEAP + TC + 16 + 128 + 8, HEAP + B + 16)
        self.q(HEAP + B + 16, (HEAP + B + 16) >> 12)  # next: NULL, mangled
        self.q(HEAP + B + 24, KEY)

    def q(self, addr: int, value: int) -> None:
        for base, buf in ((LIBC, self.libc), (FS - 0x800, self.tls), (HEAP, self.heap)):
            if base <= addr < base + len(buf):
                struct.pack_into("<Q", buf, addr - base, value)
                return
        raise AssertionError(f"{addr:#x} is in no fake region")

    def heap_of(self) -> W.GlibcHeap:
        mem = F.FakeMemory([(LIBC, self.libc, True, "/lib/libc.so.6"), (FS - 0x800, self.tls, True, None),
                            (HEAP, self.heap, True, None)])
        return W.GlibcHeap(mem, LAYOUT, threads={TID: FS})


def states(heap: W.GlibcHeap) -> list[tuple[int, int, str, int | None]]:
    return [(c.start - HEAP, c.size, c.state, c.bin) for c in heap.chunks()]


def test_every_chunk_is_classified():
    heap = Image().heap_of()
    assert states(heap) == [(TC, 0x290, "inuse", None), (A, 0x30, "inuse", None),
                            (B, 0x30, "tcache", 1), (GUARD, 0x20, "inuse", None),
                            (D, 0x100, "unsorted", 1), (E, 0x20, "inuse", None),
                            (TOP, HEAP_LEN - TOP, "top", None)]
    assert heap.findings == [] and heap.tcaches == {TID: HEAP + TC + 16}
    assert heap.chunk_at(HEAP + B + 20).thread == TID
    assert heap.arenas[0].threads == (TID,)


def test_safe_linking_demangles_with_the_slots_own_address():
    pos, target = 0x555500001010, 0x5555000012C0
    assert W.demangle(pos, (pos >> 12) ^ target) == target
    assert W.demangle(pos, pos >> 12) == 0


def test_bin_indexes_are_glibcs():
    assert (W.tcache_index(0x30), W.fastbin_index(0x20), W.bin_index(0xD0), W.bin_index(0x7E0),
            W.bin_index(0x4000)) == (1, 0, 13, 79, 110 + 4)


def test_a_tcache_next_pointer_written_after_free_is_named():
    img = Image()
    img.q(HEAP + A + 16, 0)  # A is in use...
    # ... B's next (its first user word) is overwritten
    img.q(HEAP + B + 16, 0x4141414141414141)
    heap = img.heap_of()
    (f,) = heap.findings
    want = W.demangle(HEAP + B + 16, 0x4141414141414141)
    assert (f.kind, f.chunk, f.value) == ("tcache-next", HEAP + B, want)


def test_a_broken_bk_is_a_corrupted_double_linked_list():
    img = Image()
    img.q(HEAP + D + 24, HEAP + A)
    (f,) = img.heap_of().findings
    assert (f.kind, f.chunk, f.value) == ("bin-link", HEAP + D, HEAP + A)
    assert "malloc(): corrupted double-linked list" in f.message


def test_an_overwritten_size_is_found_and_the_walk_resumes_after_it():
    img = Image()
    img.q(HEAP + A + 8, 0x4141414141414141)
    heap = img.heap_of()
    bad = [f for f in heap.findings if f.kind == "bad-size"]
    assert [(f.chunk, f.value, f.detail["next"]) for f in bad] == [
        (HEAP + A, 0x4141414141414141, HEAP + B)]
    assert states(heap)[1:3] == [(A, 0x30, "damaged", None), (B, 0x30, "tcache", 1)]


def test_a_wrong_prev_size_after_a_free_chunk():
    img = Image()
    img.q(HEAP + E, 0x90)
    (f,) = img.heap_of().findings
    assert (f.kind, f.chunk, f.value) == ("prev-size", HEAP + E, 0x90)


def test_an_unknown_libc_without_debug_information_is_one_line():
    libc = Module("/nonexistent/libc.so.6", LIBC, LIBC + 0x1000, LIBC, build_id=bytes(range(20)))
    with pytest.raises(G.GlibcError) as err:
        G.find_layout([libc], debug_dirs=())
    hexid = bytes(range(20)).hex()
    assert str(err.value) == (
        f"this libc /nonexistent/libc.so.6, build-id {hexid}, is not a build forensics knows and no "
        f"debug file for it was found: install its debug symbols (Debian: apt-get install libc6-dbg) "
        f"or give --debug-dir DIR holding .build-id/00/...debug")


def test_a_process_without_libc_is_refused():
    exe = Module("/bin/static", 0x400000, 0x500000, 0)
    with pytest.raises(G.GlibcError, match="no libc.so.6 in the core"):
        G.find_layout([exe])
