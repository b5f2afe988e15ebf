"""The second core path: libtag's own ELF core writer (libtag/src/snapshot/corewrite.c).

The driver (tests/victims/corewrite_driver.c) links corewrite.c alone (with
maps.c, the /proc/self/maps reader it uses), records its threads' registers,
forks with the raw syscall, and the child writes a core of itself with
_tag_write_core().  The cores are checked with real
`gdb --batch -nx` and `readelf`, whatever the machine's core_pattern says:
this path never involves the kernel's core dumper.
"""
import errno
import os
import re
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER_SRC = ROOT / "tests" / "victims" / "corewrite_driver.c"
WRITER_SRC = ROOT / "libtag" / "src" / "snapshot" / "corewrite.c"
MAPS_SRC = ROOT / "libtag" / "src" / "base" / "maps.c"  # the /proc/self/maps reader it uses

GLOBAL_VALUE = "0x1122334455667788"             # driver_global
HEAP_BYTES = ["0xa0", "0xa1", "0xa2", "0xa3"]   # driver_heap[0..3]
FILEMAP_BYTES = ["0x5a", "0x5a", "0x5a", "0x5a"]  # driver_filemap[0..3]
NT_FILE = 0x46494C45
NT_PRSTATUS, NT_PRPSINFO, NT_AUXV = 1, 3, 6
PAGE = 4096

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("gcc", "gdb", "readelf")),
    reason="needs gcc, gdb and readelf")


def _compile(out, *defines):
    cmd = ["gcc", "-g", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror",
           *defines, f"-I{ROOT / 'libtag' / 'include'}",
           f"-I{ROOT / 'libtag' / 'src'}", str(DRIVER_SRC), str(WRITER_SRC), str(MAPS_SRC),
           "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("corewrite") / "corewrite_driver")


@pytest.fixture(scope="session")
def driver_64maps(tmp_path_factory):
    """The same driver with the mapping bound lowered to 64, to test the
    truncation of a mapping list longer than the bound."""
    return _compile(tmp_path_factory.mktemp("corewrite64") / "corewrite_driver",
                    "-DCW_MAX_MAPS=64")


def run_driver(exe, cwd, out, *args):
    proc = subprocess.run([str(exe), str(out), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    info = {"tid": []}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key == "tid":
            info["tid"].append(int(value))
        else:
            info[key] = value
    assert proc.returncode == 0, f"driver exit 0 expected: {proc.stderr}"
    return info


def gdb(exe, core, *cmds, thread_db=True):
    argv = ["gdb", "--batch", "-nx"]
    if not thread_db:
        # "set auto-load libthread-db off" does not stop the system one.
        argv += ["-iex", "set libthread-db-search-path /nonexistent"]
    argv += [str(exe), str(core)]
    for c in cmds:
        argv += ["-ex", c]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return proc.stdout + proc.stderr


def thread_rows(out):
    """The rows of `info threads`: (id, target) per thread."""
    return re.findall(r"^[* ] +(\d+) +((?:Thread 0x[0-9a-f]+ \()?LWP \d+\)?)",
                      out, re.M)


def elf_segments(data):
    phoff, = struct.unpack_from("<Q", data, 32)
    phnum, = struct.unpack_from("<H", data, 56)
    return [struct.unpack_from("<IIQQQQQQ", data, phoff + 56 * i)
            for i in range(phnum)]


def elf_notes(data):
    notes = []
    for p_type, _f, off, _va, _pa, filesz, _ms, _al in elf_segments(data):
        if p_type != 4:   # PT_NOTE
            continue
        p = off
        while p < off + filesz:
            namesz, descsz, n_type = struct.unpack_from("<III", data, p)
            p += 12
            name = data[p:p + namesz].rstrip(b"\0")
            p += (namesz + 3) & ~3
            notes.append((name, n_type, data[p:p + descsz]))
            p += (descsz + 3) & ~3
    return notes


@pytest.fixture(scope="module")
def snapshot(driver, tmp_path_factory):
    """GIVEN the driver with 3 recorded threads (and one record without
    registers) WHEN its fork child writes core.snap THEN ..."""
    cwd = tmp_path_factory.mktemp("snap")
    core = cwd / "core.snap"
    info = run_driver(driver, cwd, core, "regs")
    return driver, core, info


def test_writer_succeeds_and_core_is_0600_elf_core(snapshot):
    _exe, core, info = snapshot
    assert info["core_result"] == "0", "expected _tag_write_core() == 0"
    assert info["child_status"] == "0", "expected the child to exit 0"
    mode = stat.S_IMODE(os.lstat(core).st_mode)
    assert mode == 0o600, f"expected core mode 0600, got {mode:o}"
    data = core.read_bytes()
    assert data[:4] == b"\x7fELF", "expected the ELF magic"
    assert data[4] == 2, "expected ELFCLASS64 (2)"
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    assert e_type == 4, f"expected ET_CORE (4), got {e_type}"
    assert e_machine == 62, f"expected EM_X86_64 (62), got {e_machine}"


def test_segments_are_page_aligned_and_inside_the_file(snapshot):
    _exe, core, _info = snapshot
    data = core.read_bytes()
    segs = elf_segments(data)
    assert segs[0][0] == 4, "expected the first program header to be PT_NOTE"
    loads = [s for s in segs if s[0] == 1]
    assert len(loads) == len(segs) - 1, "expected PT_LOADs after the PT_NOTE"
    for _t, _f, off, vaddr, _pa, filesz, memsz, align in loads:
        assert align == PAGE, f"expected p_align {PAGE}"
        assert off % PAGE == 0, f"expected a page-aligned offset for {vaddr:#x}"
        assert filesz in (0, memsz, PAGE), \
            f"expected filesz 0, memsz or one page for {vaddr:#x}"
        assert off + filesz <= len(data), \
            f"expected the data of {vaddr:#x} inside the {len(data)}-byte file"


def test_gdb_reads_the_global_and_the_heap(snapshot):
    exe, core, info = snapshot
    out = gdb(exe, core, "p/x driver_global", f"x/4xb {info['heap_addr']}")
    assert f"$1 = {GLOBAL_VALUE}" in out, f"expected driver_global = {GLOBAL_VALUE}:\n{out}"
    m = re.search(rf"^{info['heap_addr']}[^:]*:\s+(.*)$", out, re.M)
    assert m, f"expected an x/4xb line at {info['heap_addr']}:\n{out}"
    assert m.group(1).split() == HEAP_BYTES, f"expected heap bytes {HEAP_BYTES}"


def test_page_past_eof_is_written_as_zeros(snapshot):
    """The writable private file mapping's second page lies past EOF:
    write(2) from it fails with EFAULT and the writer puts zeros there."""
    exe, core, info = snapshot
    addr = int(info["filemap_addr"], 16)
    out = gdb(exe, core, f"x/4xb {addr:#x}", f"x/4xb {addr + PAGE:#x}")
    first = re.search(rf"^{addr:#x}[^:]*:\s+(.*)$", out, re.M)
    second = re.search(rf"^{addr + PAGE:#x}[^:]*:\s+(.*)$", out, re.M)
    assert first and first.group(1).split() == FILEMAP_BYTES, \
        f"expected {FILEMAP_BYTES} in the mapped page:\n{out}"
    assert second and second.group(1).split() == ["0x00"] * 4, \
        f"expected zeros in the page past EOF:\n{out}"


def test_gdb_backtrace_comes_from_the_recorded_registers(snapshot):
    exe, core, info = snapshot
    out = gdb(exe, core, "bt", "info threads", "thread apply all bt")
    assert re.search(r"^#0 +main \(", out, re.M), \
        f"expected frame #0 in main (where getcontext ran):\n{out}"
    rows = thread_rows(out)
    assert len(rows) == int(info["valid_threads"]) == 3, \
        f"expected 3 threads (the records with TAG_THREAD_REGS):\n{out}"
    lwps = sorted(int(re.search(r"LWP (\d+)", t).group(1)) for _i, t in rows)
    assert lwps == sorted(info["tid"]), f"expected LWPs {sorted(info['tid'])}"
    assert "LWP 999999" not in out, "expected the record without regs left out"
    assert len(re.findall(r"^#0 +driver_worker \(", out, re.M)) == 2, \
        f"expected both workers' frame #0 in driver_worker:\n{out}"


def test_notes_are_present_and_match_the_kernel_layout(snapshot):
    exe, core, info = snapshot
    listing = subprocess.run(["readelf", "-n", str(core)], capture_output=True,
                             text=True, check=True).stdout
    for kind in ("NT_FILE", "NT_AUXV", "NT_PRPSINFO"):
        assert kind in listing, f"expected {kind} in readelf -n:\n{listing}"
    assert listing.count("NT_PRSTATUS") == 3, "expected 3 NT_PRSTATUS notes"

    data = core.read_bytes()
    notes = elf_notes(data)
    assert all(name == b"CORE" for name, _t, _d in notes), "expected name CORE"
    types = [t for _n, t, _d in notes]
    assert types[:4] == [NT_PRSTATUS, NT_PRPSINFO, NT_AUXV, NT_FILE], \
        f"expected the kernel's note order, got {types}"
    prstatus = [d for _n, t, d in notes if t == NT_PRSTATUS]
    assert all(len(d) == 336 for d in prstatus), "expected 336-byte prstatus"
    pids = [struct.unpack_from("<i", d, 32)[0] for d in prstatus]
    assert pids == info["tid"], f"expected pr_pid {info['tid']}, got {pids}"

    psinfo = next(d for _n, t, d in notes if t == NT_PRPSINFO)
    assert len(psinfo) == 136, "expected a 136-byte prpsinfo"
    pr_pid, = struct.unpack_from("<i", psinfo, 24)
    assert pr_pid == int(info["pid"]), f"expected psinfo pid {info['pid']}"
    fname = psinfo[40:56].rstrip(b"\0")
    assert fname == b"corewrite_drive", f"expected comm corewrite_drive, got {fname}"
    psargs = psinfo[56:].split(b"\0")[0]
    assert psargs.startswith(exe.as_posix().encode() + b" "), \
        f"expected psargs to start with {exe}, got {psargs}"

    auxv = next(d for _n, t, d in notes if t == NT_AUXV)
    keys = [struct.unpack_from("<Q", auxv, i)[0] for i in range(0, len(auxv), 16)]
    assert 3 in keys and 9 in keys and keys[-1] == 0, \
        "expected AT_PHDR (3), AT_ENTRY (9) and a final AT_NULL in NT_AUXV"

    nt_file = next(d for _n, t, d in notes if t == NT_FILE)
    count, page = struct.unpack_from("<QQ", nt_file, 0)
    assert page == PAGE, f"expected page size {PAGE} in NT_FILE"
    triples = [struct.unpack_from("<QQQ", nt_file, 16 + 24 * i) for i in range(count)]
    names = nt_file[16 + 24 * count:].split(b"\0")[:count]
    assert len(names) == count, f"expected {count} NUL-terminated paths"
    loads = {(va, va + ms) for t, _f, _o, va, _p, _fs, ms, _a in elf_segments(data)
             if t == 1}
    for start, end, _pgoff in triples:
        assert (start, end) in loads, f"expected a PT_LOAD for {start:#x}-{end:#x}"
    exe_offsets = [pg for (s, e, pg), n in zip(triples, names)
                   if n == os.fsencode(exe)]
    assert 0 in exe_offsets and any(exe_offsets), \
        f"expected the driver mapped at page offset 0 and beyond, got {exe_offsets}"


def test_without_records_the_writer_uses_its_own_registers(driver, tmp_path):
    """GIVEN no record with TAG_THREAD_REGS WHEN the child writes the core
    THEN one thread whose stack runs _tag_write_core <- main."""
    core = tmp_path / "core.noregs"
    info = run_driver(driver, tmp_path, core, "noregs")
    assert info["core_result"] == "0", "expected _tag_write_core() == 0"
    # libthread_db would list the parent's threads from the copied memory;
    # count the threads the core itself has.
    out = gdb(driver, core, "info threads", "bt", "p/x driver_global",
              thread_db=False)
    assert len(thread_rows(out)) == 1, f"expected exactly 1 thread:\n{out}"
    frames = re.findall(r"^#\d+ +(?:0x[0-9a-f]+ in )?(\w+) \(", out, re.M)
    assert "_tag_write_core" in frames and "main" in frames, \
        f"expected _tag_write_core and main in the backtrace, got {frames}"
    assert frames.index("_tag_write_core") < frames.index("main"), \
        "expected _tag_write_core inner to main"
    assert f"= {GLOBAL_VALUE}" in out, f"expected driver_global = {GLOBAL_VALUE}"
    prstatus = [d for _n, t, d in elf_notes(core.read_bytes()) if t == NT_PRSTATUS]
    assert len(prstatus) == 1, "expected 1 NT_PRSTATUS"
    assert struct.unpack_from("<i", prstatus[0], 32)[0] != int(info["pid"]), \
        "expected pr_pid = the child's pid, not the parent's"


def test_full_disk_returns_minus_enospc(driver, tmp_path):
    """GIVEN /dev/full as the core fd WHEN writing THEN -ENOSPC."""
    info = run_driver(driver, tmp_path, "/dev/full", "regs")
    assert info["core_result"] == str(-errno.ENOSPC), \
        f"expected core_result={-errno.ENOSPC} (-ENOSPC), got {info['core_result']}"
    assert info["child_status"] == "1", "expected the child to exit 1"


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_driver_refuses_an_existing_path(driver, tmp_path, kind):
    """The caller's open (O_CREAT|O_EXCL|O_NOFOLLOW) never writes through an
    existing file or a symlink."""
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    path = tmp_path / "core.existing"
    if kind == "file":
        path.write_bytes(b"keep")
    else:
        path.symlink_to(target)
    info = run_driver(driver, tmp_path, path, "regs")
    assert info["core_result"] == str(-errno.EEXIST), \
        f"expected core_result={-errno.EEXIST} (-EEXIST), got {info['core_result']}"
    assert target.read_bytes() == b"keep", "expected the symlink target untouched"


def test_many_mappings(driver, tmp_path):
    """GIVEN 20000 extra mappings (40000 lines of maps, many read windows)
    THEN every mapping gets a PT_LOAD and gdb reads the last one."""
    core = tmp_path / "core.many"
    info = run_driver(driver, tmp_path, core, "regs", "20000")
    assert info["core_result"] == "0", "expected _tag_write_core() == 0"
    loads = [s for s in elf_segments(core.read_bytes()) if s[0] == 1]
    assert len(loads) >= 40000, f"expected >= 40000 PT_LOADs, got {len(loads)}"
    out = gdb(driver, core, f"x/gx {info['last_map_addr']}")
    assert re.search(rf":\s+{info['last_map_value']}\s*$", out, re.M), \
        f"expected {info['last_map_value']} at {info['last_map_addr']}:\n{out}"


def test_mapping_list_beyond_the_bound_is_truncated(driver_64maps, tmp_path):
    """GIVEN a writer built with a 64-mapping bound and a process with 400+
    mappings THEN a valid core with 64 PT_LOADs at most, still holding the
    low mappings (data, heap) and the [stack] gdb needs to unwind main."""
    core = tmp_path / "core.trunc"
    info = run_driver(driver_64maps, tmp_path, core, "regs", "200")
    assert info["core_result"] == "0", "expected _tag_write_core() == 0"
    loads = [s for s in elf_segments(core.read_bytes()) if s[0] == 1]
    assert 8 <= len(loads) <= 64, f"expected at most 64 PT_LOADs, got {len(loads)}"
    # Without libthread_db, which would read libc's (dropped) memory.
    out = gdb(driver_64maps, core, "p/x driver_global",
              f"x/4xb {info['heap_addr']}", "bt", thread_db=False)
    assert f"= {GLOBAL_VALUE}" in out, f"expected driver_global = {GLOBAL_VALUE}"
    assert re.search(r"^#0 +main \(", out, re.M), f"expected #0 main:\n{out}"
    # The dropped mappings include ld.so's data, so gdb may say "Cannot
    # access memory" while looking for shared libraries; the unwind of main
    # needs only the [stack], which the writer keeps.
    assert "Backtrace stopped" not in out, \
        f"expected the [stack] kept despite the truncation:\n{out}"
