"""whoowns' rules, driven by fake memory (no process, no core).

GIVEN a fake libtag process (tests/fakes.py) whose globals, stack, blocks,
libtag's data and a shared mapping point at one another
WHEN forensics.answers.owners classifies an address and gathers who points
into its block
THEN the owner, region, note, referrers (roots first, each by address; the
block's own words, dead frames, freed blocks and libtag's data left out)
and the retention path are exactly what docs/json.md, "whoowns", says.
"""

from __future__ import annotations

import forensics_test_fakes as F
import pytest

from forensics.answers import owners
from forensics.answers.documents import to_json
from forensics.errors import NotFoundError
from forensics.reader import abi

PROGRAM_SYMBOLS = dict(data=[(F.PROGRAM, F.GLOBALS, 16, "registry", ".bss"),
                             (F.PROGRAM, F.GLOBALS + 0x40, 8, "cache", ".data")])


def symbols() -> F.FakeSymbolizer:
    return F.FakeSymbolizer(modules=[(F.PROGRAM, F.PROGRAM_TEXT, F.PROGRAM_TEXT + 0x1000)], **PROGRAM_SYMBOLS)


def doc_of(proc: F.FakeProcess, addr: int) -> dict:
    dump = F.dump(proc, symbols())
    return to_json(owners.whoowns_doc(dump, owners.whoowns(dump, addr)))


# ------------------------------------------------------------- the owner --


def test_an_address_inside_a_live_block_is_the_heaps_with_its_offset():
    proc = F.FakeProcess()
    a = proc.block(0x40, size=24, time=5)
    doc = doc_of(proc, a + 4)
    assert (doc["owner"], doc["note"], doc["region"]) == (
        "heap", "4 bytes into a live block of 24 bytes",
        {"name": "heap", "start": hex(F.HEAP), "end": hex(F.HEAP + 0x4000)})
    b = doc["block"]
    assert (b["start"], b["size"], b["offset"], b["state"], b["thread"]) == (hex(a), 24, 4, "live", F.MAIN_TID)
    assert (doc["use_after_free"], doc["libtag"], doc["chunk"], doc["warnings"]) == (None, True, None, [])
    assert "near" not in doc and "thread" not in doc


def test_a_freed_block_written_after_its_free_says_where_and_what():
    # GIVEN a freed block whose pattern a dangling pointer overwrote at offset 8
    proc = F.FakeProcess()
    b = proc.block(0x40, size=32, freed=(0, 7, 50))
    proc.put(0x40 + abi.TAG_SIZE + 8, b"ABCD")
    # WHEN whoowns is asked about its start
    doc = doc_of(proc, b)
    # THEN the note and use_after_free name the first damaged byte and the bytes
    assert doc["note"] == ("0 bytes into a freed block of 32 bytes; written after it was freed, "
                           "from offset 8 (bytes 41424344): a use-after-free")
    assert doc["use_after_free"] == {"address": hex(b + 8), "offset": 8, "written": "41424344"}
    assert (doc["block"]["state"], doc["block"]["free_thread"]) == ("freed", 7)


def test_a_whole_freed_block_has_no_use_after_free():
    proc = F.FakeProcess()
    b = proc.block(0x40, size=32, freed=(0, 7, 50))
    doc = doc_of(proc, b + 31)
    assert (doc["note"], doc["use_after_free"]) == ("31 bytes into a freed block of 32 bytes", None)


@pytest.mark.parametrize("past, words", [(0, "just past the end"), (5, "5 bytes past the end")])
def test_an_address_just_past_a_block_is_near_it(past, words):
    proc = F.FakeProcess()
    a = proc.block(0x40, size=24)
    doc = doc_of(proc, a + 24 + past)
    assert (doc["owner"], doc["block"], doc["region"]["name"]) == ("mapping", None, "heap")
    assert doc["note"] == f"{words} of the live block at {a:#x} (24 bytes)"
    assert (doc["near"]["past_end"], doc["near"]["block"]["start"], doc["near"]["block"]["size"]) == (past, hex(a), 24)


def test_a_live_stack_word_is_the_threads_and_a_dead_one_says_so():
    proc = F.FakeProcess()  # the thread's saved rsp is 0x800 into its stack
    live = doc_of(proc, proc.stack_at(0x900))
    assert (live["owner"], live["thread"], live["region"]["name"], live["note"]) == (
        "stack", F.MAIN_TID, f"stack of thread {F.MAIN_TID}", "")
    at_sp = doc_of(proc, proc.stack_at(0x800))  # the word at the stack pointer is live
    assert (at_sp["owner"], at_sp["note"]) == ("stack", "")
    dead = doc_of(proc, proc.stack_at(0x100))
    assert (dead["owner"], dead["thread"]) == ("stack", F.MAIN_TID)
    assert dead["note"] == f"below the stack pointer {proc.stack_at(0x800):#x} (dead frame)"


@pytest.mark.parametrize("addr, note", [(0x10, "NULL page"), (0x123400000000, "in no mapping of the process")])
def test_an_address_in_no_mapping_is_unmapped(addr, note):
    doc = doc_of(F.FakeProcess(), addr)
    assert (doc["owner"], doc["region"], doc["note"], doc["block"], doc["referrers"]) == (
        "unmapped", None, note, None, [])


def test_a_global_is_named_by_its_symbol_section_and_module():
    proc = F.FakeProcess()
    proc.modules()
    doc = doc_of(proc, proc.globals_at(8))
    assert (doc["owner"], doc["region"]["name"], doc["note"]) == (
        "global", "globals of program", "registry+8 (.bss) in /fake/program")
    assert doc["symbol"] == {"name": "registry", "offset": 8, "section": ".bss", "module": F.PROGRAM}
    # a word no symbol holds: the module alone
    bare = doc_of(proc, proc.globals_at(0x80))
    assert (bare["owner"], bare["note"], bare["symbol"]) == ("global", F.PROGRAM, None)


def test_a_writable_file_the_process_does_not_also_map_read_only_is_no_modules_globals():
    proc = F.FakeProcess()  # no read-only mapping of /fake/program: a data file mapped for writing
    doc = doc_of(proc, proc.globals_at(8))
    assert (doc["owner"], doc["region"]["name"], doc["symbol"]) == ("mapping", F.PROGRAM, None)


def test_block_of_an_address_in_no_block_says_what_it_is_instead():
    proc = F.FakeProcess()
    a = proc.block(0x40, size=24)
    dump = F.dump(proc)
    assert owners.block_of(dump, a + 23).start == a
    with pytest.raises(NotFoundError) as err:
        owners.block_of(dump, a + 27)
    assert err.value.message == (f"{a + 27:#x} is in no tagged block: heap, "
                                 f"3 bytes past the end of the live block at {a:#x} (24 bytes)")
    with pytest.raises(NotFoundError) as err:
        owners.block_of(dump, proc.stack_at(0x100))
    assert err.value.message == (f"{proc.stack_at(0x100):#x} is in no tagged block: stack of thread "
                                 f"{F.MAIN_TID}, below the stack pointer {proc.stack_at(0x800):#x} (dead frame)")


# ------------------------------------------------------------ referrers --


def test_referrers_list_globals_then_stack_words_then_heap_words_each_by_address():
    # GIVEN a target pointed at by two heap words, a live stack word and two globals
    proc = F.FakeProcess()
    proc.modules()
    target = proc.block(0x40, size=32)
    holder = proc.block(0x100, size=64)
    proc.word(holder + 48, target + 8)  # interior
    proc.word(holder + 16, target)
    proc.word(proc.stack_at(0xA00), target)
    proc.word(proc.globals_at(0x40), target + 16)  # cache, interior
    proc.word(proc.globals_at(8), target)  # registry+8
    doc = doc_of(proc, target)
    # THEN all five, globals first, then the stack, then the heap, each by address
    assert [(r["address"], r["in"], r["block_start"], r["interior"], r["thread"], r["module"], r["symbol"])
            for r in doc["referrers"]] == [
        (hex(proc.globals_at(8)), "global", None, False, None, F.PROGRAM, "registry+8"),
        (hex(proc.globals_at(0x40)), "global", None, True, None, F.PROGRAM, "cache"),
        (hex(proc.stack_at(0xA00)), "stack", None, False, F.MAIN_TID, None, None),
        (hex(holder + 16), "heap", hex(holder), False, None, None, None),
        (hex(holder + 48), "heap", hex(holder), True, None, None, None),
    ]
    assert (doc["referrer_count"], doc["self_referrers"]) == (5, 0)


def test_words_that_are_no_reference_are_left_out():
    # GIVEN a target pointed at only from places that hold no reference:
    # its own words, a dead stack frame, a freed block and libtag's data
    proc = F.FakeProcess()
    proc.modules()
    target = proc.block(0x40, size=32)
    proc.word(target + 8, target)
    proc.word(target + 16, target + 24)
    proc.word(proc.stack_at(0x100), target)  # below the saved rsp (0x800)
    proc.block(0x100, size=64, freed=(0, 1, 1))
    proc.word(F.HEAP + 0x100 + 32 + 40, target)  # inside the freed block's payload
    proc.libtag_word(0x800, target)
    proc.word(proc.stack_at(0x800), target + 4)  # at the stack pointer itself: live
    doc = doc_of(proc, target)
    # THEN only the live stack word counts; the block's own two words are counted apart
    assert [(r["in"], r["address"], r["interior"]) for r in doc["referrers"]] == [
        ("stack", hex(proc.stack_at(0x800)), True)]
    assert (doc["referrer_count"], doc["self_referrers"]) == (1, 2)


def test_a_word_in_shared_memory_is_a_global_referrer_named_by_the_mapping():
    proc = F.FakeProcess()
    target = proc.block(0x40, size=16)
    shm = proc.map(0x7E0000000000, 0x1000, writable=True, path="/dev/shm/cache")
    shm[0x18:0x20] = target.to_bytes(8, "little")
    (ref,) = doc_of(proc, target)["referrers"]
    assert (ref["address"], ref["in"], ref["module"], ref["symbol"]) == (
        hex(0x7E0000000018), "global", None, "POSIX shared memory /cache")


def test_referrers_beyond_the_limit_are_counted_and_the_roots_kept():
    # GIVEN 200 heap words and one global all pointing at the target
    proc = F.FakeProcess()
    proc.modules()
    target = proc.block(0x40, size=16)
    big = proc.block(0x100, size=8 * 200)
    for i in range(200):
        proc.word(big + 8 * i, target)
    proc.word(proc.globals_at(0x40), target)
    doc = doc_of(proc, target)
    # THEN 200 are listed (the global first, then the lowest 199 heap words) of 201
    assert (len(doc["referrers"]), doc["referrer_count"]) == (owners.MAX_REFERRERS, 201)
    assert (doc["referrers"][0]["in"], doc["referrers"][0]["symbol"]) == ("global", "cache")
    assert doc["referrers"][-1]["address"] == hex(big + 8 * 198)


# ------------------------------------------------------------ retention --


def test_the_retention_path_names_the_root_and_each_block_on_the_way():
    # GIVEN registry+8 -> table (slot at +16) -> target
    proc = F.FakeProcess()
    proc.modules()
    table = proc.block(0x40, size=32)
    target = proc.block(0x100, size=16)
    proc.word(proc.globals_at(8), table)
    proc.word(table + 16, target)
    doc = doc_of(proc, target)
    assert (doc["retainer_count"], doc["retainers_depth_limited"]) == (1, False)
    (ret,) = doc["retainers"]
    assert ret["root"] == {"kind": "global", "address": hex(proc.globals_at(8)), "thread": None, "register": None,
                           "module": F.PROGRAM, "symbol": "registry+8", "section": ".bss", "function": None,
                           "interior": False}
    assert ret["path"] == [{"address": hex(table + 16), "block_start": hex(table), "size": 32, "offset": 16,
                            "interior": False}]


def test_a_stack_root_pointing_inside_the_block_is_an_interior_root():
    proc = F.FakeProcess()
    target = proc.block(0x40, size=32)
    proc.word(proc.stack_at(0x900), target + 8)
    (ret,) = doc_of(proc, target)["retainers"]
    assert (ret["root"]["kind"], ret["root"]["address"], ret["root"]["thread"], ret["root"]["interior"],
            ret["root"]["function"], ret["path"]) == ("stack", hex(proc.stack_at(0x900)), F.MAIN_TID, True, None, [])


def test_a_lost_block_has_empty_retainers_and_a_freed_one_null():
    proc = F.FakeProcess()
    lost = proc.block(0x40, size=16)
    gone = proc.block(0x80, size=16, freed=(0, 1, 1))
    proc.word(proc.globals_at(0), gone)
    doc = doc_of(proc, lost)
    assert (doc["retainers"], doc["retainer_count"], doc["referrers"]) == ([], 0, [])
    doc = doc_of(proc, gone)
    assert (doc["retainers"], doc["retainer_count"], doc["retainers_depth_limited"]) == (None, None, False)
    # a freed block still has referrers: who holds the dangling pointer
    assert [(r["in"], r["address"]) for r in doc["referrers"]] == [("global", hex(proc.globals_at(0)))]


def test_a_zero_size_block_owns_its_start_and_has_referrers():
    # GIVEN malloc(0)'s block, held by a global
    proc = F.FakeProcess()
    proc.modules()
    z = proc.block(0x40, size=0)
    proc.word(proc.globals_at(8), z)
    doc = doc_of(proc, z)
    assert (doc["owner"], doc["note"], doc["block"]["size"], doc["block"]["offset"]) == (
        "heap", "0 bytes into a live block of 0 bytes", 0, 0)
    assert [(r["in"], r["symbol"], r["interior"]) for r in doc["referrers"]] == [("global", "registry+8", False)]
    assert doc["retainer_count"] == 1
    # its next byte is no longer the block's: just past its end
    assert doc_of(proc, z + 1)["note"] == f"just past the end of the live block at {z:#x} (0 bytes)"


def test_an_address_in_libtags_guard_pool_outside_a_block_is_named_so():
    proc = F.FakeProcess()
    pool = 0x7E0000000000
    proc.map(pool, 0x2000, writable=True)
    proc.control_fields.update(guard_pool=pool, guard_pool_bytes=0x2000)
    doc = doc_of(proc, pool + 0x1010)
    assert (doc["owner"], doc["region"]["name"], doc["note"], doc["block"]) == (
        "mapping", "libtag's guard pool", "a guard page, or the slack of a guarded block", None)
    # the first byte past the pool: no mapping holds it
    assert doc_of(proc, pool + 0x2000)["owner"] == "unmapped"
