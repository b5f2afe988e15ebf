"""The thread pointers of an aarch64 core that does not hold them:
qemu-user's cores have no NT_ARM_TLS note, and without tpidr_el0 neither
a thread's tcache nor its static TLS can be found.

glibc on aarch64 keeps TLS variant I (TLS_DTV_AT_TP): the thread pointer
points at the TCB (``tcbhead_t``: the DTV pointer, then a private word),
the thread's ``struct pthread`` lies right below it, and the static TLS
blocks of the modules follow it from tp + 16.  So for each thread of the
core its ``struct pthread`` is looked for by what it holds - the thread's
id at ``tid`` (offset 208 in glibc 2.3x: 24 words of padding, then the
``list`` links) and ``list`` linked both ways with its neighbours - and
the thread pointer is the address ``sizeof(struct pthread)`` above it.
That size is found once, from the first thread: the smallest one whose
TCB holds a DTV (a pointer to an array whose length word is sane) that
has an entry at tp + 16 or above, within 64 KiB (the first module's
static TLS).  A thread whose descriptor is not found keeps no thread
pointer (the answers say what they cannot tell without it).
"""

from __future__ import annotations

from forensics._np import np

PD_LIST = 192  # offsetof(struct pthread, list): after header/padding (24 words)
PD_TID = 208  # offsetof(struct pthread, tid)
MIN_PD, MAX_PD = 0x400, 0x1000  # sizeof(struct pthread) is 1856 in 2.36
TLS_SPAN = 1 << 16


def _u64(mem, addr: int) -> int | None:
    try:
        return int.from_bytes(mem.read(addr, 8), "little")
    except Exception:  # noqa: BLE001 - unreadable: not this one
        return None


def _linked(mem, pd: int) -> bool:
    """pd's list links point at neighbours that point back at it."""
    nxt, prv = _u64(mem, pd + PD_LIST), _u64(mem, pd + PD_LIST + 8)
    if not nxt or not prv:
        return False
    return _u64(mem, nxt + 8) == pd + PD_LIST and _u64(mem, prv) == pd + PD_LIST


def _descriptors(mem, tid: int) -> list[int]:
    """Addresses of the struct pthread candidates of thread tid."""
    out = []
    for r in mem.regions():
        if not r.writable:
            continue
        arr = r.array
        n = len(arr) // 8 * 8
        if n < PD_TID + 8:
            continue
        words = arr[:n].view("<u4")
        # tid at an address = pd + 208, pd 16-aligned
        for i in np.nonzero(words == np.uint32(tid))[0]:
            addr = r.start + 4 * int(i)
            pd = addr - PD_TID
            if pd % 16 == 0 and pd >= r.start and _linked(mem, pd):
                out.append(pd)
    return out


def _has_dtv(mem, tp: int) -> bool:
    dtv = _u64(mem, tp)
    if not dtv or dtv % 8:
        return False
    length = _u64(mem, dtv - 16)  # dtv[-1].counter
    if length is None or not 0 < length < 4096:
        return False
    try:
        raw = mem.read(dtv + 16, 16 * min(int(length), 64))
    except Exception:  # noqa: BLE001
        return False
    vals = np.frombuffer(raw[: len(raw) // 16 * 16], "<u8")[0::2]
    return bool(np.any((vals >= tp + 16) & (vals < tp + TLS_SPAN)))


def thread_pointers(mem, tids: list[int]) -> dict[int, int]:
    """{tid: thread pointer} for the threads whose descriptor is found."""
    found: dict[int, int] = {}
    size = None
    for tid in tids:
        for pd in _descriptors(mem, tid):
            if size is None:
                size = next((s for s in range(MIN_PD, MAX_PD, 16) if _has_dtv(mem, pd + s)), None)
                if size is None:
                    continue
            if _has_dtv(mem, pd + size):
                found[tid] = pd + size
                break
    return found


__all__ = ["thread_pointers"]
