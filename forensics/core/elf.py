"""ELF64 little-endian headers, mirrored from <elf.h> with construct.

Only what a core file needs: the file header, program headers, section header 0
(which holds the real program-header count when there are more than 0xfffe), and
the note header.  Validation here is about the ELF container; what the notes say
is forensics.core.notes.  The program headers and GNU build-ids of the
executables and libraries a core names are read here too, from their files
or from the first page of their mappings that the core holds
(image_program_headers, image_build_id): one parser for them.
Symbol tables are pyelftools' job.
"""

from __future__ import annotations

import struct as _struct
from typing import Any, BinaryIO, Callable

from construct import Bytes, ConstructError, Container, Int8ul, Int16ul, Int32ul, Int64ul, Struct

from forensics.arch import for_machine, supported
from forensics.errors import ForensicsError

from .errors import CoreParseError

ELFMAG = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1

ET_NAMES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}
ET_DESCRIPTIONS = {
    0: "an ELF file of no type",
    1: "a relocatable object",
    2: "an ELF executable",
    3: "a shared object or PIE executable",
}
ET_CORE = 4

EM_X86_64 = 62
EM_AARCH64 = 183
EM_NAMES = {
    3: "i386",
    8: "MIPS",
    20: "PowerPC",
    21: "PowerPC64",
    22: "S/390",
    40: "ARM",
    62: "x86_64",
    183: "AArch64",
    243: "RISC-V",
    258: "LoongArch",
}

PT_LOAD = 1
PT_NOTE = 4
PT_TLS = 7

PF_X = 1
PF_W = 2
PF_R = 4

PN_XNUM = 0xFFFF  # e_phnum escape: the real count is section header 0's sh_info

Elf64_Ident = Struct(
    "magic" / Bytes(4),  # ELFMAG
    "ei_class" / Int8ul,  # ELFCLASS64 = 2
    "ei_data" / Int8ul,  # ELFDATA2LSB = 1 (little endian)
    "ei_version" / Int8ul,
    "ei_osabi" / Int8ul,
    "ei_abiversion" / Int8ul,
    "ei_pad" / Bytes(7),
)

Elf64_Ehdr = Struct(
    "e_ident" / Elf64_Ident,
    "e_type" / Int16ul,  # ET_CORE for a core
    "e_machine" / Int16ul,  # EM_X86_64 = 62, EM_AARCH64 = 183 (forensics.arch)
    "e_version" / Int32ul,
    "e_entry" / Int64ul,  # 0 in a core
    "e_phoff" / Int64ul,  # file offset of the program header table
    "e_shoff" / Int64ul,  # file offset of the section header table, 0 if none
    "e_flags" / Int32ul,
    "e_ehsize" / Int16ul,  # 64
    "e_phentsize" / Int16ul,  # 56
    "e_phnum" / Int16ul,  # PN_XNUM if the count is in section 0's sh_info
    "e_shentsize" / Int16ul,  # 64
    "e_shnum" / Int16ul,
    "e_shstrndx" / Int16ul,
)

Elf64_Phdr = Struct(
    "p_type" / Int32ul,  # PT_LOAD, PT_NOTE, ...
    "p_flags" / Int32ul,  # PF_R | PF_W | PF_X
    "p_offset" / Int64ul,  # file offset of the segment's bytes
    "p_vaddr" / Int64ul,  # virtual address in the dead process
    "p_paddr" / Int64ul,  # unused, 0
    "p_filesz" / Int64ul,  # bytes present in the file (0 = none dumped)
    "p_memsz" / Int64ul,  # bytes the mapping spanned in memory
    "p_align" / Int64ul,
)

Elf64_Shdr = Struct(
    "sh_name" / Int32ul,
    "sh_type" / Int32ul,
    "sh_flags" / Int64ul,
    "sh_addr" / Int64ul,
    "sh_offset" / Int64ul,
    "sh_size" / Int64ul,
    "sh_link" / Int32ul,
    "sh_info" / Int32ul,  # in section 0: the program header count if e_phnum == PN_XNUM
    "sh_addralign" / Int64ul,
    "sh_entsize" / Int64ul,
)

Elf64_Nhdr = Struct(
    "n_namesz" / Int32ul,  # bytes of name including its NUL; name padded to 4
    "n_descsz" / Int32ul,  # bytes of desc; desc padded to 4
    "n_type" / Int32ul,  # NT_* (meaning depends on the name)
)

# Elf64_Phdr as one struct format: a core holds hundreds to thousands of
# program headers, and construct's parse of each cost ~0.15 ms (0.1 s for a
# core of 700 mappings; 15 modules' files, 28 ms of a whoowns); read_phdrs and
# image_program_headers unpack a table at once into the same Containers.
_PHDR_FORMAT = _struct.Struct("<IIQQQQQQ")
_PHDR_FIELDS = tuple(sc.name for sc in Elf64_Phdr.subcons)

EHDR_SIZE = Elf64_Ehdr.sizeof()
PHDR_SIZE = Elf64_Phdr.sizeof()
SHDR_SIZE = Elf64_Shdr.sizeof()
NHDR_SIZE = Elf64_Nhdr.sizeof()
assert (EHDR_SIZE, PHDR_SIZE, SHDR_SIZE, NHDR_SIZE) == (64, 56, 64, 12)
assert _PHDR_FORMAT.size == PHDR_SIZE


def parse_at(struct: Struct, buf: Any, offset: int, what: str) -> Any:
    """Parse ``struct`` at ``offset`` in ``buf`` (bytes or mmap).

    The caller has checked the bounds; this only turns a construct failure into
    a CoreParseError that says what was being read and where.
    """
    size = struct.sizeof()
    try:
        return struct.parse(buf[offset : offset + size])
    except ConstructError as exc:
        raise CoreParseError(f"bad {what} at offset {offset:#x}: {exc}") from exc


def check_header(ident_bytes: bytes, path: str, file_size: int) -> None:
    """Reject anything that is not a 64-bit little-endian ELF, by its first bytes."""
    magic = ident_bytes[:4]
    if magic != ELFMAG:
        raise CoreParseError(f"not an ELF file: {path} (magic {magic!r})")
    if file_size < 6:
        raise CoreParseError(f"truncated core: {path} is {file_size} bytes, too short for an ELF header")
    ei_class, ei_data = ident_bytes[4], ident_bytes[5]
    if ei_class != ELFCLASS64:
        kind = "32-bit" if ei_class == 1 else "unknown class"
        raise CoreParseError(
            f"unsupported ELF class {ei_class} ({kind}) in {path}; only 64-bit {supported()} cores are read"
        )
    if ei_data != ELFDATA2LSB:
        raise CoreParseError(
            f"unsupported ELF data encoding {ei_data} (big endian) in {path}; only {supported()} cores are read"
        )
    if file_size < EHDR_SIZE:
        raise CoreParseError(
            f"truncated core: {path} is {file_size} bytes, too short for the {EHDR_SIZE}-byte ELF header"
        )


def read_ehdr(buf: Any, path: str, file_size: int) -> Any:
    """Parse and validate the ELF header of a core: ET_CORE, a machine
    forensics.arch reads (x86_64, AArch64)."""
    check_header(bytes(buf[:16]), path, file_size)
    ehdr = parse_at(Elf64_Ehdr, buf, 0, "ELF header")
    if ehdr.e_type != ET_CORE:
        name = ET_NAMES.get(ehdr.e_type, f"type {ehdr.e_type:#x}")
        desc = ET_DESCRIPTIONS.get(ehdr.e_type, "an ELF file")
        raise CoreParseError(f"not a core file: {path} is {desc} (e_type {name})")
    if for_machine(ehdr.e_machine) is None:
        name = EM_NAMES.get(ehdr.e_machine, "unknown")
        raise CoreParseError(
            f"unsupported architecture: e_machine {ehdr.e_machine} ({name}); only {supported()} cores are read"
        )
    return ehdr


def read_phdrs(buf: Any, ehdr: Any, path: str, file_size: int) -> list[Any]:
    """Parse the program header table, following the PN_XNUM escape."""
    phnum = ehdr.e_phnum
    if phnum == PN_XNUM:
        phnum = _extended_phnum(buf, ehdr, path, file_size)
    if phnum == 0:
        return []
    if ehdr.e_phentsize != PHDR_SIZE:
        raise CoreParseError(
            f"bad ELF header in {path}: e_phentsize {ehdr.e_phentsize}, expected {PHDR_SIZE}"
        )
    end = ehdr.e_phoff + phnum * PHDR_SIZE
    if end > file_size:
        raise CoreParseError(
            f"truncated core: {path} is {file_size} bytes but its {phnum} program headers "
            f"at offset {ehdr.e_phoff:#x} need {end:#x}"
        )
    return _unpack_phdrs(bytes(buf[ehdr.e_phoff:end]), PHDR_SIZE)


def _unpack_phdrs(table: bytes, entsize: int) -> list[Any]:
    """Each whole entry of a program header table whose entries are
    entsize (>= PHDR_SIZE) bytes apart, unpacked with struct at once."""
    if entsize == PHDR_SIZE:
        rows = _PHDR_FORMAT.iter_unpack(table[:len(table) - len(table) % PHDR_SIZE])
    else:
        rows = (_PHDR_FORMAT.unpack_from(table, i * entsize) for i in range(len(table) // entsize))
    return [Container(zip(_PHDR_FIELDS, values)) for values in rows]


def _extended_phnum(buf: Any, ehdr: Any, path: str, file_size: int) -> int:
    """More than 0xfffe segments: the count is in section header 0 (see elf(5))."""
    if ehdr.e_shoff == 0 or ehdr.e_shoff + SHDR_SIZE > file_size:
        raise CoreParseError(
            f"truncated core: {path} has e_phnum PN_XNUM but no section header 0 "
            f"at offset {ehdr.e_shoff:#x} (file is {file_size} bytes)"
        )
    return parse_at(Elf64_Shdr, buf, ehdr.e_shoff, "section header 0").sh_info


def image_program_headers(read: Callable[[int, int], bytes]) -> list[Any] | None:
    """The program headers of a 64-bit little-endian ELF image, or None when
    it is not one or they cannot be read.  ``read(offset, n)`` gives n bytes
    at a FILE offset and raises on failure: a file (file_reader), or the
    memory of the file's offset-0 mapping, where file offset o lies at the
    mapping's start + o (the first page of it is in every core: the kernel's
    and libtag's writers dump it)."""
    try:
        head = read(0, EHDR_SIZE)
        if len(head) < EHDR_SIZE or head[:4] != ELFMAG or head[4] != ELFCLASS64 or head[5] != ELFDATA2LSB:
            return None
        ehdr = parse_at(Elf64_Ehdr, head, 0, "ELF header")
        size, count = ehdr.e_phentsize, ehdr.e_phnum
        if size < PHDR_SIZE or count == 0 or size * count > 1 << 16:
            return None
        return _unpack_phdrs(read(ehdr.e_phoff, size * count), size)
    except (ValueError, OSError, ForensicsError):
        return None


def file_reader(f: BinaryIO) -> Callable[[int, int], bytes]:
    """read(offset, n) over a file open for reading; raises ValueError past its end."""
    def read(offset: int, n: int) -> bytes:
        f.seek(offset)
        data = f.read(n)
        if len(data) < n:
            raise ValueError(f"{n} bytes at {offset:#x} are past the end of the file")
        return data

    return read


def file_program_headers(f: BinaryIO) -> list[Any] | None:
    """The program headers of a 64-bit little-endian ELF file open for
    reading (an executable or a shared library, not only a core), or None
    when it is not one or they cannot be read."""
    return image_program_headers(file_reader(f))

NT_GNU_BUILD_ID = 3  # a note named "GNU" of this type holds the build-id bytes
_BUILD_ID_MAX = 64  # longer descriptors are not build-ids (sha1: 20, md5/uuid: 16)


def image_build_id(read: Callable[[int, int], bytes]) -> bytes | None:
    """The GNU build-id of an ELF image (``read`` as for
    image_program_headers), or None when it has none or it cannot be read.
    The notes are found through the program headers (PT_NOTE), which is all
    a stripped file or a memory image still has."""
    try:
        for ph in image_program_headers(read) or ():
            if ph.p_type != PT_NOTE or not 0 < ph.p_filesz <= 1 << 16:
                continue
            found = _gnu_build_id(read(ph.p_offset, ph.p_filesz))
            if found is not None:
                return found
    except (ValueError, OSError, ForensicsError):
        return None
    return None


def _gnu_build_id(notes: bytes) -> bytes | None:
    """The descriptor of the first NT_GNU_BUILD_ID note named "GNU" in a
    PT_NOTE segment's bytes."""
    pos = 0
    while pos + NHDR_SIZE <= len(notes):
        nh = parse_at(Elf64_Nhdr, notes, pos, "note header")
        name_at = pos + NHDR_SIZE
        desc_at = name_at + ((nh.n_namesz + 3) & ~3)
        end = desc_at + ((nh.n_descsz + 3) & ~3)
        if end > len(notes) + 3 or nh.n_namesz > 1 << 12:
            return None
        if (nh.n_type == NT_GNU_BUILD_ID and notes[name_at:name_at + nh.n_namesz] == b"GNU\0"
                and 0 < nh.n_descsz <= _BUILD_ID_MAX):
            return bytes(notes[desc_at:desc_at + nh.n_descsz])
        pos = end
    return None


def file_build_id(f: BinaryIO) -> bytes | None:
    """The GNU build-id of an ELF file open for reading, or None."""
    return image_build_id(file_reader(f))


SHT_SYMTAB, SHT_NOBITS = 2, 8
_SHN_XINDEX = 0xFFFF  # e_shstrndx escape: the real index is section 0's sh_link
_SHDR_FORMAT = _struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr, unpacked at once
assert _SHDR_FORMAT.size == SHDR_SIZE


def file_section_headers(f: BinaryIO) -> list[tuple[bytes, int, int, int, int]] | None:
    """(name, sh_type, sh_offset, sh_size, sh_entsize) of each section of a
    64-bit little-endian ELF file open for reading, or None when it is not
    one or has no section headers.  With struct, not pyelftools: a question
    that names a frame asks this of each module, and importing pyelftools'
    ELF reader costs ~0.1 s."""
    ehdr = f.read(EHDR_SIZE)
    if len(ehdr) < EHDR_SIZE or ehdr[:4] != ELFMAG or ehdr[4] != ELFCLASS64 or ehdr[5] != ELFDATA2LSB:
        return None
    shoff, = _struct.unpack_from("<Q", ehdr, 0x28)
    shentsize, shnum, shstrndx = _struct.unpack_from("<HHH", ehdr, 0x3A)
    if shoff == 0 or shentsize != SHDR_SIZE:
        return None
    f.seek(shoff)
    first = f.read(SHDR_SIZE)
    if len(first) < SHDR_SIZE:
        return None
    zero = _SHDR_FORMAT.unpack(first)
    if shnum == 0:
        shnum = zero[5]  # more than 0xff00 sections: the count is section 0's sh_size
    if shstrndx == _SHN_XINDEX:
        shstrndx = zero[6]
    if not 0 < shnum <= 1 << 20 or shstrndx >= shnum:
        return None
    table = first + f.read(SHDR_SIZE * (shnum - 1))
    if len(table) < SHDR_SIZE * shnum:
        return None
    rows = list(_SHDR_FORMAT.iter_unpack(table))
    f.seek(rows[shstrndx][4])
    names = f.read(min(rows[shstrndx][5], 1 << 24))
    out = []
    for sh_name, sh_type, _flags, _addr, offset, size, _link, _info, _align, entsize in rows:
        end = names.find(b"\0", sh_name)
        out.append((names[sh_name:end if end >= 0 else len(names)], sh_type, offset, size, entsize))
    return out
