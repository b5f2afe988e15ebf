"""libtag's crash-time ABI (libtag/include/tag_abi.h), mirrored field for field.

Every struct of the header has a ``construct`` mirror here with the same field
names (Tag, Slice, HeapHeader, FreeRec, StackNode, Shadow, ThreadRecord,
Anomaly, Crash, Control),
the header's constants keep their names, and the check-value functions exist
twice: as plain ints (one tag) and vectorised over numpy uint64 arrays (the tag
heap walk).  tests/unit/test_abi_mirror.py compiles a probe against the packaged
header and compares sizes, offsets, constants and check values.

find_control(mem) locates the control block in any forensics.reader.memory.Memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forensics._np import np
from construct import Array, Bytes, FormatField, Int32sl, Int32ul, Int64ul, Padding, Struct

from forensics.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from forensics.reader.memory import Memory, Region  # annotations only: memory imports abi

# --------------------------------------------------------------- constants --

TAG_ABI_VERSION = 5

TAG_MIN_PAYLOAD = 16
TAG_CANARY_SIZE = 8
TAG_FREE_PATTERN = 0xFD
# struct libtag_tag.bits, from bit 0 up
TAG_CHECK_MASK = 0xFFFF  # bits 0..15: the check value
TAG_TID_SHIFT = 16  # bits 16..37: allocating thread
TAG_TID_MASK = 0x3FFFFF
TAG_SIZE_SHIFT = 38  # bits 38..57: requested size ...
TAG_SIZE_FIELD = 0xFFFFF
TAG_SIZE_BIG = 0xFFFFF  # ... or this: the exact size is the large span's large_size
TAG_STATE_SHIFT = 58  # bits 58..59: TAG_STATE_*
TAG_STATE_MASK = 3
TAG_ALLOC_SHIFT = 60  # bits 60..62: how the block was allocated
TAG_ALLOC_MASK = 7
TAG_FLAG_REPORTED = 1 << 63  # damage to this block was reported; libtag never hands it back

TAG_ALLOC_MALLOC = 0
TAG_ALLOC_NEW = 1
TAG_ALLOC_NEW_ARRAY = 2
TAG_ALLOC_NEW_ALIGNED = 3
TAG_ALLOC_NEW_ARRAY_ALIGNED = 4
ALLOC_KIND_NAMES = {
    TAG_ALLOC_MALLOC: "malloc",
    TAG_ALLOC_NEW: "new",
    TAG_ALLOC_NEW_ARRAY: "new[]",
    TAG_ALLOC_NEW_ALIGNED: "new-aligned",
    TAG_ALLOC_NEW_ARRAY_ALIGNED: "new[]-aligned",
}
# how a block of each kind must be released (the function an anomaly's dealloc names)
DEALLOC_NAMES = {
    TAG_ALLOC_MALLOC: "free",
    TAG_ALLOC_NEW: "delete",
    TAG_ALLOC_NEW_ARRAY: "delete[]",
    TAG_ALLOC_NEW_ALIGNED: "delete-aligned",
    TAG_ALLOC_NEW_ARRAY_ALIGNED: "delete[]-aligned",
}

TAG_STATE_NONE = 0  # no block (a free slot)
TAG_STATE_LIVE = 1
TAG_STATE_FREED = 2
TAG_STATE_FORWARD = 3  # a forward record: the slot's tag is alloc_stack (pad) bytes on

TAG_HEAP_SLICE = 65536  # bytes of one slice of libtag's heap
TAG_SPAN_FREE = 0
TAG_SPAN_SMALL = 1  # slots of block_size bytes from the span's start
TAG_SPAN_LARGE = 2  # one block, its slot block_off bytes into the span

TAG_MIX1 = 0x9E3779B97F4A7C15
TAG_MIX2 = 0xC2B2AE3D27D4EB4F
TAG_FREE_SALT = 0x46524545  # "FREE"

TAG_FRAME_CALL = 1
TAG_FRAME_ENTRY = 2
TAG_FRAME_SIGNAL = 3  # the exact pc a signal interrupted: look up pc itself
TAG_FRAME_LOST = 4  # pc 0: the stack table was full; the inner frames were not recorded
FRAME_KIND_NAMES = {TAG_FRAME_CALL: "call", TAG_FRAME_ENTRY: "entry", TAG_FRAME_SIGNAL: "signal",
                    TAG_FRAME_LOST: "lost"}
# The function name a TAG_FRAME_LOST node shows as (the innermost frame).
LOST_FRAMES = "[frames lost: libtag's stack table was full]"

TAG_SHADOW_MAX = 256

TAG_THREAD_EXITED = 1
TAG_THREAD_REGS = 2
TAG_NREGS = 27
TAG_QUARANTINE_SLOTS = 4096
TAG_REAP_REQUEST = 0x52454150  # sigqueue value: reap finished snapshot children
TAG_SNAPSHOT_REQUEST = 0x50414E53  # sigqueue value: take an on-demand snapshot
TAG_OPTION_NO_PAYLOAD = 1  # control.options: payloads blanked (LIBTAG_PAYLOAD=omit)
TAG_QUARANTINE_BYTES = 16 + 24 * TAG_QUARANTINE_SLOTS  # struct libtag_quarantine_ring

TAG_GUARD_PAGE = 4096  # bytes of a guard page where control.page_size is 0 (x86_64's page)
TAG_GUARD_PATTERN = 0xFB  # the slack around a guarded block
TAG_GUARD_EMPTY = 0
TAG_GUARD_LIVE = 1
TAG_GUARD_FREED = 2
TAG_GUARD_BUSY = 3

TAG_SHARD_ENTRIES = 2048  # per-stack counters: entries a shard chunk; entry numbers start here
TAG_SHARD_SLACK = 65536  # bytes a shard's live_bytes moves before it refreshes its estimate

TAG_CONTROL_MAGIC = b"LIBTAG-CONTROL-1"  # 16 bytes, no NUL stored

TAG_REASON_NONE = 0
TAG_REASON_ON_DEMAND = 1
TAG_REASON_ANOMALY = 2
TAG_REASON_CRASH = 3
TAG_REASON_EXIT = 4  # LIBTAG_AT_EXIT=snapshot: after atexit handlers and static destructors

TAG_ANOMALY_NONE = 0
TAG_ANOMALY_DOUBLE_FREE = 1
TAG_ANOMALY_INVALID_FREE = 2
TAG_ANOMALY_HEAP_OVERFLOW = 3
TAG_ANOMALY_USE_AFTER_FREE = 4
TAG_ANOMALY_HEAP_UNDERFLOW = 5
TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH = 6

TAG_ACCESS_NONE = 0
TAG_ACCESS_READ = 1
TAG_ACCESS_WRITE = 2
ACCESS_NAMES = {TAG_ACCESS_READ: "read", TAG_ACCESS_WRITE: "write"}

ANOMALY_NAMES = {
    TAG_ANOMALY_DOUBLE_FREE: "double-free",
    TAG_ANOMALY_INVALID_FREE: "invalid-free",
    TAG_ANOMALY_HEAP_OVERFLOW: "heap-overflow",
    TAG_ANOMALY_USE_AFTER_FREE: "use-after-free",
    TAG_ANOMALY_HEAP_UNDERFLOW: "heap-underflow",
    TAG_ANOMALY_ALLOC_DEALLOC_MISMATCH: "alloc-dealloc-mismatch",
}
REASON_NAMES = {
    TAG_REASON_NONE: "none",
    TAG_REASON_ON_DEMAND: "on-demand",
    TAG_REASON_ANOMALY: "anomaly",  # a snapshot's name and JSON say the kind instead: reason_name()
    TAG_REASON_CRASH: "crash",
    TAG_REASON_EXIT: "exit",
}
# ANOMALY_NAMES mirror anomaly.c's kind_names, REASON_NAMES snapshot.c's
# reason_names (tests/unit/test_abi_mirror.py compares them).


def reason_name(reason: int, anomaly_kind: int) -> str:
    """The JSON name of a snapshot reason: "on-demand", "crash", "none", or
    for an anomaly snapshot the anomaly's kind ("double-free", ...)."""
    if reason == TAG_REASON_ANOMALY:
        return ANOMALY_NAMES.get(anomaly_kind, f"anomaly-{anomaly_kind}")
    return REASON_NAMES.get(reason, f"reason-{reason}")


def snapshot_dir_reasons() -> tuple[str, ...]:
    """Every <reason> a snapshot directory's name can end in (snapshot.c
    make_snapshot_dir): a reason's name, or for an anomaly the kind's."""
    return tuple(dict.fromkeys([*REASON_NAMES.values(), *ANOMALY_NAMES.values()]))


# ----------------------------------------------------------------- structs --

Tag = Struct(
    "alloc_stack" / Int32ul,  # stack id, 0 = none; a forward record: pad, the bytes to the tag
    "alloc_time" / Int32ul,  # ms since start_mono_ns
    "bits" / Int64ul,  # check, tid, size, state, alloc kind, reported: TAG_*_SHIFT
)

Slice = Struct(
    "first_off" / Int32ul,  # slices back to the span's first slice
    "slices" / Int32ul,  # first slice: the span's length in slices
    "kind" / Int32ul,  # TAG_SPAN_*
    "flags" / Int32ul,  # libtag's own
    "cls" / Int32ul,  # small span: its size class
    "block_size" / Int32ul,  # small span: bytes of one slot
    "capacity" / Int32ul,  # slots in the span
    "carved" / Int32ul,  # slots [0, carved) were handed out at least once
    "nfree" / Int32ul,  # libtag's own
    "block_off" / Int32ul,  # large span: bytes from the span's start to its block's slot
    "large_size" / Int64ul,  # large span: requested size of its block
    "next" / Int64ul,  # libtag's own
    "prev" / Int64ul,  # libtag's own
)

HeapHeader = Struct(
    "base" / Int64ul,  # address of slice 0
    "slices_max" / Int64ul,  # slices the region has room for
    "used" / Int64ul,  # slices [0, used) were ever handed out
    "committed" / Int64ul,  # slices [0, committed) are read-write
    "meta" / Int64ul,  # address of struct libtag_slice[slices_max]
    "key" / Int64ul,  # libtag's own
    "large_count" / Int64ul,
    "large_bytes" / Int64ul,
    "broken_links" / Int64ul,  # free lists found overwritten
)

FreeRec = Struct(
    "free_stack" / Int32ul,
    "free_tid" / Int32ul,
    "free_time" / Int32ul,
    "check" / Int32ul,  # free_rec_check_value()
)

QEntry = Struct(
    "user" / Int64ul,  # user pointer of the freed block
    "rec" / FreeRec,  # who freed it
)

QuarantineRing = Struct(
    "head" / Int32ul,  # index of the oldest entry
    "count" / Int32ul,  # entries held: e[(head + i) % TAG_QUARANTINE_SLOTS], i < count
    "bytes" / Int64ul,
    "e" / Array(TAG_QUARANTINE_SLOTS, QEntry),
)

GuardSlot = Struct(
    "user" / Int64ul,  # the block placed in the slot last, 0 = none
    "rec" / FreeRec,  # who freed it, while state is TAG_GUARD_FREED
    "state" / Int32ul,  # TAG_GUARD_*
    "retired" / Int32ul,  # a fault opened it: never inaccessible again nor reused
    "tag" / Tag,  # libtag's copy of the block's tag
    "next" / Int32ul,  # libtag's queue of freed slots
    "reported" / Int32ul,  # a fault on its block was reported
)

StackNode = Struct(
    "pc" / Int64ul,
    "parent" / Int32ul,  # 0 = outermost
    "kind" / Int32ul,  # TAG_FRAME_*
)

Shadow = Struct(
    "depth" / Int32ul,
    "valid" / Int32ul,
    "overflows" / Int64ul,
    "fn" / Array(TAG_SHADOW_MAX, Int64ul),
    "site" / Array(TAG_SHADOW_MAX, Int64ul),
    "sp" / Array(TAG_SHADOW_MAX, Int64ul),  # CFA of each frame; bit 0: a lower bound
    "id" / Array(TAG_SHADOW_MAX + 1, Int32ul),
    Padding(4),  # the C struct's tail padding to 8-byte alignment
)

ThreadRecord = Struct(
    "tid" / Int32ul,  # 0 = unused slot
    "flags" / Int32ul,  # TAG_THREAD_*
    "shadow" / Int64ul,  # address of its struct libtag_shadow
    "allocs" / Int64ul,
    "frees" / Int64ul,
    "alloc_bytes" / Int64ul,
    "free_bytes" / Int64ul,
    "stack_hi" / Int64ul,
    "regs" / Array(TAG_NREGS, Int64ul),  # user_regs_struct order
    "quarantine" / Int64ul,  # its quarantine ring (libtag's memory), 0 = none
    "reserved" / Int64ul,
)

Anomaly = Struct(
    "kind" / Int32ul,
    "tid" / Int32ul,
    "address" / Int64ul,
    "block" / Int64ul,
    "stack" / Int32ul,
    "time" / Int32ul,
    "tag" / Tag,
    "free_rec" / FreeRec,
    "access" / Int32ul,  # TAG_ACCESS_*
    "dealloc" / Int32ul,  # alloc-dealloc-mismatch: the TAG_ALLOC_* the releasing function expects
    "pc" / Int64ul,  # faulting instruction, 0 = none
)

Crash = Struct(
    "signal" / Int32ul,
    "tid" / Int32ul,
    "address" / Int64ul,
    "code" / Int32ul,
    "stack" / Int32ul,
    "time" / Int32ul,
    "reserved" / Int32ul,
)

SnapInfo = Struct(
    "nonce" / Int64ul,  # the handoff request it served; 0 = written to a directory
    "seq" / Int32ul,
    "child" / Int32ul,  # the fork child that writes its core
    "tid" / Int32ul,
    "threads_stopped" / Int32ul,
    "reason" / Int32ul,
    "reserved" / Int32ul,
    "pause_ns" / Int64ul,
    "fork_ns" / Int64ul,
    "time_ms" / Int64ul,  # CLOCK_REALTIME ms
    "request_ns" / Int64ul,  # CLOCK_MONOTONIC of the oldest request it served
)

Control = Struct(
    "magic" / Bytes(16),
    "self" / Int64ul,
    "abi_version" / Int32ul,
    "tag_size" / Int32ul,
    "free_rec_size" / Int32ul,
    "canary_size" / Int32ul,
    "secret" / Int64ul,
    "start_realtime_ns" / Int64ul,
    "start_mono_ns" / Int64ul,
    "pid" / Int32ul,
    "options" / Int32ul,
    "stack_nodes" / Int64ul,
    "stack_capacity" / Int32ul,
    "stack_count" / Int32ul,
    "stack_full" / Int64ul,
    "threads" / Int64ul,
    "thread_capacity" / Int32ul,
    "thread_count" / Int32ul,
    "shadow_overflows" / Int64ul,
    "quarantine_bytes" / Int64ul,
    "quarantine_fill" / Int32ul,
    "page_size" / Int32ul,  # the system's (a guard page); 0 = not written: TAG_GUARD_PAGE
    "reason" / Int32ul,
    "snapshot_seq" / Int32ul,
    "snapshot_time_ms" / Int64ul,
    "snapshot_tid" / Int32ul,
    "anomaly_count" / Int32ul,
    "anomaly" / Anomaly,
    "crash" / Crash,
    "thread_state_bytes" / Int32ul,  # libtag's per-thread block from each record's shadow address
    "latent_uaf" / Int32ul,  # snapshot core: quarantined blocks found written after free
    "damaged_leaked" / Int64ul,  # blocks kept from glibc because their tag or canary was damaged
    "damaged_bytes" / Int64ul,
    "stack_stats" / Int64ul,  # address of struct libtag_stack_stats[] (the shared entries, by stack_stats_slots); 0 = not recorded
    "guard_pool" / Int64ul,  # first byte of the guard pool, 0 = none
    "guard_pool_bytes" / Int64ul,
    "guard_slots" / Int64ul,  # struct libtag_guard_slot[guard_capacity] (libtag's memory)
    "guard_slot_size" / Int32ul,  # bytes of one slot
    "guard_capacity" / Int32ul,  # slots the pool may hold
    "guard_rate" / Int32ul,  # one allocation in guard_rate is guarded, 0 = none
    "guard_used" / Int32ul,  # slots used at least once
    "guard_faults" / Int64ul,  # faults in the pool libtag handled
    "request_signal" / Int32ul,  # libtag takes sigqueue(TAG_SNAPSHOT_REQUEST) on it; 0 = taken
    "user_signal" / Int32ul,  # LIBTAG_SIGNAL while libtag handles it; 0 = off or taken
    "start_euid" / Int32ul,
    "handoff_fd" / Int32sl,  # in a handoff child: the pipe's read end; 0 = not yet, <0 = -errno
    "request_nonce" / Int64ul,  # written from outside: hand the next snapshot over
    "last" / SnapInfo,  # the latest snapshot taken
    "heap" / Int64ul,  # address of struct libtag_heap
    "stack_stats_slots" / Int64ul,  # address of uint32[stack_capacity]: each stack id's stack_stats entry, 0 = none
    "stack_stats_used" / Int32ul,  # the next entry number to give (numbers start at TAG_SHARD_ENTRIES)
    "reserved1" / Int32ul,
    "dir" / Bytes(512),  # the snapshot root, NUL-terminated; "" = none
    "stack_shards" / Int64ul,  # address of struct libtag_shard_chunk[stack_shard_capacity]; 0 = none
    "stack_shard_count" / Int32ul,  # chunk records in use (read min(count, capacity))
    "stack_shard_capacity" / Int32ul,  # chunk records reserved
)

# The per-stack counters (tag_abi.h, "per-stack counters"): a stack's
# counters are the sum of its entry in every thread's shard (chunk records
# at control.stack_shards) and of its shared entry (control.stack_stats);
# its peak is the most of the shards' peak_bytes.
StackStats = Struct(  # the shared entry
    "live_bytes" / Int64ul,  # live bytes of the blocks counted here (threads without a shard)
    "flushed" / Int64ul,  # libtag's running estimate of the stack's live bytes (not a count)
    "guarded" / Int64ul,  # allocations sent to the guard pool as a new site
    "allocs" / Int64ul,  # blocks counted here
)

StackShard = Struct(  # one stack's counters in one thread's shard
    "live_bytes" / Int64ul,  # this thread's allocations minus its frees of the stack's blocks (mod 2^64)
    "peak_bytes" / Int64ul,  # the most est = live_bytes + base has been
    "temporaries" / Int64ul,  # the stack's blocks it freed before it allocated anything else
    "allocs" / Int64ul,  # blocks of the stack it allocated
    "base" / Int64ul,  # est - live_bytes (mod 2^64)
    "hi" / Int64ul,  # refresh base above it (signed)
    "lo" / Int64ul,  # ... or below it
    "top" / Int64ul,  # libtag's own: min(hi, peak_bytes - base)
)

ShardChunk = Struct(  # a chunk of one thread's shard
    "entries" / Int64ul,  # address of struct libtag_stack_shard[TAG_SHARD_ENTRIES]; 0 = not ready
    "first" / Int32ul,  # entry number of entries[0]
    "tid" / Int32ul,  # the thread whose shard it is
)

TAG_SIZE = Tag.sizeof()  # 16
SLICE_SIZE = Slice.sizeof()  # 64
HEAP_SIZE = HeapHeader.sizeof()  # 72
FREE_REC_SIZE = FreeRec.sizeof()  # 16
STACK_NODE_SIZE = StackNode.sizeof()  # 16
THREAD_RECORD_SIZE = ThreadRecord.sizeof()  # 288
CONTROL_SIZE = Control.sizeof()  # 992
STACK_STATS_SIZE = StackStats.sizeof()  # 32
STACK_SHARD_SIZE = StackShard.sizeof()  # 64
SHARD_CHUNK_SIZE = ShardChunk.sizeof()  # 16
GUARD_SLOT_SIZE = GuardSlot.sizeof()  # 56

STRUCTS = {
    "libtag_tag": Tag,
    "libtag_slice": Slice,
    "libtag_heap": HeapHeader,
    "libtag_free_rec": FreeRec,
    "libtag_stack_node": StackNode,
    "libtag_shadow": Shadow,
    "libtag_thread": ThreadRecord,
    "libtag_qentry": QEntry,
    "libtag_quarantine_ring": QuarantineRing,
    "libtag_guard_slot": GuardSlot,
    "libtag_anomaly": Anomaly,
    "libtag_crash": Crash,
    "libtag_control": Control,
    "libtag_snapinfo": SnapInfo,
    "libtag_stack_stats": StackStats,
    "libtag_stack_shard": StackShard,
    "libtag_shard_chunk": ShardChunk,
}



def numpy_dtype(struct: Struct, *, flat: bool = False) -> np.dtype:
    """The numpy dtype of a Struct above, for bulk reads: the same fields at
    the same offsets (unnamed padding stays a gap), derived, never restated.
    flat: the fields of a nested Struct become fields of their own (a ring
    entry's "rec" gives free_stack, free_tid, free_time, check)."""
    names, formats, offsets, off = [], [], [], 0
    for sub in struct.subcons:
        if sub.name and not sub.name.startswith("_"):
            if flat and isinstance(sub.subcon, Struct):
                inner = numpy_dtype(sub.subcon, flat=True)
                for name in inner.names:
                    fmt, inner_off = inner.fields[name][:2]
                    names.append(name)
                    formats.append(fmt)
                    offsets.append(off + inner_off)
            else:
                names.append(sub.name)
                formats.append(_numpy_format(sub.subcon))
                offsets.append(off)
        off += sub.sizeof()
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": off})


def _numpy_format(con: Any) -> Any:
    if isinstance(con, FormatField):  # "<L", "<Q": little-endian, unsigned when upper case
        kind = "u" if con.fmtstr[1:].isupper() else "i"
        return np.dtype(f"<{kind}{con.sizeof()}")
    if isinstance(con, Array):
        return (_numpy_format(con.subcon), (con.count,))
    if isinstance(con, Bytes):
        return np.dtype((np.void, con.length))
    if isinstance(con, Struct):
        return numpy_dtype(con)
    raise TypeError(f"no numpy form for {con!r}")


STACK_NODE_DTYPE = numpy_dtype(StackNode)
THREAD_RECORD_DTYPE = numpy_dtype(ThreadRecord)
STACK_STATS_DTYPE = numpy_dtype(StackStats)
STACK_SHARD_DTYPE = numpy_dtype(StackShard)
SHARD_CHUNK_DTYPE = numpy_dtype(ShardChunk)
QENTRY_DTYPE = numpy_dtype(QEntry, flat=True)  # user, free_stack, free_tid, free_time, check
GUARD_SLOT_DTYPE = numpy_dtype(GuardSlot)
TAG_DTYPE = numpy_dtype(Tag)  # alloc_stack, alloc_time, bits
SLICE_DTYPE = numpy_dtype(Slice)
assert TAG_QUARANTINE_BYTES == QuarantineRing.sizeof()


def field_offsets(struct: Struct) -> dict[str, int]:
    """Byte offset of each named field (nested structs as "outer.inner")."""
    out: dict[str, int] = {}
    off = 0
    for sub in struct.subcons:
        if sub.name and not sub.name.startswith("_"):
            out[sub.name] = off
            inner = getattr(sub, "subcon", None)
            if isinstance(inner, Struct):
                for k, v in field_offsets(inner).items():
                    out[f"{sub.name}.{k}"] = off + v
        off += sub.sizeof()
    return out


SHADOW_OFFSETS = field_offsets(Shadow)


# ------------------------------------------------------------ check values --

_M64 = (1 << 64) - 1


def tag_check_fields(tag_addr: int, secret: int, bits: int, alloc_stack: int, alloc_time: int) -> int:
    """tag_check_fields() of tag_abi.h: bits is the bits word without its check."""
    h = (tag_addr ^ secret) & _M64
    h = ((h ^ bits) * TAG_MIX1) & _M64
    h = ((h ^ (alloc_time << 32 | alloc_stack)) * TAG_MIX2) & _M64
    return ((h ^ (h >> 32)) >> 16) & 0xFFFF


def tag_check_value(tag_addr: int, secret: int, tag: Any) -> int:
    """tag_check_value() of tag_abi.h for one tag (a parsed Tag container)."""
    return tag_check_fields(tag_addr, secret, tag.bits & ~TAG_CHECK_MASK & _M64, tag.alloc_stack,
                            tag.alloc_time)


def tag_bits(tid: int, size: int, state: int, kind: int = TAG_ALLOC_MALLOC) -> int:
    """tag_bits() of tag_abi.h: a tag's bits word, check excluded (bits 0..15 zero)."""
    sz = min(size, TAG_SIZE_BIG)
    return ((tid & TAG_TID_MASK) << TAG_TID_SHIFT | sz << TAG_SIZE_SHIFT | state << TAG_STATE_SHIFT
            | kind << TAG_ALLOC_SHIFT)


def tag_check_of(tag: Any) -> int:
    return tag.bits & TAG_CHECK_MASK


def tag_tid_of(tag: Any) -> int:
    return tag.bits >> TAG_TID_SHIFT & TAG_TID_MASK


def tag_size_field(tag: Any) -> int:
    return tag.bits >> TAG_SIZE_SHIFT & TAG_SIZE_FIELD


def tag_state_of(tag: Any) -> int:
    return tag.bits >> TAG_STATE_SHIFT & TAG_STATE_MASK


def tag_kind_of(tag: Any) -> int:
    return tag.bits >> TAG_ALLOC_SHIFT & TAG_ALLOC_MASK


def free_rec_check_value(tag_addr: int, secret: int, rec: Any) -> int:
    """free_rec_check_value() of tag_abi.h for one free record."""
    h = (tag_addr ^ secret ^ TAG_FREE_SALT) & _M64
    h = ((h ^ (rec.free_tid << 32 | rec.free_stack)) * TAG_MIX1) & _M64
    h = ((h ^ rec.free_time) * TAG_MIX2) & _M64
    return (h ^ (h >> 32)) & 0xFFFFFFFF


def tag_canary_value(tag_addr: int, secret: int) -> int:
    """tag_canary_value() of tag_abi.h."""
    return ((((tag_addr ^ secret) & _M64) * TAG_MIX2) & _M64) ^ (tag_addr >> 4)


_U32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S4 = np.uint64(4)
_NMIX1 = np.uint64(TAG_MIX1)
_NMIX2 = np.uint64(TAG_MIX2)
_NSALT = np.uint64(TAG_FREE_SALT)


def _u64(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.uint64)


_NCHECK = np.uint64(TAG_CHECK_MASK)
_S16 = np.uint64(16)


def np_tag_check(tag_addr: Any, secret: int, bits: Any, stack_time: Any) -> np.ndarray:
    """Vectorised tag_check_value over arrays of tags, given as the tag's two
    64-bit words: stack_time = alloc_time << 32 | alloc_stack (word 0), bits
    (word 1; its check bits are ignored).  Returns uint16."""
    with np.errstate(over="ignore"):
        h = _u64(tag_addr) ^ np.uint64(secret)
        h = (h ^ (_u64(bits) & ~_NCHECK)) * _NMIX1
        h = (h ^ _u64(stack_time)) * _NMIX2
        return (((h ^ (h >> _S32)) >> _S16) & _NCHECK).astype(np.uint16)


def np_free_rec_check(tag_addr: Any, secret: int, stack_tid: Any, free_time: Any) -> np.ndarray:
    """Vectorised free_rec_check_value: stack_tid = free_tid << 32 | free_stack
    (the record's first word), free_time its third uint32.  Returns uint32."""
    with np.errstate(over="ignore"):
        h = _u64(tag_addr) ^ np.uint64(secret) ^ _NSALT
        h = (h ^ _u64(stack_tid)) * _NMIX1
        h = (h ^ (_u64(free_time) & _U32)) * _NMIX2
        return ((h ^ (h >> _S32)) & _U32).astype(np.uint32)


def np_tag_canary(tag_addr: Any, secret: int) -> np.ndarray:
    """Vectorised tag_canary_value.  Returns uint64."""
    a = _u64(tag_addr)
    with np.errstate(over="ignore"):
        return ((a ^ np.uint64(secret)) * _NMIX2) ^ (a >> _S4)


# ----------------------------------------------------------- control block --


class NoLibtagError(InputError):
    """The memory holds no libtag control block."""


class AbiVersionError(InputError):
    """The control block was written by a libtag of another ABI version."""


def _control_candidates(region: Region) -> list[int]:
    """Addresses in region where the 16 bytes of TAG_CONTROL_MAGIC start (8-aligned).

    Vectorised: the region is viewed as 64-bit words and compared with the
    magic's first word; only hits are checked further.
    """
    arr = region.array
    n8 = len(arr) // 8
    if n8 < 2:
        return []
    words = arr[: n8 * 8].view("<u8")
    first = np.frombuffer(TAG_CONTROL_MAGIC[:8], "<u8")[0]
    second = np.frombuffer(TAG_CONTROL_MAGIC[8:], "<u8")[0]
    hits = np.flatnonzero(words[:-1] == first)
    if len(hits):
        hits = hits[words[hits + 1] == second]
    return [region.start + int(i) * 8 for i in hits]


def _libtag_run(regions: list[Region]) -> set[int]:
    """Starts of libtag's own mappings and of the anonymous ones right after
    them: its .bss, which the kernel splits where parts of it have other
    protections (the debug build's is three mappings)."""
    out: set[int] = set()
    prev_end = None
    for r in sorted(regions, key=lambda r: r.start):
        if "libtag" in (r.path or "") or (r.path is None and r.start == prev_end):
            out.add(r.start)
            prev_end = r.end
        else:
            prev_end = None
    return out


def find_control(mem: Memory) -> tuple[int, Any]:
    """(address, parsed Control) of the libtag control block in mem.

    Searches the writable regions, libtag's own (its file mappings and the
    .bss after them) and small ones first (the block is in libtag's .bss, or
    the program's with a static libtag).  A hit counts only if its ``self``
    field equals its address.  Raises NoLibtagError if no region holds one,
    AbiVersionError if it is of another ABI version.
    """
    every = mem.regions()
    ours = _libtag_run(every)
    regions = [r for r in every if r.writable]

    def order(r: Region) -> tuple[int, int]:
        return (0 if r.start in ours else 1, r.end - r.start)

    mismatch = None
    for region in sorted(regions, key=order):
        try:
            cands = _control_candidates(region)
        except Exception:  # an unreadable region: skip it  # noqa: BLE001
            continue
        for addr in cands:
            try:
                raw = mem.read(addr, CONTROL_SIZE)
            except InputError:
                continue
            ctl = Control.parse(raw)
            if ctl.self != addr:
                continue
            if ctl.abi_version != TAG_ABI_VERSION:
                mismatch = (addr, ctl.abi_version)
                continue
            return addr, ctl
    what = getattr(mem, "name", "memory")
    if mismatch is not None:
        raise AbiVersionError(
            f"libtag control block at {mismatch[0]:#x} in {what} has ABI version {mismatch[1]}, "
            f"this forensics reads version {TAG_ABI_VERSION}: use the forensics that matches "
            f"the libtag the process ran with"
        )
    raise NoLibtagError(f"no libtag control block in {what}: the process did not run under libtag")
