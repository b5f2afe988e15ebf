"""forensics.core refuses bad input with a CoreParseError that says where, and nothing else.

The cores here are real and made per run: the kernel's core of `sleep` killed
with SIGABRT (needs no compiler or gdb), and gdb's gcore of it; each case skips
with its reason if this machine cannot make that kind.
Bad cores are made by cutting or patching copies of that real core.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from forensics.core import (
    Core,
    CoreParseError,
    NotDumpedError,
    TruncatedError,
    UnmappedError,
)

PT_LOAD, PT_NOTE = 1, 4
NT_FILE = 0x46494C45


@dataclass(frozen=True)
class RealCore:
    path: Path
    kind: str  # "kernel" (notes first) or "gcore" (notes last)


def _raise_core_limit() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _kernel_core_of_sleep(workdir: Path) -> Path | None:
    """Kill `sleep` with SIGABRT in workdir; the core it leaves, or None."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if not pattern or pattern.startswith("|") or "/" in pattern:
        return None  # cores go to a helper or elsewhere: not ours to collect
    proc = subprocess.Popen(
        [shutil.which("sleep") or "/bin/sleep", "60"], cwd=workdir, preexec_fn=_raise_core_limit
    )
    time.sleep(0.2)  # let it exec, so the core is of sleep and not of python
    proc.send_signal(signal.SIGABRT)
    assert proc.wait(timeout=30) == -signal.SIGABRT
    cores = [p for p in workdir.iterdir() if p.is_file()]
    return cores[0] if len(cores) == 1 else None


def _gcore_of_sleep(workdir: Path) -> Path | None:
    if shutil.which("gcore") is None:
        return None
    proc = subprocess.Popen([shutil.which("sleep") or "/bin/sleep", "60"])
    try:
        time.sleep(0.2)
        prefix = workdir / "gcore"
        subprocess.run(
            ["gcore", "-o", str(prefix), str(proc.pid)], capture_output=True, timeout=120, check=True
        )
        return Path(f"{prefix}.{proc.pid}")
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module", params=["kernel", "gcore"])
def real_core(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RealCore:
    """A real core of `sleep`: one written by the kernel, one by gdb's gcore."""
    workdir = tmp_path_factory.mktemp(f"{request.param}-core")
    if request.param == "kernel":
        path = _kernel_core_of_sleep(workdir)
        reason = "core_pattern is not a plain file name (or RLIMIT_CORE cannot be raised)"
    else:
        path = _gcore_of_sleep(workdir)
        reason = "gcore (gdb) is not installed"
    if path is None:
        pytest.skip(f"no {request.param} core: {reason}")
    return RealCore(path, request.param)


def _phdrs(data: bytes) -> list[tuple[int, int, int, int, int, int]]:
    """(type, flags, offset, vaddr, filesz, memsz) per program header, read by hand."""
    (phoff,) = struct.unpack_from("<Q", data, 32)
    (phnum,) = struct.unpack_from("<H", data, 56)
    out = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + 56 * i
        )
        out.append((p_type, p_flags, p_offset, p_vaddr, p_filesz, p_memsz))
    return out


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _open_fails(path: Path | str) -> str:
    with pytest.raises(CoreParseError) as info:
        Core.open(path)
    return str(info.value)


# -- not a core at all -------------------------------------------------------


def test_empty_file(tmp_path: Path) -> None:
    # GIVEN an empty file WHEN it is opened THEN it is refused as empty
    path = _write(tmp_path, "empty", b"")
    assert _open_fails(path) == f"empty file: {path} is 0 bytes"


def test_text_file(tmp_path: Path) -> None:
    # GIVEN a text file WHEN it is opened THEN the message shows its first bytes
    path = _write(tmp_path, "notes.txt", b"hello, this is not a core\n")
    assert _open_fails(path) == f"not an ELF file: {path} (magic b'hell')"


def test_short_text_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "tiny", b"hi")
    assert _open_fails(path) == f"not an ELF file: {path} (magic b'hi')"


def test_elf_executable_is_not_a_core() -> None:
    # GIVEN /bin/ls, an ELF executable (PIE on Debian) WHEN opened THEN "not a core file"
    message = _open_fails("/bin/ls")
    assert re.fullmatch(
        r"not a core file: /bin/ls is (an ELF executable \(e_type ET_EXEC\)"
        r"|a shared object or PIE executable \(e_type ET_DYN\))",
        message,
    ), message


def test_dev_zero_is_not_a_regular_file() -> None:
    assert _open_fails("/dev/zero") == "not a regular file: /dev/zero is a character device"


def test_directory_is_not_a_regular_file(tmp_path: Path) -> None:
    assert _open_fails(tmp_path) == f"not a regular file: {tmp_path} is a directory"


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    # GIVEN a FIFO nobody writes to WHEN opened THEN refused at once (not a hang)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _open_fails(fifo) == f"not a regular file: {fifo} is a FIFO"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "no-such-core"
    assert _open_fails(path) == f"cannot open core: {path}: no such file or directory"


def test_permission_denied(tmp_path: Path) -> None:
    # GIVEN a file its reader may not read WHEN opened THEN "permission denied".
    # Root reads everything, so as root the open is tried in a child that drops to nobody.
    path = _write(tmp_path, "secret-core", b"\x7fELF" + bytes(60))
    path.chmod(0)
    expected = f"cannot open core: {path}: permission denied"
    if os.geteuid() != 0:
        assert _open_fails(path) == expected
        return
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery past this point, always _exit
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            try:
                Core.open(path)
                result = "opened"
            except CoreParseError as exc:
                result = f"CoreParseError: {exc}"
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                result = f"{type(exc).__name__}: {exc}"
            os.write(write_end, result.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        result = pipe.read().decode()
    os.waitpid(pid, 0)
    assert result == f"CoreParseError: {expected}"


# -- real cores, damaged -----------------------------------------------------


def test_real_core_opens(real_core: RealCore) -> None:
    # GIVEN the untouched real core WHEN opened THEN it parses: sanity for the cases below
    with Core.open(real_core.path) as core:
        assert len(core.threads) == 1
        assert core.exe is not None and os.path.basename(core.exe) == "sleep"
        assert core.truncated is False


def test_arm32_core_is_refused(real_core: RealCore, tmp_path: Path) -> None:
    # GIVEN a real core with e_machine patched to 40 (EM_ARM, 32-bit arm)
    data = bytearray(real_core.path.read_bytes())
    struct.pack_into("<H", data, 18, 40)
    path = _write(tmp_path, "core.arm", bytes(data))
    # WHEN opened THEN the architecture is named, and the ones that are read
    assert _open_fails(path) == "unsupported architecture: e_machine 40 (ARM); only x86_64 and AArch64 cores are read"


def test_x86_64_notes_under_an_aarch64_header_are_refused(real_core: RealCore, tmp_path: Path) -> None:
    # GIVEN a real x86_64 core with e_machine patched to 183 (EM_AARCH64):
    # its NT_PRSTATUS holds 27 registers, AArch64's 34
    data = bytearray(real_core.path.read_bytes())
    struct.pack_into("<H", data, 18, 183)
    path = _write(tmp_path, "core.aarch64", bytes(data))
    # WHEN opened THEN the note is named with both sizes
    msg = _open_fails(path)
    assert msg.startswith("bad NT_PRSTATUS note at offset ") and msg.endswith(
        ": desc is 336 bytes, expected 392"), msg


def test_32bit_core_is_refused(real_core: RealCore, tmp_path: Path) -> None:
    data = bytearray(real_core.path.read_bytes())
    data[4] = 1  # ELFCLASS32
    path = _write(tmp_path, "core.32", bytes(data))
    assert _open_fails(path) == f"unsupported ELF class 1 (32-bit) in {path}; only 64-bit x86_64 and AArch64 cores are read"


def test_core_cut_inside_elf_header(real_core: RealCore, tmp_path: Path) -> None:
    path = _write(tmp_path, "core.40", real_core.path.read_bytes()[:40])
    assert _open_fails(path) == f"truncated core: {path} is 40 bytes, too short for the 64-byte ELF header"


def test_core_cut_inside_program_headers(real_core: RealCore, tmp_path: Path) -> None:
    data = real_core.path.read_bytes()
    phnum = len(_phdrs(data))
    path = _write(tmp_path, "core.100", data[:100])
    assert _open_fails(path) == (
        f"truncated core: {path} is 100 bytes but its {phnum} program headers "
        f"at offset 0x40 need {0x40 + 56 * phnum:#x}"
    )


def test_core_cut_inside_notes(real_core: RealCore, tmp_path: Path) -> None:
    # GIVEN a core cut one byte into its PT_NOTE segment WHEN opened THEN the notes are named
    data = real_core.path.read_bytes()
    note = next(p for p in _phdrs(data) if p[0] == PT_NOTE)
    cut = note[2] + 1
    path = _write(tmp_path, "core.notes-cut", data[:cut])
    assert _open_fails(path) == (
        f"truncated core: {path} is {cut} bytes but its notes at offset "
        f"{note[2]:#x} need {note[2]:#x} + {note[4]:#x}"
    )


def test_core_cut_inside_a_segment_still_opens(real_core: RealCore, tmp_path: Path) -> None:
    # GIVEN a kernel core (notes first) cut in the middle of its last dumped segment
    if real_core.kind != "kernel":
        pytest.skip("gcore puts notes after the segments; cutting a segment cuts the notes")
    data = real_core.path.read_bytes()
    loads = [p for p in _phdrs(data) if p[0] == PT_LOAD and p[4] >= 0x2000]
    _, _, offset, vaddr, filesz, _ = max(loads, key=lambda p: p[2])
    cut = offset + 0x1000
    path = _write(tmp_path, "core.cut", data[:cut])
    # WHEN it is opened
    with Core.open(path) as core:
        # THEN it opens, says it is truncated, and the cut segment is marked
        assert core.truncated is True
        seg = core.find_segment(vaddr)
        assert seg is not None and seg.truncated is True and seg.dumped == 0x1000
        assert len(core.segment_array(seg)) == 0x1000
        # AND bytes before the cut read as in the whole core, bytes after raise
        assert core.read(vaddr + 0xFF0, 16) == data[offset + 0xFF0 : offset + 0x1000]
        with pytest.raises(TruncatedError) as info:
            core.read(vaddr + 0xFF8, 16)
        assert str(info.value) == (
            f"truncated core: {path} is {cut} bytes but segment at {vaddr:#x} needs offset "
            f"{offset:#x} + {filesz:#x}; {vaddr + 0x1000:#x} is past the end of the file"
        )
        # AND zero_fill does not paper over lost bytes
        with pytest.raises(TruncatedError):
            core.read(vaddr + 0x1000, 8, zero_fill=True)


def _first_note_header_offset(data: bytes) -> int:
    return next(p for p in _phdrs(data) if p[0] == PT_NOTE)[2]


def _nt_file_desc_offset(data: bytes) -> int:
    """File offset of the NT_FILE note's desc, found by walking the notes by hand."""
    note = next(p for p in _phdrs(data) if p[0] == PT_NOTE)
    pos, end = note[2], note[2] + note[4]
    while pos + 12 <= end:
        namesz, descsz, n_type = struct.unpack_from("<III", data, pos)
        desc = pos + 12 + ((namesz + 3) & ~3)
        if n_type == NT_FILE:
            return desc
        pos = desc + ((descsz + 3) & ~3)
    raise AssertionError("the real core has no NT_FILE note")


def _patch(offset_of, fmt: str, value: int):
    def apply(data: bytearray) -> None:
        struct.pack_into(fmt, data, offset_of(data), value)

    return apply


CORRUPTIONS = {
    # name: (patch, expected message fragment)
    "e_phoff past EOF": (_patch(lambda d: 32, "<Q", 1 << 40), "program headers at offset 0x10000000000 need"),
    "e_phentsize wrong": (_patch(lambda d: 54, "<H", 32), "e_phentsize 32, expected 56"),
    "PN_XNUM without section 0": (
        lambda d: (struct.pack_into("<H", d, 56, 0xFFFF), struct.pack_into("<Q", d, 40, 0)),
        "has e_phnum PN_XNUM but no section header 0",
    ),
    "note descsz huge": (
        _patch(lambda d: _first_note_header_offset(bytes(d)) + 4, "<I", 0xFFFFFFF0),
        "descsz 0xfffffff0 run past the end of its PT_NOTE segment",
    ),
    "NT_FILE count huge": (
        _patch(lambda d: _nt_file_desc_offset(bytes(d)), "<Q", 1 << 50),
        "entries need",
    ),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupted_field_raises_core_parse_error(real_core: RealCore, tmp_path: Path, name: str) -> None:
    # GIVEN a real core with one header field made impossible
    patch, fragment = CORRUPTIONS[name]
    data = bytearray(real_core.path.read_bytes())
    patch(data)
    path = _write(tmp_path, "core.bad", bytes(data))
    # WHEN opened THEN CoreParseError names the field that failed
    assert fragment in _open_fails(path)


def test_every_cut_opens_or_raises_core_parse_error(real_core: RealCore, tmp_path: Path) -> None:
    # GIVEN copies of a real core cut at every interesting length
    data = real_core.path.read_bytes()
    cuts = set(range(1, 80)) | {len(data) - 1, len(data) // 2}
    for _, _, offset, _, filesz, _ in _phdrs(data):
        cuts |= {offset - 1, offset, offset + 1, offset + filesz - 1, offset + filesz}
    cuts |= set(range(64, 64 + 56 * 3, 7))
    path = tmp_path / "core.cut"
    for cut in sorted(c for c in cuts if 0 < c < len(data)):
        path.write_bytes(data[:cut])
        # WHEN opened THEN it either opens (and reads every segment's dumped bytes) or
        # raises CoreParseError; no construct, struct, index or value error escapes
        try:
            core = Core.open(path)
        except CoreParseError:
            continue
        with core:
            for seg in core.segments:
                assert len(core.segment_array(seg)) == seg.dumped <= cut


# -- reads that cannot be answered -------------------------------------------


def test_unmapped_address(real_core: RealCore) -> None:
    with Core.open(real_core.path) as core:
        with pytest.raises(UnmappedError) as info:
            core.read(0x10, 8)
        assert str(info.value) == "0x10 is not in any segment of the core"
        assert info.value.addr == 0x10


def test_read_running_off_a_segment_names_the_first_unmapped_byte(real_core: RealCore) -> None:
    with Core.open(real_core.path) as core:
        seg = next(
            s for s in core.segments if core.find_segment(s.end) is None and s.dumped == s.memsz
        )
        with pytest.raises(UnmappedError) as info:
            core.read(seg.end - 8, 16)
        assert str(info.value) == (
            f"{seg.end:#x} is not in any segment of the core (reading 0x10 bytes at {seg.end - 8:#x})"
        )


def test_bytes_not_dumped_raise_unless_zero_filled(real_core: RealCore) -> None:
    # GIVEN a kernel core, where read-only file mappings are dumped partly or not at all
    if real_core.kind != "kernel":
        pytest.skip("gcore dumps every segment whole")
    with Core.open(real_core.path) as core:
        seg = next(s for s in core.segments if s.filesz < s.memsz)
        addr = seg.vaddr + seg.filesz
        # WHEN its tail is read THEN NotDumpedError, or zeros when asked for
        with pytest.raises(NotDumpedError) as info:
            core.read(addr, 8)
        assert not isinstance(info.value, TruncatedError)
        assert str(info.value).startswith(f"{addr:#x} was not dumped: segment {seg.vaddr:#x}-{seg.end:#x}")
        assert core.read(addr, 8, zero_fill=True) == bytes(8)


def test_closed_core_refuses_reads(real_core: RealCore) -> None:
    core = Core.open(real_core.path)
    seg = next(s for s in core.segments if s.dumped)
    view = core.segment_array(seg)
    core.close()  # with a live numpy view: must not raise BufferError
    assert int(view[0]) == real_core.path.read_bytes()[seg.offset]
    with pytest.raises(ValueError, match="is closed"):
        core.read(seg.vaddr, 1)
