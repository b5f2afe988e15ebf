"""A span of libtag's heap becomes visible to a reader only when all a
reader trusts of it is written.

A snapshot stops every thread wherever it is, and the reader then walks the
heap from the slice table: a SMALL span's slots [0, carved) of block_size
bytes, each starting with a tag or bits 0 (no block); a LARGE span's slot at
block_off.  So at every instruction, a span whose kind says SMALL must have
its class's slot size and a carved count whose slots all read bits 0 or a
tag, and a LARGE span's slot must read bits 0 until its tag is written.  A
reused span holds old bytes: written in the wrong order, a snapshot taken
in between shows them as a tag "written over" (the load soak found one in
~250 cores: a thread stopped between publishing a span's carved count and
zeroing the new slot's bits).

GIVEN tests/victims/heap_publish.c under libtag (no quarantine, no guard
sampling): a 150 KiB block filled with 0xce and freed, then eight blocks of
a class nothing used before (1500 bytes: 1536-byte slots) carved from the
freed span's first slice, a 100 KiB block in the two slices left, and a
3000-byte block aligned to 4096 (a forward record at its slot's start)
WHEN gdb watches the slice table entries of those spans (hardware
watchpoints: each stop is right after the store) and stops where the
forward record is written
THEN each span's kind is published with its fields already written, each
carved slot's bits read 0 the moment the carved count includes it, the
large block's slot reads bits 0 the moment its span is LARGE, and the
forward record is written after the tag it points at is whole
AND a core gcore takes at the moment the second slot is carved reads without
a warning.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import forensics_test_support as S
from forensics import libpath

pytestmark = pytest.mark.skipif(not S.have_gdb(), reason="gdb is not installed")

SLICE = 65536
SMALL, LARGE = 1, 2  # enum libtag_span_kind
BLOCK = 1536         # the slot size of 1500-byte blocks (1500 + 24 bytes)
STATE_SHIFT, LIVE = 58, 1  # the tag's state field (tag_abi.h)

# The slice table's entry (struct libtag_slice, tag_abi.h): 64 bytes.
WATCHER = r'''
import gdb, json
ENTRY, KIND, BLOCK_SIZE, CAPACITY, CARVED, BLOCK_OFF = 64, 8, 20, 24, 28, 36
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("set startup-with-shell off")
for k, v in ENV.items():
    gdb.execute(f"set environment {k} {v}")
gdb.execute("break spans_ready")
gdb.execute("run")
inf = gdb.selected_inferior()
u32 = lambda a: int.from_bytes(inf.read_memory(a, 4), "little")
u64 = lambda a: int.from_bytes(inf.read_memory(a, 8), "little")
big = int(gdb.parse_and_eval("(unsigned long)big"))
base = int(gdb.parse_and_eval("(unsigned long)_tag_heap.base"))
meta = int(gdb.parse_and_eval("(unsigned long)_tag_heap.meta"))
i = (big - 16 - base) // SLICE
a, b = meta + ENTRY * i, meta + ENTRY * (i + 1)
start_a, start_b = base + SLICE * i, base + SLICE * (i + 1)
watch = {
    gdb.Breakpoint(f"*(unsigned int *){a + KIND:#x}", gdb.BP_WATCHPOINT, gdb.WP_WRITE).number: "small kind",
    gdb.Breakpoint(f"*(unsigned int *){a + CARVED:#x}", gdb.BP_WATCHPOINT, gdb.WP_WRITE).number: "carved",
    gdb.Breakpoint(f"*(unsigned int *){b + KIND:#x}", gdb.BP_WATCHPOINT, gdb.WP_WRITE).number: "large kind",
}
hits = []
def on_stop(ev):
    for bp in getattr(ev, "breakpoints", []):
        what = watch.get(bp.number)
        if what is None:
            continue
        if what == "large kind":
            off = u32(b + BLOCK_OFF)
            hits.append({"what": what, "kind": u32(b + KIND), "block_off": off,
                         "bits": u64(start_b + off + 8)})
            continue
        kind, bs, carved = u32(a + KIND), u32(a + BLOCK_SIZE), u32(a + CARVED)
        h = {"what": what, "kind": kind, "block_size": bs, "carved": carved,
             "capacity": u32(a + CAPACITY)}
        if kind == SMALL_KIND and carved and 16 <= bs <= SLICE:
            h["bits"] = u64(start_a + (carved - 1) * bs + 8)
            if what == "carved" and carved == 2:
                gdb.execute(f"gcore {CORE}")
        hits.append(h)
fwd = gdb.Breakpoint("_tag_write_forward")
def on_forward(ev):
    if any(bp.number == fwd.number for bp in getattr(ev, "breakpoints", [])):
        tag = int(gdb.parse_and_eval("$rdi"))
        hits.append({"what": "forward", "tag_state": u64(tag + 8) >> STATE_SHIFT & 3})
gdb.events.stop.connect(on_stop)
gdb.events.stop.connect(on_forward)
while True:
    try:
        gdb.execute("continue")
    except gdb.error:
        break
print("HITS " + json.dumps({"slice": i, "hits": hits}))
'''


def watch(victim, tmp_path) -> tuple[dict, str, object]:
    core = tmp_path / "carved2.core"
    script = tmp_path / "watch.py"
    env = {"LD_PRELOAD": str(libpath.lib_path()), "LIBTAG_QUARANTINE": "0", "LIBTAG_GUARD_RATE": "0",
           "LIBTAG_GUARD_SITES": "0", "LIBTAG_DIR": str(tmp_path / "snaps"), "LIBTAG_LOG": "off"}
    script.write_text(f"SLICE = {SLICE}\nSMALL_KIND = {SMALL}\nSTATE_SHIFT = {STATE_SHIFT}\nENV = {env!r}\n"
                      f"CORE = {str(core)!r}\n"
                      + WATCHER)
    done = subprocess.run(["gdb", "--batch", "-nx", "-iex", "set debuginfod enabled off",
                           "-x", str(script), str(victim)],
                          capture_output=True, text=True, timeout=300)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("HITS ")]
    assert line, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(line[0][5:]), done.stdout, core


def test_spans_are_published_after_what_a_reader_trusts(build_victim, tmp_path, run_cli):
    victim = build_victim("heap_publish", instrument=False)
    got, out, core = watch(victim, tmp_path)
    assert "done" in out, out[-3000:]
    hits = got["hits"]
    # THEN the small span became SMALL once, with its slot size and nothing carved yet
    small = [h for h in hits if h["what"] == "small kind" and h["kind"] == SMALL]
    assert [(h["block_size"], h["carved"]) for h in small] == [(BLOCK, 0)], hits
    # AND each of the eight slots read bits 0 the moment carved counted it
    carved = [(h["carved"], h.get("bits")) for h in hits if h["what"] == "carved" and h["kind"] == SMALL]
    assert carved == [(k, 0) for k in range(1, 9)], hits
    # AND the large block's span became LARGE with its slot at the slice's start reading bits 0
    large = [(h["block_off"], h["bits"]) for h in hits if h["what"] == "large kind" and h["kind"] == LARGE]
    assert large == [(0, 0)], hits
    # AND the aligned block's forward record was written after the tag it points at
    assert [h["tag_state"] for h in hits if h["what"] == "forward"] == [LIVE], hits
    # AND the core taken as the second slot was carved (over 0xce bytes) has no warning
    r = run_cli("inspect", str(core), "--json", env={"XDG_STATE_HOME": str(tmp_path / "state")}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warnings"] == []
