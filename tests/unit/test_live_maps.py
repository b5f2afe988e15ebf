"""The one /proc/PID/maps parser and the one region loader (forensics.reader.live),
which LiveMemory, the symbolizer, the snapshot taker and the gdb commands share.
"""

from __future__ import annotations

import numpy as np

from forensics.reader.live import MapsLine, load_region, maps_regions, parse_maps
from forensics.reader.symbols import modules_from_mappings

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234                       /usr/bin/my server
55d0c0a01000-55d0c0a05000 r-xp 00001000 08:01 1234                       /usr/bin/my server
55d0c0a05000-55d0c0a06000 rw-p 00005000 08:01 1234                       /usr/bin/my server
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0                          [heap]
7f3a00000000-7f3a00021000 rw-p 00000000 00:00 0
7f3a10000000-7f3a10002000 r-xp 00000000 08:01 99                         /lib/libold.so (deleted)
7ffd1000000-7ffd1001000 ---p 00000000 00:00 0
7ffd20000000-7ffd20004000 r--p 00000000 00:00 0                          [vvar]
7ffd20004000-7ffd20006000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
"""


def test_every_line_is_parsed_with_paths_that_hold_spaces():
    maps = parse_maps(MAPS)
    assert len(maps) == 10
    assert maps[0] == MapsLine(0x55D0C0A00000, 0x55D0C0A01000, "r--p", 0, "/usr/bin/my server")
    assert (maps[2].offset, maps[2].readable, maps[2].writable) == (0x5000, True, True)
    assert (maps[4].path, maps[5].path) == (None, "/lib/libold.so (deleted)")


def test_regions_are_the_readable_mappings_memory_can_be_read_from():
    regions = maps_regions(parse_maps(MAPS), lambda s, e: np.zeros(e - s, np.uint8))
    assert [r.path for r in regions] == [
        "/usr/bin/my server", "/usr/bin/my server", "/usr/bin/my server", "[heap]", None,
        "/lib/libold.so (deleted)", "[vdso]"]
    assert [r.writable for r in regions][:4] == [False, False, True, True]


def test_modules_are_the_file_mappings_only():
    mods = modules_from_mappings(parse_maps(MAPS))
    assert [(m.path, m.start, m.end, m.deleted) for m in mods] == [
        ("/usr/bin/my server", 0x55D0C0A00000, 0x55D0C0A06000, False),
        ("/lib/libold.so", 0x7F3A10000000, 0x7F3A10002000, True)]


def test_a_region_loads_in_chunks_and_a_page_that_cannot_be_read_stays_zero():
    # GIVEN memory of 3 MiB + 1 page whose page at 1 MiB + 8 KiB cannot be read
    page = 4096
    start, end = 0x10000000, 0x10000000 + (3 << 20) + page
    bad = start + (1 << 20) + 2 * page
    calls = []

    def read_into(view: memoryview, addr: int) -> int:
        calls.append((addr, len(view)))
        if addr <= bad < addr + len(view):
            return 0
        np.frombuffer(view, np.uint8)[:] = (np.arange(addr, addr + len(view)) // page % 251 + 1).astype(np.uint8)
        return len(view)

    # WHEN it is loaded
    buf = load_region(start, end, read_into)
    # THEN every readable byte is there, the bad page is zero, and only the
    # failing 1 MiB chunk was read again page by page
    want = (np.arange(start, end) // page % 251 + 1).astype(np.uint8)
    want[bad - start:bad - start + page] = 0
    assert np.array_equal(buf, want)
    assert len(calls) == 4 + 256
