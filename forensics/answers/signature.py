"""A crash signature: one stable key per bug, so that a fleet's cores of
the same bug group together (``forensics triage``, the fingerprint of a
Sentry event) while another bug keeps its own.

The signature of an inspect document (docs/json.md, "signature", version
SIGNATURE_VERSION) is made of:

- the kind: the anomaly libtag detected (``double-free``...), else the
  crash's signal (``SIGSEGV``), else a use-after-free the reader found in
  a freed block; a core with none of them (a snapshot taken on demand)
  has no signature;
- the first FRAMES meaningful frames of the stack that detected or took
  it (the anomaly's, the crash's): frames of the allocator, of libtag, of
  the abort machinery and of the C runtime's start are folded away, as
  Socorro's sentinel and irrelevant-frame lists do, since the same bug
  reaches them by the same path whatever the allocator or libc;
- for a heap anomaly, the first ALLOC_FRAMES meaningful frames of the
  block's allocation stack (its allocation site): the same wrong free of
  two different objects is two bugs.

A frame is named by its function without its parameter list (overloads
and ABI tags vary less than the rest of a name); a frame with no
function by its module's file name and module offset (``server+0x1a2b``:
the same in every process of one build, unlike an address).  The text of
the signature joins them (``double-free | release | main | alloc:
make_node | main``) and its id is the first 16 hex digits of its SHA-256.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
from typing import Sequence

from forensics.answers.documents import AnomalyDoc, CrashDoc, FrameDoc, SignatureDoc

SIGNATURE_VERSION = 1
FRAMES = 3
ALLOC_FRAMES = 2

# Anomalies whose block's allocation site is part of the signature.
HEAP_ANOMALIES = frozenset({"double-free", "use-after-free", "heap-overflow", "heap-underflow",
                            "alloc-dealloc-mismatch", "invalid-free"})

# Functions folded away wherever they are: the allocator's entry points and
# internals, the abort and signal machinery, C++'s allocation operators and
# terminate handlers, and the C runtime's start and thread start.
_FOLDED = re.compile(r"""^(?:
    (?:__GI_|__libc_)?(?:malloc|free|calloc|realloc|reallocarray|memalign|aligned_alloc
        |posix_memalign|valloc|pvalloc|cfree|malloc_usable_size)
  | _int_(?:malloc|free|realloc|memalign)(?:_.*)?
  | malloc_printerr|malloc_consolidate|unlink_chunk|tcache_\w+|arena_get\w*|sysmalloc\w*
  | (?:__GI_)?(?:raise|abort|gsignal|__pthread_kill\w*|pthread_kill|__assert_fail\w*
        |__libc_message\w*|__fortify_fail|__stack_chk_fail|__chk_fail)
  | operator\s(?:new|delete)(?:\[\])?
  | __cxa_\w+|__cxxabiv1::\w+|std::terminate|__gnu_cxx::__verbose_terminate_handler
  | _Zn[wa]\w*|_Zd[la]\w*
  | _start|__libc_start_main\w*|__libc_start_call_main|start_thread|clone3?|__clone\w*
)$""", re.X)

# Modules whose every frame is folded: libtag's own.
_FOLDED_MODULE = re.compile(r"^libtag(?:[.-].*)?\.so")


def frame_name(frame: FrameDoc) -> str | None:
    """A frame as the signature names it (see the module's docstring); None
    for a frame without function or module."""
    fn = frame.function
    if fn:
        return _without_parameters(fn)
    if frame.module and frame.module_offset:
        return f"{os.path.basename(frame.module)}+{frame.module_offset}"
    return None


def _without_parameters(fn: str) -> str:
    """"ns::Type::method(int) const" -> "ns::Type::method"; an operator's
    own parentheses ("operator()") stay."""
    depth = 0
    for i, ch in enumerate(fn):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and not fn[:i].endswith("operator"):
            return fn[:i]
    return fn


def folded(frame: FrameDoc) -> bool:
    """Whether a frame is folded away (see the module's docstring)."""
    if frame.libtag:
        return True
    module = frame.module
    if module and _FOLDED_MODULE.match(os.path.basename(module)):
        return True
    name = frame_name(frame)
    return name is None or bool(_FOLDED.match(name))


def meaningful(frames: Sequence[FrameDoc] | None, limit: int) -> list[str]:
    """The names of the first *limit* frames that are not folded."""
    out = []
    for f in frames or ():
        if not folded(f):
            out.append(frame_name(f))
            if len(out) == limit:
                break
    return out


def subject(anomalies: Sequence[AnomalyDoc], crash: CrashDoc | None) -> AnomalyDoc | CrashDoc | None:
    """What a core's signature, triage's answer and a Sentry event's
    exception are about: the anomaly libtag recorded, else the crash, else
    an anomaly the reader found (a write into a freed block); None for a
    core with neither."""
    recorded = [a for a in anomalies if a.detected_by == "libtag"]
    if recorded:
        return recorded[0]
    if crash is not None:
        return crash
    return anomalies[0] if anomalies else None


def event_time(anomalies: Sequence[AnomalyDoc], crash: CrashDoc | None, fallback: float) -> float:
    """When the subject happened (seconds since the epoch), as libtag
    recorded it; fallback when it did not (a kernel's crash core)."""
    s = subject(anomalies, crash)
    when = s.time if s is not None else None
    if when:
        try:
            return _dt.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return fallback


def signature(anomalies: Sequence[AnomalyDoc], crash: CrashDoc | None) -> SignatureDoc | None:
    """The signature of an inspect document (docs/json.md, "signature"), from
    its anomalies and its crash; None when the core has no anomaly and no
    crash."""
    s = subject(anomalies, crash)
    alloc: list[str] = []
    if s is None:
        return None
    if isinstance(s, CrashDoc):
        kind, stack = s.signal, s.stack
    elif s.detected_by == "libtag":
        kind, stack = s.kind, s.stack
        if kind in HEAP_ANOMALIES and s.block is not None:
            alloc = meaningful(s.block.alloc_stack, ALLOC_FRAMES)
    else:
        # found by the reader in a freed block: no detecting stack; the
        # block's free and allocation sites say where
        kind = s.kind
        stack = s.block.free_stack if s.block is not None else None
        alloc = meaningful(s.block.alloc_stack if s.block is not None else None, ALLOC_FRAMES)
    frames = meaningful(stack, FRAMES)
    text = " | ".join([kind, *frames] + ([f"alloc: {alloc[0]}", *alloc[1:]] if alloc else []))
    return SignatureDoc(version=SIGNATURE_VERSION, kind=kind, frames=frames, alloc_frames=alloc, text=text,
                        id=hashlib.sha256(text.encode()).hexdigest()[:16])


__all__ = ["ALLOC_FRAMES", "FRAMES", "SIGNATURE_VERSION", "event_time", "folded", "frame_name",
           "meaningful", "signature", "subject"]
