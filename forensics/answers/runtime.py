"""Runtime noise: the live blocks the C and C++ runtimes allocate for
themselves (stdio's buffers, libstdc++'s emergency exception pool, the
dynamic loader's TLS blocks), which every program has and no program's code
asked for.  inspect and report fold them into one line by default
(docs/guide.md, "Runtime blocks"); --runtime lists them as stacks.

A stack is the runtime's when, after libtag's own frames, its innermost
frames run in the runtime's modules (RUNTIME_MODULES) up to where the
program's code starts, and either

- that run is the whole stack (the runtime allocated on its own: a library
  constructor the loader ran, a thread's start), or
- one of its frames is a runtime function (RUNTIME_FUNCTIONS): the one that
  allocates for the runtime itself (``_IO_file_doallocate`` for a FILE's
  buffer, ``_dl_allocate_tls`` for a thread's TLS), not for its caller.

So ``printf`` reaching ``_IO_file_doallocate`` is runtime, while ``strdup`` or
``fopen`` called by the program is the program's block (it asked for it and
must free it).  Both lists are shell-style patterns (* ? [ ]): the modules on
the file's base name, the functions on the demangled name.
``--runtime-function PATTERN`` adds a function, in any module: a frame it
names (a runtime of the program's own, say) counts as the runtime's too, so
a stack whose innermost frames up to one of those are all the runtime's is.
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Any, Sequence

# The runtime's shared objects (base names): the C library and its loader,
# the C++ library and the unwinder it uses.
RUNTIME_MODULES = (
    "libc.so*", "libc-*.so", "ld-linux*.so*", "ld-*.so", "ld.so*", "libpthread.so*",
    "libpthread-*.so", "libdl.so*", "libstdc++.so*", "libgcc_s.so*",
)

# The functions that allocate for the runtime itself.
RUNTIME_FUNCTIONS = (
    # stdio: a stream's buffer, allocated at its first read or write
    "_IO_file_doallocate", "_IO_wfile_doallocate", "_IO_doallocbuf", "_IO_wdoallocbuf",
    "__GI__IO_doallocbuf", "__GI__IO_file_doallocate", "setvbuf", "_IO_setvbuf",
    # the dynamic loader: thread-local storage, the link map, dlopen's state
    "_dl_allocate_tls*", "allocate_dtv", "_dl_resize_dtv", "_dl_update_slotinfo",
    "update_get_addr", "__tls_get_addr", "tls_get_addr_tail", "_dl_new_object",
    "_dl_map_object*", "_dl_add_to_namespace_list", "_dl_important_hwcaps", "_dl_init_paths",
    "_dl_catch_exception", "_dl_open", "dl_open_worker*",
    # libstdc++: the emergency exception pool, per-thread exit destructors
    "(anonymous namespace)::pool::pool", "__gnu_cxx::__freeres",
    "__cxa_thread_atexit_impl", "__cxa_thread_atexit",
    # the C library's own per-process state
    "__libc_setlocale", "_nl_*", "__tzfile_read", "tzset_internal", "__new_exitfn",
)


def glob_regex(patterns: Sequence[str]) -> re.Pattern[str]:
    """One regex matching any of the shell-style patterns (* ? [ ]), whole."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns))


class Runtime:
    """Which allocation stacks of a dump are the runtime's (RUNTIME_MODULES,
    RUNTIME_FUNCTIONS, plus the user's function patterns)."""

    def __init__(self, dump: Any, extra: Sequence[str] = ()) -> None:
        self.dump = dump
        extra = [p for p in extra if p]
        self.functions = list(RUNTIME_FUNCTIONS) + extra
        self._fn = glob_regex(self.functions)
        self._mod = glob_regex(RUNTIME_MODULES)
        self._extra = glob_regex(extra) if any(extra) else None
        self._module_kind: dict[str, str] = {}  # module path -> "runtime" / "libtag" / "program"
        self._known: dict[int, bool] = {}

    def _kind(self, pc: int) -> str:
        """"runtime", "libtag" or "program" (any other module, or none) for a pc."""
        module = self.dump.symbolizer.module_at(pc - 1)
        if module is None:
            return "program"
        kind = self._module_kind.get(module.path)
        if kind is None:
            if module.path == self.dump.libtag_module:
                kind = "libtag"
            elif self._mod.match(os.path.basename(module.path)):
                kind = "runtime"
            else:
                kind = "program"
            self._module_kind[module.path] = kind
        return kind

    def _names_extra(self, frame) -> bool:
        """Whether a frame (or a call inlined there) is a function the user
        named with --runtime-function."""
        return any(f.function and self._extra.match(f.function) for f in self.dump.symbolize([frame]))

    def classify(self, stack_ids: Sequence[int]) -> dict[int, bool]:
        """stack id -> whether it is the runtime's, for every id given."""
        control = self.dump.control
        todo: dict[int, list] = {}  # stack id -> the raw frames of its runtime run
        for sid in stack_ids:
            if sid in self._known:
                continue
            raw = control.raw_stack(sid) if sid else []
            i = 0
            while i < len(raw) and self._kind(raw[i][0]) == "libtag":
                i += 1
            j = i
            named = False  # a frame of the program's a user pattern names
            while j < len(raw):
                if self._kind(raw[j][0]) != "runtime":
                    if not (self._extra and self._names_extra(raw[j])):
                        break
                    named = True
                j += 1
            if named:
                self._known[sid] = True
            elif j == i:
                self._known[sid] = False  # the program's own code allocated
            elif j == len(raw):
                self._known[sid] = True  # runtime code all the way out
            else:
                todo[sid] = raw[i:j]
        if todo:
            # name only the runtime frames, in one batch
            self.dump.symbolizer.symbolize([f for run in todo.values() for f in run])
            for sid, run in todo.items():
                names = [f.function for f in self.dump.symbolize(run)]
                self._known[sid] = any(n and self._fn.match(n) for n in names)
        return {sid: self._known[sid] for sid in stack_ids}


def split_stacks(dump: Any, stacks: Sequence[tuple[int, int, int]], *, show: bool,
                 extra: Sequence[str] = ()) -> tuple[list[tuple[int, int, int, bool]], dict]:
    """Heap.by_stack's rows as (id, blocks, bytes, runtime) - without the
    runtime's unless show - and the runtime's totals (docs/json.md,
    "runtime")."""
    runtime = Runtime(dump, extra)
    known = runtime.classify([s for s, _, _ in stacks])
    rows = [(s, n, b, known[s]) for s, n, b in stacks if show or not known[s]]
    mine = [(n, b) for s, n, b in stacks if known[s]]
    summary = {"blocks": sum(n for n, _ in mine), "bytes": sum(b for _, b in mine),
               "stacks": len(mine), "shown": show}
    return rows, summary
