"""An opened ELF core (x86_64 or AArch64: forensics.arch): its segments, threads, mappings, and its memory.

The file is mmap'ed read-only and never loaded whole: reads slice the map, and
Core.segment_array hands out zero-copy numpy views for bulk (vectorised) scans.
"""

from __future__ import annotations

import bisect
import mmap
import os
import stat
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from forensics._np import np

from forensics.arch import for_machine

from . import compressed, elf
from .errors import CoreParseError, NotDumpedError, TruncatedError, UnmappedError
from .notes import (
    FORENSICS_NOTE,
    NT_FORENSICS_SNAPSHOT,
    Auxv,
    Mapping,
    Notes,
    PrPsInfo,
    PrStatus,
    RawNote,
    SigInfo,
    decode_notes,
    iter_notes,
)


@dataclass(frozen=True)
class Segment:
    """One PT_LOAD segment: a mapping of the dead process and where its bytes are."""

    vaddr: int  # first virtual address
    memsz: int  # bytes the mapping spanned in memory
    offset: int  # file offset of the bytes that were dumped
    filesz: int  # bytes the core claims to hold (0: nothing dumped)
    flags: int  # PF_R | PF_W | PF_X
    dumped: int  # bytes of filesz actually in the file; < filesz if the core was cut short
    path: str | None = None  # the NT_FILE path mapped here, None if anonymous

    @property
    def end(self) -> int:
        """One past the last virtual address."""
        return self.vaddr + self.memsz

    @property
    def readable(self) -> bool:
        return bool(self.flags & elf.PF_R)

    @property
    def writable(self) -> bool:
        return bool(self.flags & elf.PF_W)

    @property
    def executable(self) -> bool:
        return bool(self.flags & elf.PF_X)

    @property
    def truncated(self) -> bool:
        """The core file ends before this segment's dumped bytes do."""
        return self.dumped < min(self.filesz, self.memsz)

    def __contains__(self, addr: int) -> bool:
        return self.vaddr <= addr < self.end


_FILE_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
)


def _map_file(path: str) -> tuple[mmap.mmap, os.stat_result, str | None, int, int | None]:
    """Open and mmap a regular, non-empty file read-only, or say why not:
    (the map, the file's stat, the compression it had - "zstd", "lz4", "xz"
    or None - the bytes of the core mapped, and the bytes its decompressed
    copy takes on disk - None for a plain core).  A compressed core is
    recognised by its magic, not its name, and mapped from a private sparse
    copy that goes with the map (forensics.core.compressed)."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang; fstat below refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CoreParseError(f"cannot open core: {path}: no such file or directory") from None
    except PermissionError:
        raise CoreParseError(f"cannot open core: {path}: permission denied") from None
    except OSError as exc:
        raise CoreParseError(f"cannot open core: {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _FILE_KINDS if test(st.st_mode)), "special file")
            raise CoreParseError(f"not a regular file: {path} is a {kind}")
        if st.st_size == 0:
            raise CoreParseError(f"empty file: {path} is 0 bytes")
        try:
            packed = compressed.detect(os.pread(fd, compressed.MAGIC_LEN, 0))
        except OSError as exc:
            raise CoreParseError(f"cannot read core: {path}: {exc.strerror or exc}") from None
        if packed is not None:
            mm, size, disk = compressed.decompress(fd, packed, path)
            return mm, st, packed, size, disk
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ), st, None, st.st_size, None
        except (OSError, ValueError) as exc:
            raise CoreParseError(f"cannot map core: {path}: {exc}") from None
    finally:
        os.close(fd)


_HEAD = 1 << 16
_NOTES_MAX = 64 << 20


def read_notes(path: str | os.PathLike[str]) -> tuple[Notes, list[RawNote], str | None]:
    """(the decoded notes, the raw notes, the compression) of the core at
    path, reading only its head: its notes are there in a kernel's core (and
    libtag's), so a compressed core is decompressed only that far - what
    ``forensics list`` needs to say what each core is.  Raises
    CoreParseError as Core.open does."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise CoreParseError(f"cannot open core: {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            raise CoreParseError(f"not a core: {path} is no regular non-empty file")
        packed = compressed.detect(os.pread(fd, compressed.MAGIC_LEN, 0))

        def first(n: int) -> bytes:
            if packed is None:
                return os.pread(fd, n, 0)
            return compressed.head(fd, packed, path, n)

        buf = first(_HEAD)
        size = len(buf) if packed else st.st_size
        ehdr = elf.read_ehdr(buf, path, size)
        need = ehdr.e_phoff + max(ehdr.e_phnum, 1) * elf.PHDR_SIZE
        if need > len(buf) and need <= _NOTES_MAX:
            buf = first(need)
        phdrs = elf.read_phdrs(buf, ehdr, path, len(buf) if packed else min(size, len(buf)))
        notes = [ph for ph in phdrs if ph.p_type == elf.PT_NOTE]
        need = max((ph.p_offset + ph.p_filesz for ph in notes), default=0)
        if need > _NOTES_MAX:
            raise CoreParseError(f"bad core: {path} has {need} bytes of notes")
        if need > len(buf):
            buf = first(need)
        raw: list[RawNote] = []
        for ph in notes:
            if ph.p_offset + ph.p_filesz > len(buf):
                raise CoreParseError(f"truncated core: {path} ends inside its notes")
            raw.extend(iter_notes(buf, ph.p_offset, ph.p_filesz))
        return decode_notes(raw), raw, packed
    except OSError as exc:
        raise CoreParseError(f"cannot read core: {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


class Core:
    """An ELF core file, opened read-only; ``arch`` is its machine.

    Use as ``with Core.open(path) as core: ...``; the map is closed on exit.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._mm: mmap.mmap | None = None
        self._load()

    def _load(self) -> None:
        # compressed: "zstd", "lz4", "xz" or None; copy_disk_bytes: what the
        # decompressed copy of a compressed core takes on disk (None: plain)
        self._mm, st, self.compressed, self.file_size, self.copy_disk_bytes = _map_file(self.path)
        # which file was parsed: a writer (forensics.reader.complete) checks
        # that the file it opened to write is this one (never a compressed
        # one: what was parsed is its decompressed copy)
        self.identity = (st.st_dev, st.st_ino)
        try:
            self._parse()
        except CoreParseError as exc:
            self.close()
            if self.compressed is None:
                raise
            raise CoreParseError(f"{exc.message} (what its {self.compressed} stream "
                                 f"decompresses to)") from None
        except BaseException:
            self.close()
            raise

    def reparse(self) -> None:
        """Map and parse the file again, after a writer changed it (the
        notes forensics.reader.complete adds to a snapshot core)."""
        self.close()
        self._load()

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Core:
        """Open and parse a core; raises CoreParseError if it is not a readable core of a machine forensics.arch reads."""
        return cls(path)

    # -- parsing -----------------------------------------------------------

    def _parse(self) -> None:
        mm, path, size = self._mm, self.path, self.file_size
        ehdr = elf.read_ehdr(mm, path, size)
        phdrs = elf.read_phdrs(mm, ehdr, path, size)
        # the ELF header, program headers and raw notes as in the file
        self.ehdr, self.phdrs = ehdr, phdrs
        self.arch = for_machine(ehdr.e_machine)  # read_ehdr refused the others

        raw: list[RawNote] = []
        for ph in phdrs:
            if ph.p_type != elf.PT_NOTE:
                continue
            if ph.p_offset + ph.p_filesz > size:
                raise CoreParseError(
                    f"truncated core: {path} is {size} bytes but its notes at offset "
                    f"{ph.p_offset:#x} need {ph.p_offset:#x} + {ph.p_filesz:#x}"
                )
            raw.extend(iter_notes(mm, ph.p_offset, ph.p_filesz))
        self.files_here: dict[str, str] = {}  # adopt_mappings' files
        self.biases_here: dict[str, int] = {}  # ... and load biases
        self.raw_notes: list[RawNote] = raw
        self.notes: Notes = decode_notes(raw, self.arch)
        self._map_starts = [m.start for m in self.notes.mappings]

        segments = []
        for ph in phdrs:
            if ph.p_type != elf.PT_LOAD or ph.p_memsz == 0:
                continue
            # A segment must end inside the 64-bit address space: a corrupt
            # p_vaddr/p_memsz is a bad core, not an address numpy overflows on.
            if ph.p_vaddr + ph.p_memsz > 1 << 64:
                raise CoreParseError(
                    f"bad core: {path} has a segment at {ph.p_vaddr:#x} of {ph.p_memsz:#x} bytes, "
                    f"past the end of the address space"
                )
            wanted = min(ph.p_filesz, ph.p_memsz)
            dumped = max(0, min(wanted, size - ph.p_offset))
            mapping = self.mapping_at(ph.p_vaddr)
            segments.append(
                Segment(
                    vaddr=ph.p_vaddr,
                    memsz=ph.p_memsz,
                    offset=ph.p_offset,
                    filesz=ph.p_filesz,
                    flags=ph.p_flags,
                    dumped=dumped,
                    path=mapping.path if mapping else None,
                )
            )
        segments.sort(key=lambda s: s.vaddr)
        for prev, seg in zip(segments, segments[1:], strict=False):  # neighbours
            if seg.vaddr < prev.end:
                raise CoreParseError(
                    f"bad core: {path} has overlapping segments at {prev.vaddr:#x} "
                    f"(+{prev.memsz:#x}) and {seg.vaddr:#x}"
                )
        self.segments: list[Segment] = segments
        self._seg_starts = [s.vaddr for s in segments]

    # -- process facts -----------------------------------------------------

    @property
    def threads(self) -> list[PrStatus]:
        """Each thread's NT_PRSTATUS note, in note order (the kernel puts the dumping thread first)."""
        return self.notes.threads

    @property
    def prpsinfo(self) -> PrPsInfo | None:
        return self.notes.prpsinfo

    @property
    def pid(self) -> int | None:
        """The process id (from NT_PRPSINFO), None if the core has no such note."""
        return self.notes.prpsinfo.pid if self.notes.prpsinfo else None

    @property
    def auxv(self) -> Auxv:
        return self.notes.auxv

    @property
    def mappings(self) -> list[Mapping]:
        """The NT_FILE file-backed mappings, sorted by start address."""
        return self.notes.mappings

    @property
    def siginfo(self) -> SigInfo | None:
        """The first NT_SIGINFO: the signal that made the dump (gcore: what stopped it)."""
        return self.notes.siginfo

    @cached_property
    def taken_by(self) -> dict[str, str] | None:
        """How forensics took this core from outside the process (the
        "FORENSICS" note the ptrace snapshot writes: method, pid, pause_ns,
        fork_ns, time_ms, threads_stopped), None for any other core."""
        for n in self.raw_notes:
            if n.name == FORENSICS_NOTE and n.type == NT_FORENSICS_SNAPSHOT:
                text = bytes(n.desc).decode("utf-8", "replace")
                return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        return None

    @property
    def truncated(self) -> bool:
        """True if the file ends before some segment's dumped bytes do."""
        return any(s.truncated for s in self.segments)

    @cached_property
    def execfn(self) -> str | None:
        """The path given to execve (AT_EXECFN's string), None if not in the core."""
        addr = self.auxv.execfn
        if not addr:
            return None
        try:
            return self.read_cstring(addr, 4096).decode("utf-8", "surrogateescape")
        except (UnmappedError, NotDumpedError):
            return None

    @cached_property
    def exe(self) -> str | None:
        """The executable's path.

        Best first: the NT_FILE mapping holding AT_ENTRY or AT_PHDR (an absolute,
        resolved path), then AT_EXECFN's string (as typed, may be relative), then
        NT_PRPSINFO's 15-character name.
        """
        for addr in (self.auxv.entry, self.auxv.phdr):
            mapping = self.mapping_at(addr) if addr else None
            if mapping:
                return mapping.path
        if self.execfn:
            return self.execfn
        return self.prpsinfo.fname if self.prpsinfo and self.prpsinfo.fname else None

    def adopt_mappings(self, mappings: list[Mapping], files: dict[str, str] | None = None,
                       biases: dict[str, int] | None = None) -> None:
        """Take mappings found elsewhere (forensics.reader.linkmap: the
        loader's list) as the NT_FILE note a core without one lacks: the
        segments they cover are named by their paths.  files: {path: the
        file found here for it} (``files_here``); biases: {path: its load
        bias, as the loader had it} (``biases_here``)."""
        self.files_here = dict(files or {})
        self.biases_here = dict(biases or {})
        self.notes.mappings = sorted(mappings, key=lambda m: m.start)
        self._map_starts = [m.start for m in self.notes.mappings]
        self.segments = [replace(s, path=m.path if (m := self.mapping_at(s.vaddr)) else None)
                         for s in self.segments]
        self.__dict__.pop("exe", None)

    def mapping_at(self, addr: int) -> Mapping | None:
        """The NT_FILE mapping containing addr, or None."""
        i = bisect.bisect_right(self._map_starts, addr) - 1
        if i >= 0 and addr in self.notes.mappings[i]:
            return self.notes.mappings[i]
        return None

    # -- memory --------------------------------------------------------------

    def find_segment(self, addr: int) -> Segment | None:
        """The segment containing addr (binary search), or None."""
        i = bisect.bisect_right(self._seg_starts, addr) - 1
        if i >= 0 and addr < self.segments[i].end:
            return self.segments[i]
        return None

    def read(self, addr: int, n: int, zero_fill: bool = False) -> bytes:
        """The n bytes at virtual address addr; may span adjacent segments.

        Raises UnmappedError if any byte is in no segment, NotDumpedError if one
        is in a segment's [filesz, memsz) tail (unless zero_fill: then those read
        as zeros), TruncatedError if the file was cut before it (never zero-filled).
        """
        if n < 0:
            raise ValueError(f"negative read size {n}")
        seg = self.find_segment(addr)
        if seg is not None and addr + n <= seg.end:  # the common case: one segment
            return self._read_in(seg, addr, n, zero_fill)
        parts, cur, end = [], addr, addr + n
        while cur < end:
            seg = self.find_segment(cur)
            if seg is None:
                msg = None
                if cur != addr:
                    msg = f"{cur:#x} is not in any segment of the core (reading {n:#x} bytes at {addr:#x})"
                raise UnmappedError(cur, msg)
            take = min(end, seg.end) - cur
            parts.append(self._read_in(seg, cur, take, zero_fill))
            cur += take
        return b"".join(parts)

    def _read_in(self, seg: Segment, addr: int, n: int, zero_fill: bool) -> bytes:
        """Read [addr, addr+n) which lies inside seg."""
        mm = self._map()
        rel, rel_end = addr - seg.vaddr, addr - seg.vaddr + n
        if rel_end <= seg.dumped:
            return mm[seg.offset + rel : seg.offset + rel_end]
        in_file = min(seg.filesz, seg.memsz)
        if seg.dumped < in_file and rel < in_file:  # part of it should be in the file
            bad = seg.vaddr + max(rel, seg.dumped)
            raise TruncatedError(
                f"truncated core: {self.path} is {self.file_size} bytes but segment at "
                f"{seg.vaddr:#x} needs offset {seg.offset:#x} + {seg.filesz:#x}; "
                f"{bad:#x} is past the end of the file",
                bad,
            )
        if not zero_fill:
            bad = seg.vaddr + max(rel, in_file)
            raise NotDumpedError(
                f"{bad:#x} was not dumped: segment {seg.vaddr:#x}-{seg.end:#x} "
                f"({seg.path or 'anonymous'}) has only its first {in_file:#x} bytes in the core",
                bad,
            )
        head = mm[seg.offset + rel : seg.offset + in_file] if rel < in_file else b""
        return head + bytes(n - len(head))

    def read_u64(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 8), "little")

    def read_u32(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 4), "little")

    def read_cstring(self, addr: int, max_len: int = 4096) -> bytes:
        """The NUL-terminated string at addr, without its NUL; at most max_len bytes.

        A result of exactly max_len bytes means no NUL was found that soon.
        """
        mm = self._map()
        out, cur = bytearray(), addr
        while len(out) < max_len:
            seg = self.find_segment(cur)
            readable = seg.vaddr + seg.dumped - cur if seg else 0
            if readable <= 0:
                self.read(cur, 1)  # raises the precise error for this address
            start = seg.offset + (cur - seg.vaddr)
            stop = start + min(readable, max_len - len(out))
            nul = mm.find(b"\0", start, stop)
            if nul >= 0:
                out += mm[start:nul]
                return bytes(out)
            out += mm[start:stop]
            cur += stop - start
        return bytes(out)

    def segment_array(self, seg: Segment) -> np.ndarray:
        """The dumped bytes of seg as a read-only uint8 numpy view of the map (no copy).

        Index i is virtual address seg.vaddr + i; the length is seg.dumped, so a
        [filesz, memsz) tail or a truncated part is not included.  Use
        ``.view('<u8')`` on a multiple-of-8 slice to scan 64-bit words.
        """
        mm = self._map()
        if seg.dumped == 0:
            return np.empty(0, dtype=np.uint8)
        return np.frombuffer(mm, dtype=np.uint8, count=seg.dumped, offset=seg.offset)

    # -- lifetime ------------------------------------------------------------

    def _map(self) -> mmap.mmap:
        if self._mm is None:
            raise ValueError(f"core {self.path} is closed")
        return self._mm

    def close(self) -> None:
        """Close the map.  Arrays from segment_array keep it alive until they go."""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views still export it; it is unmapped when they are freed

    def __enter__(self) -> Core:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else f"{len(self.segments)} segments, {len(self.threads)} threads"
        return f"<Core {self.path!r} pid={self.pid} {state}>"
