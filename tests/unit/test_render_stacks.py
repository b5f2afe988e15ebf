"""A stack as a person reads it: libtag's own frames are left out (the JSON
keeps them, marked ``libtag``), and so are the C library routines libtag
itself called before any program frame; a run of them between program
frames shows as a count; inlined frames are marked.

GIVEN stack documents shaped like the ones forensics makes
WHEN output.text draws them
THEN exactly the program's frames are printed, in order.
"""

from __future__ import annotations

import io

from rich.console import Console

from forensics.answers.documents import FrameDoc
from forensics.output import text

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
LIBTAG = "/opt/forensics/_lib/libtag.so"
EXE = "/srv/victim"


def F(function: str, module: str, *, libtag: bool = False, inlined: bool = False) -> FrameDoc:
    return FrameDoc(address="0x1000", function=function, file=None, line=None, module=module,
                    inlined=inlined, libtag=libtag, module_offset=None)


def drawn(frames: list[FrameDoc]) -> list[str]:
    buf = io.StringIO()
    Console(file=buf, width=300, color_system=None).print(text.stack_tree("stack", frames))
    return [line.split("── ", 1)[1] for line in buf.getvalue().splitlines() if "── " in line]


def test_an_abort_inside_libtags_handler_starts_at_the_programs_abort():
    # GIVEN the kernel's abort core: syscall <- libtag's handler <- (signal) <- abort ...
    frames = [F("syscall", LIBC), F("crash_handler", LIBTAG, libtag=True),
              F("__pthread_kill_implementation", LIBC), F("abort", LIBC), F("main", EXE)]
    # THEN the system call libtag made and its handler are left out
    assert [ln.split()[1] for ln in drawn(frames)] == ["__pthread_kill_implementation", "abort", "main"]


def test_libtag_frames_between_program_frames_show_as_a_count():
    # GIVEN the program's own handler called from libtag's crash handler
    frames = [F("my_handler", EXE), F("crash_handler", LIBTAG, libtag=True),
              F("fault_here", EXE), F("main", EXE)]
    lines = drawn(frames)
    # THEN the program's handler stays, libtag's frame becomes "(1 frame of libtag)"
    assert [ln.split()[1] for ln in lines] == ["my_handler", "frame", "fault_here", "main"]
    assert lines[1] == "(1 frame of libtag)"


def test_snapshot_code_at_the_top_is_left_out_and_inline_frames_are_marked():
    frames = [F("take", LIBTAG, libtag=True), F("_tag_snapshot", LIBTAG, libtag=True),
              F("park_mode", EXE, inlined=True), F("main", EXE)]
    assert drawn(frames) == ["0x1000  park_mode in /srv/victim (inlined)", "0x1000  main in /srv/victim"]


def test_a_stack_of_libtag_frames_only_says_so():
    assert drawn([F("_tag_exit", LIBTAG, libtag=True)]) == ["(only libtag's own frames: 1; --json has them)"]
