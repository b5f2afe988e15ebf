"""The leak check at exit (``forensics run --leaks``): one process's lost
blocks, LSan-style, with suppressions.

    sup = Suppressions.parse(text, "my.supp")   # InputError names the bad line
    doc = leak_check_doc(dump, sup)             # a LeakCheckDoc: docs/json.md, "run --leaks"

The leaks themselves are leaks.py's (the reachability scan, checked against
valgrind's memcheck); this module groups them for a report, drops the
suppressed ones and counts what is left.  Groups whose stacks read the same
(function, file, line and module of every frame: e.g. two call sites on one
line of an unrolled loop) are one group here.

Suppressions, one per line (docs/guide.md, "Leak check at exit"): ``leak:PATTERN``
as LSan writes them, or the bare PATTERN; ``#`` starts a comment.  PATTERN
matches anywhere in a frame's function name, source file or module path; ``*``
matches any run of characters, a leading ``^`` or trailing ``$`` anchors it.
A group is suppressed when any frame of its allocation stack matches.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Sequence

from forensics.answers.documents import (Counts, FrameDoc, LeakAge, LeakCheckDoc, LeakGroupDoc, LeakTotals,
                                         Suppressed, SuppressedPattern)
from forensics.answers.inspect import inspect_reason
from forensics.answers.leaks import LeakScan, leaks_doc
from forensics.errors import InputError
from forensics.reader.dump import Dump

# What makes forensics run --leaks fail: the kinds LSan reports.
FAILING_KINDS = ("definite", "indirect")
KINDS = ("definite", "indirect", "possible")

# "race:x", "leak:x" name a type; "std::vector" does not.
_TYPED = re.compile(r"^([A-Za-z_]+):(?!:)(.*)$")


@dataclass
class Suppression:
    pattern: str  # as written
    line: int
    regex: re.Pattern = field(repr=False)


@dataclass
class Suppressions:
    source: str
    rules: list[Suppression]

    @classmethod
    def parse(cls, text: str, source: str) -> "Suppressions":
        """Parse a suppression file's text; InputError names the first bad line."""
        rules = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            m = _TYPED.match(line)
            if m:
                if m.group(1) != "leak":
                    raise InputError(f"{source}:{n}: unknown suppression type {m.group(1)!r}: "
                                     f"expected leak:PATTERN or PATTERN")
                line = m.group(2).strip()
            if not line or line in ("^", "$", "^$"):
                raise InputError(f"{source}:{n}: empty suppression pattern")
            rules.append(Suppression(line, n, _compile(line)))
        return cls(source, rules)

    def match(self, stack: Sequence[FrameDoc]) -> Suppression | None:
        """The first rule that matches a frame of stack, or None."""
        for rule in self.rules:
            for f in stack:
                for text in (f.function, f.file, f.module):
                    if text and rule.regex.search(text):
                        return rule
        return None


def _compile(pattern: str) -> re.Pattern:
    head = pattern.startswith("^")
    tail = pattern.endswith("$") and len(pattern) > (1 if head else 0)
    body = pattern[1 if head else 0: len(pattern) - (1 if tail else 0)]
    rx = ".*".join(re.escape(part) for part in body.split("*"))
    return re.compile(("^" if head else "") + rx + ("$" if tail else ""))


def _frame_key(stack: Sequence[FrameDoc]) -> tuple:
    return tuple((f.function, f.file, f.line, f.module) if f.function
                 else (f.address,) for f in stack)


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None else a + b


def _merge(groups: list[LeakGroupDoc]) -> list[LeakGroupDoc]:
    """One group per (kind, stack as it reads): counts summed, the first's id."""
    out: dict[tuple, LeakGroupDoc] = {}
    for g in groups:
        key = (g.kind, _frame_key(g.stack))
        have = out.get(key)
        if have is None:
            out[key] = g
            continue
        age = have.age_ms
        if age is not None and g.age_ms is not None:
            age = LeakAge(oldest=max(age.oldest, g.age_ms.oldest), newest=min(age.newest, g.age_ms.newest))
        out[key] = dataclasses.replace(
            have,
            blocks=have.blocks + g.blocks, bytes=have.bytes + g.bytes,
            indirect_blocks=_add(have.indirect_blocks, g.indirect_blocks),
            indirect_bytes=_add(have.indirect_bytes, g.indirect_bytes),
            cycle_leaders=_add(have.cycle_leaders, g.cycle_leaders),
            oldest_alloc_ms=min(have.oldest_alloc_ms, g.oldest_alloc_ms),
            newest_alloc_ms=max(have.newest_alloc_ms, g.newest_alloc_ms),
            age_ms=age,
            # the lowest of both: each group's own are its lowest, so these are
            # the merged group's lowest, as many as one group would show
            examples=sorted(set(have.examples) | set(g.examples),
                            key=lambda a: int(a, 16))[:LeakScan.MAX_EXAMPLES])
    rank = {k: i for i, k in enumerate(KINDS)}
    return sorted(out.values(), key=lambda g: (rank[g.kind], -g.bytes, g.stack_id))


def leak_check_doc(dump: Dump, suppressions: Suppressions | None = None) -> LeakCheckDoc:
    """One process's leak check (docs/json.md, ``forensics run --leaks``)."""
    groups = _merge(leaks_doc(dump))
    kept, counts = [], {}
    sup_blocks = sup_bytes = 0
    for g in groups:
        rule = suppressions.match(g.stack) if suppressions is not None else None
        if rule is not None:
            sup_blocks += g.blocks
            sup_bytes += g.bytes
            c = counts.setdefault(rule.pattern, [0, 0])
            c[0] += g.blocks
            c[1] += g.bytes
            continue
        kept.append(g)
    totals = {k: [0, 0] for k in KINDS}
    for g in kept:
        totals[g.kind][0] += g.blocks
        totals[g.kind][1] += g.bytes
    return LeakCheckDoc(
        pid=dump.pid,
        exe=dump.exe,
        core=dump.core.path if dump.core is not None else dump.mem.name,
        reason=inspect_reason(dump.control),
        leaks=kept,
        totals=LeakTotals(**{k: Counts(blocks=n, bytes=b) for k, (n, b) in totals.items()}),
        suppressed=Suppressed(
            blocks=sup_blocks,
            bytes=sup_bytes,
            patterns=[SuppressedPattern(pattern=p, blocks=b, bytes=n) for p, (b, n) in counts.items()],
        ),
        leaked=any(totals[k][0] for k in FAILING_KINDS),
        warnings=list(dump.control.warnings),
    )


__all__ = ["FAILING_KINDS", "Suppression", "Suppressions", "leak_check_doc"]
