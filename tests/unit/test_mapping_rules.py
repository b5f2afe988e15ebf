"""One name per kind of mapping (forensics.reader.memory.name_mapping), from
the mappings a process has, with no process or core.

GIVEN the mapping list of a process that has a module (its file mapped
read-only and writable, and its .bss after it), the brk heap, SysV and POSIX
shared memory, a memfd, a shared mapping of /dev/zero, a data file mapped
for writing and plain anonymous memory
WHEN each is named
THEN each gets its kind's one name, and only a module's own data is a module.
"""

from __future__ import annotations

import pytest

from forensics.reader.memory import Region, module_of_data, name_mapping

EXE = "/usr/bin/server"
M = 0x1000

REGIONS = [
    Region(0x10 * M, 0x11 * M, False, EXE),          # its headers and code
    Region(0x11 * M, 0x12 * M, True, EXE),           # .data
    Region(0x12 * M, 0x13 * M, True, None),          # .bss, right after
    Region(0x20 * M, 0x30 * M, True, "[heap]"),
    Region(0x40 * M, 0x41 * M, True, "/SYSV7e001052 (deleted)"),
    Region(0x42 * M, 0x43 * M, True, "/dev/shm/ring"),
    Region(0x44 * M, 0x45 * M, True, "/memfd:frames (deleted)"),
    Region(0x46 * M, 0x47 * M, True, "/dev/zero (deleted)"),
    Region(0x48 * M, 0x49 * M, True, "/var/lib/app/state.db"),
    Region(0x50 * M, 0x51 * M, True, None),          # anonymous, after nothing
    Region(0x60 * M, 0x61 * M, False, "[vdso]"),
]


def at(start: int) -> Region:
    return next(r for r in REGIONS if r.start == start)


@pytest.mark.parametrize("start, kind, name", [
    (0x11 * M, "module", "globals of server"),
    (0x12 * M, "module", "globals of server"),
    (0x20 * M, "heap", "heap"),
    (0x40 * M, "sysv-shm", "SysV shared memory (key 0x7e001052)"),
    (0x42 * M, "posix-shm", "POSIX shared memory /ring"),
    (0x44 * M, "memfd", "memfd:frames"),
    (0x46 * M, "shared-anon", "shared anonymous mapping"),
    (0x48 * M, "file", "/var/lib/app/state.db"),
    (0x50 * M, "anonymous", "anonymous mapping"),
    (0x60 * M, "special", "[vdso]"),
])
def test_each_kind_has_its_one_name(start, kind, name):
    got = name_mapping(REGIONS, at(start))
    assert (got.kind, got.name) == (kind, name)


def test_only_a_modules_own_data_is_a_module():
    # a file mapped only for writing (shared memory, a data file) has no
    # read-only mapping of its own: never "globals of"
    assert [module_of_data(REGIONS, at(s)) for s in (0x11 * M, 0x12 * M)] == [EXE, EXE]
    assert [module_of_data(REGIONS, at(s)) for s in (0x40 * M, 0x46 * M, 0x48 * M, 0x50 * M)] == [
        None, None, None, None]


def test_a_mapping_that_holds_tagged_blocks_is_the_heap():
    # libtag's heap is anonymous memory: the heap reader says it holds blocks
    assert name_mapping(REGIONS, at(0x50 * M), holds_blocks=True).name == "heap"
