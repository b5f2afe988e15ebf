"""A core as one Sentry event (``forensics inspect CORE --sentry``): the
record a crash pipeline that takes Sentry's event format (Sentry, self-
hosted or not) stores and groups, with what only this tool knows in it.

The event (Sentry's event payload, platform ``native``):

- ``exception``: one value - the anomaly (``type`` its kind) or the crash
  (``type`` the signal, with its number and code in the mechanism's
  ``meta.signal``) - whose ``stacktrace`` is the detecting or faulting
  stack, and whose ``value`` is the one-line summary;
- ``threads``: every thread with its stack, the crashed one marked;
- ``debug_meta.images``: every module the process had loaded, with its
  ``code_id`` (the GNU build-id, hex) and ``debug_id`` (the build-id's
  first 16 bytes as a GUID, as Sentry derives it for ELF files), its
  address and size, so that Sentry's own symbolication can match them;
- ``fingerprint``: the crash signature's id (forensics/answers/signature.py),
  so that Sentry groups as ``forensics triage`` does;
- ``tags``: the signature id and kind; ``extra.forensics``: the signature,
  the core's path, and for a heap anomaly or a crash on a heap address the
  block with its allocation and free stacks (docs/json.md, "block").

Frames are listed outermost first (Sentry's order), each with
``instruction_addr``, ``function``, ``package`` (its module), ``filename``
and ``lineno`` where known, and ``in_app`` false for the C runtime's and
the allocator's frames (those the signature folds).  The event's id is
derived from the core (its path and the event's time), so the same core
gives the same event.
"""

from __future__ import annotations

import os
import signal as _signal
import uuid
from typing import Any

from forensics.answers.documents import CrashDoc, FrameDoc, InspectDoc, to_json
from forensics.answers.signature import event_time, folded, subject

_NAMESPACE = uuid.UUID("6f7e1d62-4a8b-4f58-9c39-7b1f9a6b1e0d")


def debug_id(build_id: bytes) -> str:
    """Sentry's debug id of an ELF file: the first 16 bytes of its build-id
    (zero-padded) read as a little-endian GUID."""
    raw = (build_id + bytes(16))[:16]
    return str(uuid.UUID(bytes_le=raw))


def _frame(f: FrameDoc) -> dict[str, Any]:
    out: dict[str, Any] = {"instruction_addr": f.address}
    if f.function:
        out["function"] = f.function
    if f.module:
        out["package"] = f.module
    if f.file:
        out["filename"] = os.path.basename(f.file)
        out["abs_path"] = f.file
    if f.line:
        out["lineno"] = f.line
    out["in_app"] = not folded(f)
    return out


def _stacktrace(frames: list[FrameDoc]) -> dict[str, Any]:
    """A stack as Sentry lists it: the outermost frame first."""
    return {"frames": [_frame(f) for f in reversed(frames)]}


def sentry_event(dump, doc: InspectDoc) -> dict[str, Any]:
    """The Sentry event of the core *dump* whose inspect document is *doc*:
    plain JSON data (Sentry's format; the signature and the block in its
    ``extra`` through to_json, as inspect --json prints them)."""
    sig = doc.signature
    about = subject(doc.anomalies, doc.crash)
    crash = about if isinstance(about, CrashDoc) else None
    core = doc.core
    try:
        fallback = os.stat(core).st_mtime
    except OSError:
        fallback = 0.0
    when = event_time(doc.anomalies, doc.crash, fallback)
    block = None
    if about is not None and crash is None:  # an anomaly
        a = about
        value = {"type": a.kind, "value": f"{a.kind} at {a.address}",
                 "mechanism": {"type": "forensics", "handled": False,
                               "description": f"detected by {a.detected_by or 'libtag'}"},
                 "stacktrace": _stacktrace(a.stack or (a.block.free_stack if a.block is not None else None)
                                           or [])}
        thread = a.thread
        block = a.block
    elif crash is not None:
        number = int(getattr(_signal.Signals, crash.signal, 0)) or None
        meta = {"signal": {"name": crash.signal}}
        if number is not None:
            meta["signal"]["number"] = number
        if crash.code is not None:
            meta["signal"]["code"] = crash.code
        if crash.code_name:
            meta["signal"]["code_name"] = crash.code_name
        value = {"type": crash.signal, "value": crash.summary,
                 "mechanism": {"type": "signalhandler", "handled": False, "meta": meta},
                 "stacktrace": _stacktrace(crash.stack)}
        thread = crash.thread
        block = crash.address_owner.block if crash.address_owner is not None else None
    else:
        value = {"type": "snapshot", "value": f"a snapshot ({doc.reason}) with no anomaly or crash",
                 "mechanism": {"type": "forensics", "handled": True}, "stacktrace": {"frames": []}}
        thread = None
    if thread is not None:
        value["thread_id"] = thread
    threads = [{"id": t.tid, "crashed": t.tid == thread, "current": t.tid == thread,
                "stacktrace": _stacktrace(t.stack)} for t in doc.threads]
    images = []
    for m in dump.symbolizer.modules:
        image = {"type": "elf", "code_file": m.path, "debug_file": m.path,
                 "image_addr": f"{m.start:#x}", "image_size": m.end - m.start}
        if m.build_id:
            image["code_id"] = m.build_id.hex()
            image["debug_id"] = debug_id(m.build_id)
        images.append(image)
    proc = doc.process
    extra = {"core": core, "signature": to_json(sig), "block": to_json(block), "libtag": doc.libtag,
             "reason": doc.reason}
    event = {
        "event_id": uuid.uuid5(_NAMESPACE, f"{os.path.abspath(core)}\0{when!r}").hex,
        "timestamp": when,
        "platform": "native",
        "level": "fatal" if sig is not None else "info",
        "logger": "forensics",
        "exception": {"values": [value]},
        "threads": {"values": threads},
        "debug_meta": {"images": images},
        "contexts": {"os": {"type": "os", "name": "Linux"},
                     "process": {"type": "default", "pid": proc.pid, "exe": proc.exe}},
        "tags": {"forensics.kind": value["type"]},
        "extra": {"forensics": extra},
    }
    if sig is not None:
        event["fingerprint"] = [f"forensics-{sig.id}"]
        event["tags"]["forensics.signature"] = sig.id
    return event


__all__ = ["debug_id", "sentry_event"]
