"""The leak check at exit (``forensics run --leaks``): one process's lost
blocks, LSan-style, with suppressions.

    sup = Suppressions.parse(text, "my.supp")   # InputError names the bad line
    doc = leak_check_doc(dump, sup)             # docs/json.md, "run --leaks"

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

import re
from dataclasses import dataclass, field

from forensics.answers.inspect import inspect_reason
from forensics.answers.leaks import LeakScan, leaks_json
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

    def match(self, stack: list[dict]) -> Suppression | None:
        """The first rule that matches a frame of stack (frame JSON), or None."""
        for rule in self.rules:
            for f in stack:
                for text in (f.get("function"), f.get("file"), f.get("module")):
                    if text and rule.regex.search(text):
                        return rule
        return None


def _compile(pattern: str) -> re.Pattern:
    head = pattern.startswith("^")
    tail = pattern.endswith("$") and len(pattern) > (1 if head else 0)
    body = pattern[1 if head else 0: len(pattern) - (1 if tail else 0)]
    rx = ".*".join(re.escape(part) for part in body.split("*"))
    return re.compile(("^" if head else "") + rx + ("$" if tail else ""))


def _frame_key(stack: list[dict]) -> tuple:
    return tuple((f["function"], f["file"], f["line"], f["module"]) if f["function"]
                 else (f["address"],) for f in stack)


def _merge(groups: list[dict]) -> list[dict]:
    """One group per (kind, stack as it reads): counts summed, the first's id."""
    out: dict[tuple, dict] = {}
    for g in groups:
        key = (g["kind"], _frame_key(g["stack"]))
        have = out.get(key)
        if have is None:
            out[key] = dict(g, examples=list(g["examples"]))
            continue
        for k in ("blocks", "bytes", "indirect_blocks", "indirect_bytes", "cycle_leaders"):
            if k in g:
                have[k] += g[k]
        have["oldest_alloc_ms"] = min(have["oldest_alloc_ms"], g["oldest_alloc_ms"])
        have["newest_alloc_ms"] = max(have["newest_alloc_ms"], g["newest_alloc_ms"])
        if have["age_ms"] is not None and g["age_ms"] is not None:
            have["age_ms"] = {"oldest": max(have["age_ms"]["oldest"], g["age_ms"]["oldest"]),
                              "newest": min(have["age_ms"]["newest"], g["age_ms"]["newest"])}
        # the lowest of both: each group's own are its lowest, so these are
        # the merged group's lowest, as many as one group would show
        have["examples"] = sorted(set(have["examples"]) | set(g["examples"]),
                                  key=lambda a: int(a, 16))[:LeakScan.MAX_EXAMPLES]
    rank = {k: i for i, k in enumerate(KINDS)}
    return sorted(out.values(), key=lambda g: (rank[g["kind"]], -g["bytes"], g["stack_id"]))


def leak_check_doc(dump: Dump, suppressions: Suppressions | None = None) -> dict:
    """One process's leak check (docs/json.md, ``forensics run --leaks``)."""
    groups = _merge(leaks_json(dump))
    kept, counts = [], {}
    sup_blocks = sup_bytes = 0
    for g in groups:
        rule = suppressions.match(g["stack"]) if suppressions is not None else None
        if rule is not None:
            sup_blocks += g["blocks"]
            sup_bytes += g["bytes"]
            c = counts.setdefault(rule.pattern, [0, 0])
            c[0] += g["blocks"]
            c[1] += g["bytes"]
            continue
        kept.append(g)
    totals = {k: {"blocks": 0, "bytes": 0} for k in KINDS}
    for g in kept:
        totals[g["kind"]]["blocks"] += g["blocks"]
        totals[g["kind"]]["bytes"] += g["bytes"]
    return {
        "pid": dump.pid,
        "exe": dump.exe,
        "core": dump.core.path if dump.core is not None else dump.mem.name,
        "reason": inspect_reason(dump.control),
        "leaks": kept,
        "totals": totals,
        "suppressed": {
            "blocks": sup_blocks,
            "bytes": sup_bytes,
            "patterns": [{"pattern": p, "blocks": b, "bytes": n} for p, (b, n) in counts.items()],
        },
        "leaked": any(totals[k]["blocks"] for k in FAILING_KINDS),
        "warnings": list(dump.control.warnings),
    }


__all__ = ["FAILING_KINDS", "Suppression", "Suppressions", "leak_check_doc"]
