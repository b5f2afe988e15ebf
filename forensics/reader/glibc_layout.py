"""Where glibc keeps its heap, for the libc a process had: the layout the
walk (forensics/reader/glibc_walk.py) reads.

    layout = find_layout(modules, debug_dirs=())      # Layout, or GlibcError

glibc's ptmalloc keeps arenas (``struct malloc_state``: the main one in
libc's data, one per group of threads in its own ``heap_info`` chain of
64 MiB-aligned heaps), chunks laid end to end in each heap (``struct
malloc_chunk``: prev_size, size with its three flag bits, then the user's
bytes), free chunks on lists - each thread's tcache (``struct
tcache_perthread_struct``, reached through the thread's ``tcache`` TLS
variable), the arena's fastbins, its unsorted, small and large bins - the
top chunk, and chunks of their own mmap.

Where those structures are comes from libc itself: the offsets of
``main_arena``, ``mp_``, ``tcache_key`` and the TLS variables from the
``.symtab`` of libc's debug file (found by build-id, as Debian's libc6-dbg
installs it) and the member offsets of the structs from its DWARF; without
a debug file, from the table of known builds below (keyed by build-id).  An
unknown libc without debug information is a one-line GlibcError.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace

from forensics.core import elf
from forensics.errors import InputError
from forensics.files import ensure_private_dir, open_own_file, write_private
from forensics.reader.symbols import open_regular

# malloc's own constants (x86_64 and aarch64 alike: LP64, 16-byte alignment)
SIZE_SZ = 8
CHUNK_HDR = 16  # prev_size and size
MINSIZE = 32
ALIGN = 16
PREV_INUSE, IS_MMAPPED, NON_MAIN_ARENA = 1, 2, 4
FLAG_BITS = 7
NFASTBINS = 10
NBINS = 128
NSMALLBINS = 64
TCACHE_MAX_BINS = 64
HEAP_MAX_SIZE = 64 << 20  # 2 * DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
PAGE = 4096



class GlibcError(InputError):
    """glibc's heap cannot be read in this memory (no libc, an unknown build)."""


# ------------------------------------------------------------------ layout --


@dataclass(frozen=True)
class Layout:
    """Where glibc keeps its heap state, for one libc build: offsets of its
    variables from libc's load bias and of the structs' members."""

    version: str | None  # "2.36"
    source: str  # where this came from: a debug file's path, or "built-in table (...)"
    main_arena: int
    mp: int
    tcache_key: int | None  # the random key of tcache entries (2.34+); None before
    tcache_got: int | None  # the GOT slot holding the TP offset of the `tcache` TLS variable
    arena_got: int | None  # ... of `thread_arena`
    abort_msg: int | None  # __abort_msg: glibc's last fatal message
    state: dict[str, int]  # struct malloc_state: member -> offset
    par: dict[str, int]  # struct malloc_par (mp_): member -> offset
    tcache_count_size: int  # bytes of each tcache count (2 since 2.30)
    tcache_entries: int  # offset of tcache_perthread_struct.entries
    heap_info_size: int  # sizeof(heap_info)
    safe_linking: bool  # 2.32+: tcache and fastbin next pointers are mangled
    # added to the TP offset in tcache_got's slot: aarch64's libc reaches
    # `tcache` through thread_arena's slot (a section anchor) + 8
    tcache_tls_add: int = 0
    # filled in for a core
    libc_path: str = ""
    libc_base: int = 0
    build_id: str | None = None

    def at(self, bias: int, path: str, build_id: str | None) -> Layout:
        return replace(self, libc_base=bias, libc_path=path, build_id=build_id)


_STATE_236 = {"mutex": 0, "flags": 4, "have_fastchunks": 8, "fastbinsY": 16, "top": 96,
              "last_remainder": 104, "bins": 112, "binmap": 2144, "next": 2160, "next_free": 2168,
              "attached_threads": 2176, "system_mem": 2184, "max_system_mem": 2192, "sizeof": 2200}
_PAR_236 = {"trim_threshold": 0, "top_pad": 8, "mmap_threshold": 16, "arena_test": 24,
            "arena_max": 32, "thp_pagesize": 40, "hp_pagesize": 48, "hp_flags": 56, "n_mmaps": 60,
            "n_mmaps_max": 64, "max_n_mmaps": 68, "no_dyn_threshold": 72, "mmapped_mem": 80,
            "max_mmapped_mem": 88, "sbrk_base": 96, "tcache_bins": 104, "tcache_max_bytes": 112,
            "tcache_count": 120, "tcache_unsorted_limit": 128, "sizeof": 136}

# Known builds without their debug files: build-id -> Layout.  Each entry is
# derived from, and checked against, the build's own debug file
# (tests/integration/test_glibc_heap.py compares when libc6-dbg is installed).
KNOWN_BUILDS: dict[str, Layout] = {
    # Debian 12 (bookworm), libc6 2.36-9+deb12u14, amd64
    "93ac61ec5a8eb1396f9fbd350e3169a558528a40": Layout(
        version="2.36", source="built-in table (Debian 12, glibc 2.36-9+deb12u14)",
        main_arena=0x1D3C60, mp=0x1D3340, tcache_key=0x1DA478, tcache_got=0x1D2D78,
        arena_got=0x1D2D70, abort_msg=0x1D4E60, state=_STATE_236, par=_PAR_236,
        tcache_count_size=2, tcache_entries=128, heap_info_size=48, safe_linking=True),
    # Debian 12's cross libc for arm64 (libc6-arm64-cross 2.36-8cross1, the
    # one qemu-aarch64 runs with -L /usr/aarch64-linux-gnu).  No debug file
    # exists for it: derived from the code and checked against its cores
    # (docs/design.md, "aarch64"): main_arena is the one word of libc's data
    # whose malloc_state.next points at itself in a one-thread process, mp_
    # the one holding tcache_bins 64, tcache_max_bytes 1032 and
    # tcache_count 7 at their offsets, tcache_key the word equal to a freed
    # tcache entry's key, and __libc_malloc reads thread_arena at
    # [tp + GOT[0x19fd70]] and tcache at 8 above it.  The structs are
    # x86_64's: both are LP64 with 16-byte malloc alignment.
    "67adfea574cc9357d858bf79acc700c660126c81": Layout(
        version="2.36", source="built-in table (Debian 12, libc6-arm64-cross 2.36-8cross1, arm64)",
        main_arena=0x1A0B30, mp=0x1A01B0, tcache_key=0x1A6970, tcache_got=0x19FD70,
        arena_got=0x19FD70, abort_msg=0x1A1C88, state=_STATE_236, par=_PAR_236,
        tcache_count_size=2, tcache_entries=128, heap_info_size=48, safe_linking=True,
        tcache_tls_add=8),
}

_LIBC_NAME = re.compile(r"^libc(\.so\.6|-2\.\d+\.so)$")
_VERSION = re.compile(rb"GNU C Library \(([^)]*)\) [a-z ]*release version (\d+\.\d+)")


def find_libc(modules: Iterable) -> object:
    """The module of glibc's libc.so.6 (forensics.reader.symbols.Module)."""
    for m in modules:
        if _LIBC_NAME.match(os.path.basename(m.path)):
            return m
    raise GlibcError("no libc.so.6 in the core: glibc's heap cannot be read (a static program, "
                     "or another C library)")


def _libc_file_facts(path: str, build_id: bytes | None) -> tuple[str | None, str | None]:
    """(version "2.36", the distribution's name for the build) read from the
    libc file at path when it is the one the process had; (None, None) else."""

    f = open_regular(path)
    if f is None:
        return None, None
    with f:
        try:
            if build_id is not None and elf.image_build_id(elf.file_reader(f)) != build_id:
                return None, None
            f.seek(0)
            data = f.read(1 << 23)
        except (OSError, ValueError, InputError):
            return None, None
    m = _VERSION.search(data)
    return (m.group(2).decode(), m.group(1).decode(errors="replace")) if m else (None, None)


def _debug_file(build_id: bytes, debug_dirs: Iterable[str]) -> str | None:
    hexid = build_id.hex()
    for d in (*debug_dirs, "/usr/lib/debug"):
        for path in (os.path.join(d, ".build-id", hexid[:2], hexid[2:] + ".debug"),
                     os.path.join(d, hexid[:2], hexid[2:] + ".debug")):
            if os.path.isfile(path):
                return path
    return None


def _version_tuple(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, ValueError):
        return None


_LAYOUT_CACHE_VERSION = 1


def _cached_layout(debug: str, libc_path: str | None, version: str | None, hexid: str,
                   cache_dir) -> Layout:
    """layout_from_debug, kept in cache_dir as JSON (a private file; one
    that cannot be read or written is only a cache miss)."""

    if cache_dir is None:
        return layout_from_debug(debug, libc_path, version)
    try:
        st = os.stat(debug)
    except OSError:
        return layout_from_debug(debug, libc_path, version)
    key = [_LAYOUT_CACHE_VERSION, hexid, debug, st.st_size, st.st_mtime_ns, libc_path, version]
    path = os.path.join(os.fspath(cache_dir), f"{hexid}.json")
    names = {f.name for f in fields(Layout)}
    opened = open_own_file(path, os.O_RDONLY)
    if opened is not None:
        try:
            with os.fdopen(opened[0], "rb") as f:
                doc = json.loads(f.read(1 << 20))
            if doc.get("key") == key and set(doc["layout"]) == names:
                return Layout(**doc["layout"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass  # a damaged cache file: read the debug file again
    layout = layout_from_debug(debug, libc_path, version)
    data = json.dumps({"key": key, "layout": asdict(layout)}).encode()
    try:
        ensure_private_dir(cache_dir)
        write_private(path, lambda f: f.write(data))
    except (OSError, InputError):
        pass
    return layout


def layout_from_debug(debug_path: str, libc_path: str | None, version: str | None) -> Layout:
    """The Layout of a libc build from its debug file: the variables from its
    .symtab, the structs from the DWARF of malloc.c, and the GOT slots of
    the TLS variables from the dynamic relocations of the libc file itself
    (libc_path, when it is the same build; else the tcaches are found by
    their entries' key)."""
    from elftools.common.exceptions import ELFError  # deferred, start-up time: pyelftools
    from elftools.elf.elffile import ELFFile  # deferred, start-up time: pyelftools

    try:
        with open(debug_path, "rb") as f:
            elf = ELFFile(f)
            symtab = elf.get_section_by_name(".symtab")
            if symtab is None:
                raise GlibcError(f"{debug_path} has no .symtab: it cannot say where main_arena is")

            def sym(name: str) -> int | None:
                found = symtab.get_symbol_by_name(name)
                return int(found[0]["st_value"]) if found else None

            main_arena, mp = sym("main_arena"), sym("mp_")
            if main_arena is None or mp is None:
                raise GlibcError(f"{debug_path} names no main_arena or mp_: not glibc's libc")
            structs = _dwarf_structs(elf, sym("__libc_malloc") or sym("_int_malloc"))
            tls = {"tcache": sym("tcache"), "thread_arena": sym("thread_arena")}
            key, abort_msg = sym("tcache_key"), sym("__abort_msg")
    except (OSError, ELFError) as exc:
        raise GlibcError(f"cannot read glibc's debug file {debug_path}: {exc}") from None
    for name in ("malloc_state", "malloc_par", "tcache_perthread_struct", "_heap_info"):
        if name not in structs:
            raise GlibcError(f"{debug_path}: the DWARF of malloc.c has no struct {name}")
    got = _tls_got_slots(libc_path, tls) if libc_path else {}
    tcache_got, tcache_add = got.get("tcache", (None, 0))
    arena_got, _ = got.get("thread_arena", (None, 0))
    entries = structs["tcache_perthread_struct"]["entries"]
    vt = _version_tuple(version)
    return Layout(
        version=version, source=debug_path, main_arena=main_arena, mp=mp, tcache_key=key,
        tcache_got=tcache_got, arena_got=arena_got, abort_msg=abort_msg,
        state=structs["malloc_state"], par=structs["malloc_par"],
        tcache_count_size=entries // TCACHE_MAX_BINS, tcache_entries=entries,
        heap_info_size=structs["_heap_info"]["sizeof"],
        # tcache_key came with 2.34, safe-linking with 2.32
        safe_linking=vt >= (2, 32) if vt is not None else key is not None,
        tcache_tls_add=tcache_add)


def _dwarf_structs(elf, code_addr: int | None) -> dict[str, dict[str, int]]:
    """{struct name: {member: offset, "sizeof": size}} of malloc.c's compile
    unit (found through .debug_aranges at code_addr, else by its name)."""
    want = {"malloc_state", "malloc_par", "tcache_perthread_struct", "_heap_info"}
    if not elf.has_dwarf_info():
        return {}
    dwarf = elf.get_dwarf_info()
    cus = []
    if code_addr is not None:
        aranges = dwarf.get_aranges()
        off = aranges.cu_offset_at_addr(code_addr) if aranges is not None else None
        if off is not None:
            cus = [dwarf.get_CU_at(off)]
    if not cus:
        cus = (cu for cu in dwarf.iter_CUs()
               if (cu.get_top_DIE().attributes.get("DW_AT_name") or _NoName).value.endswith(b"malloc.c"))
    out: dict[str, dict[str, int]] = {}
    for cu in cus:
        for die in cu.get_top_DIE().iter_children():
            if die.tag != "DW_TAG_structure_type":
                continue
            name = die.attributes.get("DW_AT_name")
            if name is None or name.value.decode() not in want or "DW_AT_byte_size" not in die.attributes:
                continue
            members = {"sizeof": int(die.attributes["DW_AT_byte_size"].value)}
            for m in die.iter_children():
                if m.tag == "DW_TAG_member" and "DW_AT_name" in m.attributes \
                        and "DW_AT_data_member_location" in m.attributes:
                    members[m.attributes["DW_AT_name"].value.decode()] = int(
                        m.attributes["DW_AT_data_member_location"].value)
            out[name.value.decode()] = members
        if want <= out.keys():
            break
    return out


class _NoName:
    value = b""


R_X86_64_TPOFF64 = 18
R_AARCH64_TLS_TPREL64 = 1030
# the relocation of an initial-exec TLS variable's GOT slot, by e_machine
_TPOFF_RELOC = {62: R_X86_64_TPOFF64, 183: R_AARCH64_TLS_TPREL64}


def _tls_got_slots(libc_path: str, tls: dict[str, int | None]) -> dict[str, tuple[int, int]]:
    """{variable: GOT slot} for libc's initial-exec TLS variables: the slot of
    the R_X86_64_TPOFF64 (aarch64: R_AARCH64_TLS_TPREL64) relocation whose addend is the variable's offset in
    libc's TLS block (the loader writes its TP offset there)."""
    from elftools.common.exceptions import ELFError  # deferred, start-up time: pyelftools
    from elftools.elf.elffile import ELFFile  # deferred, start-up time: pyelftools
    from elftools.elf.relocation import RelocationSection  # deferred, start-up time: pyelftools

    f = open_regular(libc_path)
    if f is None:
        return {}
    want = {v: k for k, v in tls.items() if v is not None}
    out: dict[str, tuple[int, int]] = {}
    slots: dict[int, int] = {}  # addend -> slot, every TP-offset slot
    with f:
        try:
            ef = ELFFile(f)
            tpoff = _TPOFF_RELOC.get(_machine_number(ef), R_X86_64_TPOFF64)
            for sec in ef.iter_sections():
                if not isinstance(sec, RelocationSection) or not sec.is_RELA():
                    continue
                for rel in sec.iter_relocations():
                    if rel["r_info_type"] == tpoff and rel["r_info_sym"] == 0 \
                            and rel["r_addend"] in want:
                        out.setdefault(want[rel["r_addend"]], (int(rel["r_offset"]), 0))
                    if rel["r_info_type"] == tpoff and rel["r_info_sym"] == 0:
                        slots.setdefault(rel["r_addend"], int(rel["r_offset"]))
        except (OSError, ELFError):
            return {}
    # a variable reached through another's slot (a section anchor, as
    # aarch64's libc reaches tcache): the nearest slot below it, 64 bytes at most
    for value, name in want.items():
        if name not in out:
            below = [a for a in slots if value - 64 <= a < value]
            if below:
                a = max(below)
                out[name] = (slots[a], value - a)
    return out


def _machine_number(ef) -> int:
    """The e_machine number of a pyelftools ELFFile (which gives its name)."""
    return {"EM_X86_64": 62, "EM_AARCH64": 183}.get(ef.header["e_machine"], 0)


def find_layout(modules: Iterable, *, debug_dirs: Iterable[str] = (),
                cache_dir: str | os.PathLike[str] | None = None) -> Layout:
    """The Layout of the core's libc: from its debug file (by build-id in
    debug_dirs, then /usr/lib/debug), else from KNOWN_BUILDS; GlibcError
    (one line) for a build that is in neither.  cache_dir: where a layout
    read from a debug file is kept (reading one takes a second: its
    .symtab and DWARF), keyed by the build-id and the debug file's size
    and time."""
    libc = find_libc(modules)
    bid = libc.build_id
    if bid is None:
        raise GlibcError(f"the build-id of {libc.path} is not in the core (its first page is "
                         f"missing): which glibc the process ran is unknown")
    local = getattr(libc, "file", None) or libc.path
    version, distro = _libc_file_facts(local, bid)
    hexid = bid.hex() if bid else None
    debug = _debug_file(bid, debug_dirs) if bid else None
    if debug is not None:
        on_disk = local if version is not None else None
        return _cached_layout(debug, on_disk, version, hexid, cache_dir).at(
            libc.load_bias, libc.path, hexid)
    if hexid in KNOWN_BUILDS:
        return KNOWN_BUILDS[hexid].at(libc.load_bias, libc.path, hexid)
    what = f"glibc {version} ({distro})" if version else "this libc"
    raise GlibcError(
        f"{what} {libc.path}, build-id {hexid or 'unknown'}, is not a build forensics knows and no "
        f"debug file for it was found: install its debug symbols (Debian: apt-get install libc6-dbg) "
        f"or give --debug-dir DIR holding .build-id/{hexid[:2] if hexid else 'xx'}/...debug")


__all__ = [
    "KNOWN_BUILDS",
    "GlibcError",
    "Layout",
    "find_layout",
    "find_libc",
    "layout_from_debug",
]
