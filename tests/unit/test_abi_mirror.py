"""forensics.reader.abi mirrors libtag/include/tag_abi.h exactly.

GIVEN a probe compiled against the packaged tag_abi.h that prints sizeof and
offsetof of every field of every struct, the constants, the check values of a
few tags and the offsets of struct user_regs_struct's registers
WHEN the construct mirrors are built field by field, the numpy dtypes derived
from them, and the numpy check functions are run on the same inputs
THEN every size, offset, constant, register and check value is the C one.

The name tables libtag writes into snapshot directory names and messages
(anomaly.c's kind_names, snapshot.c's reason_names, options.c's signal names)
are read from the C sources of this checkout and compared with Python's; that
part needs no compiler.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from construct import Array, Bytes, FormatField, Struct

from forensics import libpath
from forensics.core.notes import REG_NAMES
from forensics.reader import abi
from forensics.snapshots.snapdir import REASONS
from forensics.snapshots.take import LIBTAG_SIGNALS

LIBTAG_SRC = Path(__file__).resolve().parents[2] / "libtag" / "src"

# ------------------------------------------------------------------ mirror walk --


def _zero(con):
    """A buildable all-zero value for con."""
    if isinstance(con, Struct):
        return {s.name: _zero(s) for s in con.subcons if s.name}
    inner = getattr(con, "subcon", None)
    if isinstance(con, Array):
        return [_zero(con.subcon) for _ in range(con.count)]
    if isinstance(con, Bytes) or (inner is not None and isinstance(inner, Bytes)):
        return bytes(con.sizeof())
    if inner is not None and not isinstance(con, FormatField):
        return _zero(inner)
    return 0


def _ones(con):
    """The same shape with every byte 0xff."""
    if isinstance(con, Array):
        return [_ones(con.subcon) for _ in range(con.count)]
    if isinstance(con, Bytes):
        return b"\xff" * con.sizeof()
    if isinstance(con, Struct):
        return {s.name: _ones(s) for s in con.subcons if s.name}
    inner = getattr(con, "subcon", None)
    if inner is not None and not isinstance(con, FormatField):
        return _ones(inner)
    if isinstance(con, FormatField) and con.fmtstr[-1:].islower():
        return -1  # a signed field: every bit set
    return (1 << (8 * con.sizeof())) - 1


def _leaves(struct, prefix=""):
    """(dotted name, path of names, construct) of every field, nested ones too."""
    for sub in struct.subcons:
        if not sub.name:
            continue
        name = prefix + sub.name
        yield name, sub
        inner = getattr(sub, "subcon", None)
        if isinstance(inner, Struct):
            for n, c in _leaves(inner, name + "."):
                yield n, c


def _offset_by_building(struct, dotted):
    """Build struct with zeros except field dotted all 0xff: (offset, size) of the 0xff run."""
    value = _zero(struct)
    parts = dotted.split(".")
    cur, _con = value, struct
    for p in parts[:-1]:
        cur = cur[p]
    field = dict(_leaves(struct))[dotted]
    cur[parts[-1]] = _ones(field)
    data = struct.build(value)
    first = data.index(b"\xff")
    last = data.rindex(b"\xff")
    assert data[first : last + 1] == b"\xff" * (last + 1 - first)
    return first, last + 1 - first


# ---------------------------------------------------------------------- probe --

CONSTANTS = [
    "TAG_ABI_VERSION", "TAG_MIN_PAYLOAD", "TAG_CANARY_SIZE", "TAG_FREE_PATTERN",
    "TAG_CHECK_MASK", "TAG_TID_SHIFT", "TAG_TID_MASK", "TAG_SIZE_SHIFT", "TAG_SIZE_FIELD", "TAG_SIZE_BIG",
    "TAG_STATE_SHIFT", "TAG_STATE_MASK", "TAG_FLAG_REPORTED", "TAG_ALLOC_SHIFT", "TAG_ALLOC_MASK",
    "TAG_STATE_NONE", "TAG_STATE_FORWARD", "TAG_HEAP_SLICE", "TAG_SPAN_FREE", "TAG_SPAN_SMALL",
    "TAG_SPAN_LARGE",
    "TAG_ALLOC_MALLOC", "TAG_ALLOC_NEW", "TAG_ALLOC_NEW_ARRAY", "TAG_ALLOC_NEW_ALIGNED",
    "TAG_ALLOC_NEW_ARRAY_ALIGNED", "TAG_STATE_LIVE", "TAG_STATE_FREED", "TAG_MIX1", "TAG_MIX2",
    "TAG_FREE_SALT", "TAG_FRAME_CALL", "TAG_FRAME_ENTRY", "TAG_FRAME_SIGNAL", "TAG_FRAME_LOST", "TAG_SHADOW_MAX", "TAG_THREAD_EXITED",
    "TAG_THREAD_REGS", "TAG_NREGS", "TAG_QUARANTINE_SLOTS", "TAG_QUARANTINE_BYTES", "TAG_OPTION_NO_PAYLOAD", "TAG_REAP_REQUEST", "TAG_SNAPSHOT_REQUEST", "TAG_REASON_NONE", "TAG_REASON_ON_DEMAND", "TAG_REASON_ANOMALY",
    "TAG_REASON_CRASH", "TAG_REASON_EXIT", "TAG_ANOMALY_NONE", "TAG_ANOMALY_DOUBLE_FREE", "TAG_ANOMALY_INVALID_FREE",
    "TAG_ANOMALY_HEAP_OVERFLOW", "TAG_ANOMALY_USE_AFTER_FREE", "TAG_ANOMALY_HEAP_UNDERFLOW",
    "TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH", "TAG_ACCESS_NONE", "TAG_ACCESS_READ", "TAG_ACCESS_WRITE",
    "TAG_GUARD_PAGE", "TAG_GUARD_PATTERN", "TAG_GUARD_EMPTY", "TAG_GUARD_LIVE",
    "TAG_GUARD_FREED", "TAG_GUARD_BUSY", "TAG_SHARD_ENTRIES", "TAG_SHARD_SLACK",
]  # fmt: skip

# (tag_addr, secret, tid, size, state, kind, alloc_stack, alloc_time, free_stack, free_tid, free_time)
CHECK_INPUTS = [
    (0x55D0C0A01280, 0x0123456789ABCDEF, 4242, 24, 1, 0, 7, 13, 9, 4243, 250),
    (0x7F3A2C000010, 0xFFFFFFFFFFFFFFFF, 1, 0, 2, 1, 0, 0, 0, 1, 0),
    (0x10, 0x9E3779B97F4A7C15, 0x3FFFFF, 0xFFFFF, 1, 4, 0xFFFFFFF, 0xFFFFFFFF, 1, 2, 3),
    (0xFFFFFFFFFFFFFFE0, 1, 99, 4096, 2, 2, 123456, 4000000000, 77, 100, 4000000001),
    (0x7F3A2C000100, 0x5A5A5A5A5A5A5A5A, 4243, 1 << 30, 3, 7, 64, 17, 0, 0, 0),  # size above TAG_SIZE_BIG
]  # fmt: skip


def _probe_source() -> str:
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#include <string.h>",
        "#include <sys/user.h>",
        '#include "tag_abi.h"',
        "#define F(s, f) printf(\"field %s %s %zu %zu\\n\", #s, #f, offsetof(struct s, f), "
        "sizeof(((struct s *)0)->f))",
        "int main(void) {",
    ]
    for cname, struct in abi.STRUCTS.items():
        lines.append(f'  printf("sizeof {cname} %zu\\n", sizeof(struct {cname}));')
        for dotted, _ in _leaves(struct):
            lines.append(f"  F({cname}, {dotted});")
    for c in CONSTANTS:
        lines.append(f'  printf("const {c} %llu\\n", (unsigned long long)({c}));')
    lines.append('  printf("const TAG_CONTROL_MAGIC %s\\n", TAG_CONTROL_MAGIC);')
    for reg in REG_NAMES:
        lines.append(f'  printf("reg {reg} %zu\\n", offsetof(struct user_regs_struct, {reg}));')
    for n, (addr, secret, tid, size, state, kind, ast, atime, fst, ftid, ftime) in enumerate(CHECK_INPUTS):
        lines += [
            "  {",
            f"    struct libtag_tag t = {{ .alloc_stack = {ast}u, .alloc_time = {atime}u,"
            f" .bits = tag_bits({tid}u, {size}ull, {state}u, {kind}u) | 0xbeefu }};",
            f"    struct libtag_free_rec f = {{ .free_stack = {fst}u, .free_tid = {ftid}u, .free_time = {ftime}u }};",
            f'    printf("check {n} %u %u %llu %llu %u %u %u %u %u\\n", tag_check_value({addr}ull, {secret}ull, &t),',
            f"           free_rec_check_value({addr}ull, {secret}ull, &f),",
            f"           (unsigned long long)tag_canary_value({addr}ull, {secret}ull),",
            "           (unsigned long long)t.bits, tag_check_of(&t), tag_tid_of(&t), tag_size_field(&t),",
            "           tag_state_of(&t), tag_kind_of(&t));",
            "  }",
        ]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the ABI probe")
    d = tmp_path_factory.mktemp("abi_probe")
    src, exe = d / "probe.c", d / "probe"
    src.write_text(_probe_source())
    built = subprocess.run(
        [gcc, "-std=c11", "-Wall", "-Werror", f"-I{libpath.include_dir()}", "-o", str(exe), str(src)],
        capture_output=True, text=True,
    )
    assert built.returncode == 0, f"the probe does not compile against tag_abi.h:\n{built.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    facts: dict = {"sizeof": {}, "field": {}, "const": {}, "check": {}, "reg": {}}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "sizeof":
            facts["sizeof"][rest[0]] = int(rest[1])
        elif kind == "field":
            facts["field"][(rest[0], rest[1])] = (int(rest[2]), int(rest[3]))
        elif kind == "const":
            facts["const"][rest[0]] = rest[1]
        elif kind == "check":
            facts["check"][int(rest[0])] = tuple(int(x) for x in rest[1:])
        elif kind == "reg":
            facts["reg"][rest[0]] = int(rest[1])
    return facts


@pytest.mark.parametrize("cname", list(abi.STRUCTS))
def test_struct_sizes_match_c(probe, cname):
    assert abi.STRUCTS[cname].sizeof() == probe["sizeof"][cname]


@pytest.mark.parametrize("cname", list(abi.STRUCTS))
def test_every_field_offset_and_size_match_c(probe, cname):
    struct = abi.STRUCTS[cname]
    c_fields = {f: v for (s, f), v in probe["field"].items() if s == cname}
    mirror = {dotted: _offset_by_building(struct, dotted) for dotted, _ in _leaves(struct)}
    assert mirror == c_fields
    # and the offsets abi.field_offsets computes for other modules agree
    assert {k: v[0] for k, v in mirror.items()} == abi.field_offsets(struct)


def test_control_has_every_field_the_header_pins(probe):
    # the header's _Static_asserts, restated: a mirror that lost a field fails here
    assert probe["sizeof"]["libtag_control"] == 992
    assert probe["field"][("libtag_control", "stack_shards")] == (976, 8)
    assert probe["field"][("libtag_control", "stack_shard_count")] == (984, 4)
    assert probe["sizeof"]["libtag_stack_shard"] == 64
    assert probe["sizeof"]["libtag_shard_chunk"] == 16
    assert probe["field"][("libtag_control", "request_signal")] == (352, 4)
    assert probe["field"][("libtag_control", "last")] == (376, 64)
    assert probe["field"][("libtag_control", "heap")] == (440, 8)
    assert probe["field"][("libtag_control", "stack_stats_slots")] == (448, 8)
    assert probe["field"][("libtag_control", "stack_stats_used")] == (456, 4)
    assert probe["field"][("libtag_control", "dir")] == (464, 512)
    assert probe["field"][("libtag_control", "stack_stats")] == (296, 8)
    assert probe["field"][("libtag_control", "guard_pool")] == (304, 8)
    assert probe["sizeof"]["libtag_stack_stats"] == 32
    assert probe["sizeof"]["libtag_guard_slot"] == 56
    assert probe["sizeof"]["libtag_tag"] == 16
    assert probe["field"][("libtag_tag", "bits")] == (8, 8)
    assert probe["sizeof"]["libtag_slice"] == 64
    assert probe["sizeof"]["libtag_heap"] == 72
    assert probe["field"][("libtag_control", "anomaly")] == (160, 80)
    assert probe["field"][("libtag_control", "thread_state_bytes")] == (272, 4)
    assert probe["sizeof"]["libtag_quarantine_ring"] == abi.TAG_QUARANTINE_BYTES
    assert probe["field"][("libtag_control", "stack_nodes")] == (72, 8)
    assert probe["field"][("libtag_thread", "regs")] == (56, 8 * 27)


@pytest.mark.parametrize("cname", list(abi.STRUCTS))
def test_numpy_dtypes_match_c(probe, cname):
    dtype = abi.numpy_dtype(abi.STRUCTS[cname])
    assert dtype.itemsize == probe["sizeof"][cname]
    for name in dtype.names:
        assert (dtype.fields[name][1], dtype.fields[name][0].itemsize) == probe["field"][(cname, name)]
    assert abi.STACK_NODE_DTYPE == abi.numpy_dtype(abi.StackNode)
    assert abi.THREAD_RECORD_DTYPE == abi.numpy_dtype(abi.ThreadRecord)
    assert abi.TAG_DTYPE == abi.numpy_dtype(abi.Tag)
    assert abi.SLICE_DTYPE == abi.numpy_dtype(abi.Slice)


def test_flat_ring_entry_dtype_matches_c(probe):
    # the ring entry's dtype flattens its free record: rec.free_stack -> free_stack
    dtype = abi.QENTRY_DTYPE
    assert dtype.itemsize == probe["sizeof"]["libtag_qentry"]
    for name in dtype.names:
        cfield = name if ("libtag_qentry", name) in probe["field"] else f"rec.{name}"
        assert (dtype.fields[name][1], dtype.fields[name][0].itemsize) == probe["field"][("libtag_qentry", cfield)]


def test_register_names_are_user_regs_struct_in_order(probe):
    # the order of the thread records' regs and of a core's NT_PRSTATUS
    assert {name: probe["reg"][name] for name in REG_NAMES} == {name: 8 * i for i, name in enumerate(REG_NAMES)}
    assert len(REG_NAMES) == abi.TAG_NREGS


@pytest.mark.parametrize("name", CONSTANTS)
def test_constants_match_c(probe, name):
    assert getattr(abi, name) == int(probe["const"][name])


def test_control_magic_matches_c(probe):
    assert abi.TAG_CONTROL_MAGIC == probe["const"]["TAG_CONTROL_MAGIC"].encode()
    assert len(abi.TAG_CONTROL_MAGIC) == 16


def _c_table(source: str, array: str, entry: str) -> list[tuple[str, str]]:
    """The entries of a C array initialiser in libtag/src/<source>."""
    path = LIBTAG_SRC / source
    if not path.is_file():
        pytest.skip(f"no libtag sources beside the tests ({path})")
    body = re.search(rf"{array}\[\]\s*=\s*\{{(.*?)\}};", path.read_text(), re.S)
    assert body, f"no array {array} in {path}"
    return re.findall(entry, body.group(1))


def test_anomaly_names_are_anomaly_c_kind_names():
    c = {getattr(abi, k): v for k, v in _c_table("alloc/anomaly.c", "kind_names", r'\[(TAG_\w+)\]\s*=\s*"([^"]*)"')}
    assert c.pop(abi.TAG_ANOMALY_NONE) == "none"
    assert c == abi.ANOMALY_NAMES


def test_reason_names_are_snapshot_c_reason_names():
    c = {getattr(abi, k): v for k, v in _c_table("snapshot/snapshot.c", "reason_names", r'\[(TAG_\w+)\]\s*=\s*"([^"]*)"')}
    assert c == abi.REASON_NAMES
    # ... and a snapshot directory is named after one of them or an anomaly kind
    assert set(REASONS) == set(c.values()) | set(abi.ANOMALY_NAMES.values())


def test_libtag_signal_names_are_options_c_ones():
    c = _c_table("base/options.c", "table", r'\{\s*"(\w+)"\s*,\s*(SIG\w+)\s*\}')
    assert tuple(name for name, _ in c) == LIBTAG_SIGNALS
    assert all(macro == f"SIG{name}" and hasattr(signal, macro) for name, macro in c), c


def test_anomaly_and_reason_names():
    assert [abi.ANOMALY_NAMES[k] for k in (1, 2, 3, 4, 5, 6)] == [
        "double-free", "invalid-free", "heap-overflow", "use-after-free", "heap-underflow",
        "alloc-dealloc-mismatch"]
    assert [abi.ALLOC_KIND_NAMES[k] for k in (0, 1, 2, 3, 4)] == [
        "malloc", "new", "new[]", "new-aligned", "new[]-aligned"]
    assert abi.reason_name(abi.TAG_REASON_ON_DEMAND, 0) == "on-demand"
    assert abi.reason_name(abi.TAG_REASON_CRASH, 0) == "crash"
    assert abi.reason_name(abi.TAG_REASON_ANOMALY, abi.TAG_ANOMALY_HEAP_OVERFLOW) == "heap-overflow"
    assert abi.reason_name(abi.TAG_REASON_NONE, 0) == "none"


def test_check_values_match_c_scalar_and_vectorised(probe):
    # GIVEN tags built by tag_bits() in C (check bits set to 0xbeef, which the check ignores)
    # WHEN the mirror builds the same bits word and computes every check value
    # THEN bits, field accessors and check values equal C's, scalar and vectorised
    u64 = lambda xs: np.array(xs, dtype=np.uint64)  # noqa: E731
    bits_all, stack_time_all = [], []
    with np.errstate(all="raise"):  # the vectorised functions must not warn on wrap-around
        for i, (addr, secret, tid, size, state, kind, ast, atime, fst, ftid, ftime) in enumerate(CHECK_INPUTS):
            (want_tag, want_free, want_canary, want_bits, want_chk, want_tid, want_size, want_state,
             want_kind) = probe["check"][i]
            bits = abi.tag_bits(tid, size, state, kind) | 0xBEEF
            assert bits == want_bits
            tag = abi.Tag.parse(abi.Tag.build(dict(alloc_stack=ast, alloc_time=atime, bits=bits)))
            assert (abi.tag_check_of(tag), abi.tag_tid_of(tag), abi.tag_size_field(tag), abi.tag_state_of(tag),
                    abi.tag_kind_of(tag)) == (want_chk, want_tid, want_size, want_state, want_kind)
            rec = abi.FreeRec.parse(abi.FreeRec.build(dict(
                free_stack=fst, free_tid=ftid, free_time=ftime, check=0)))
            assert abi.tag_check_value(addr, secret, tag) == want_tag
            assert abi.tag_check_fields(addr, secret, bits & ~0xFFFF, ast, atime) == want_tag
            assert abi.free_rec_check_value(addr, secret, rec) == want_free
            assert abi.tag_canary_value(addr, secret) == want_canary
            stack_time = atime << 32 | ast
            assert int(abi.np_tag_check(u64([addr]), secret, u64([bits]), u64([stack_time]))[0]) == want_tag
            assert int(abi.np_free_rec_check(u64([addr]), secret, u64([ftid << 32 | fst]),
                                             u64([ftime]))[0]) == want_free
            assert int(abi.np_tag_canary(u64([addr]), secret)[0]) == want_canary
            bits_all.append(bits)
            stack_time_all.append(stack_time)
    # one secret, many tags at once: the array form equals the per-tag values
    s = CHECK_INPUTS[0][1]
    addr = [row[0] for row in CHECK_INPUTS]
    got = abi.np_tag_check(u64(addr), s, u64(bits_all), u64(stack_time_all))
    assert got.dtype == np.uint16
    assert got.tolist() == [
        abi.tag_check_fields(a, s, b & ~0xFFFF, st & 0xFFFFFFFF, st >> 32)
        for a, b, st in zip(addr, bits_all, stack_time_all, strict=True)
    ]


def test_probe_source_is_self_contained():
    # the probe names every mirrored field; a renamed field would not compile
    src = _probe_source()
    assert "F(libtag_control, anomaly.tag.bits);" in src
    assert "F(libtag_slice, large_size);" in src
    assert "F(libtag_shadow, id);" in src
    assert "F(libtag_shadow, sp);" in src
    assert Path(libpath.include_dir(), "tag_abi.h").is_file()
