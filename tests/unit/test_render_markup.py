"""Text from a core is printed as itself: a file or function name that looks
like rich markup ("[/x]", "[bold]") must neither raise nor be styled away.

GIVEN answer documents whose paths and names contain markup-like text
WHEN the human renderers print them
THEN the text appears verbatim and nothing raises.
"""

from __future__ import annotations

import io

from forensics.answers import documents as D
from forensics.output import text

WEIRD = "/srv/a[/x]b/[bold]c.c"


def _frame(addr: str) -> D.FrameDoc:
    return D.FrameDoc(address=addr, function="f[/i]", file=WEIRD, line=7, module=WEIRD, inlined=False,
                      libtag=False, module_offset=None)


def _block() -> D.BlockDoc:
    return D.BlockDoc(start="0x1000", size=8, offset=0, state="freed", thread=1, alloc_stack=[_frame("0x10")],
                      free_stack=[_frame("0x20")], free_thread=2, alloc_kind="malloc", alloc_time=None,
                      free_time=None, age_s=None, guarded=False)


def _capture(monkeypatch) -> io.StringIO:
    buf = io.StringIO()
    from rich.console import Console

    monkeypatch.setattr(text, "_out", Console(file=buf, width=300, color_system=None))
    monkeypatch.setattr(text, "_err", Console(file=buf, width=300, color_system=None))
    return buf


def test_whoowns_prints_markup_like_text_verbatim(monkeypatch):
    buf = _capture(monkeypatch)
    text.show_whoowns(D.WhoownsDoc(
        core=WEIRD, address="0x1000", owner="heap", block=_block(),
        region=D.RegionDoc(name=WEIRD, start="0x0", end="0x2000"),
        referrers=[D.ReferrerDoc(address="0x30", in_="global", block_start=None, interior=False, thread=None,
                                 module=None, symbol=None)],
        referrer_count=1, self_referrers=0, retainers=None, retainer_count=None, retainers_depth_limited=False,
        note="[red]not red[/red]", symbol=None, use_after_free=None, libtag=True, chunk=None, type=None,
        warnings=["cut at [/x]"]))
    out = buf.getvalue()
    assert f"0x10  f[/i] at {WEIRD}:7" in out
    assert f"heap - {WEIRD}" in out
    assert "[red]not red[/red]" in out
    assert "warning: cut at [/x]" in out


def test_inspect_prints_markup_like_paths_verbatim(monkeypatch):
    buf = _capture(monkeypatch)
    crash = D.CrashDoc(signal="SIGSEGV", address="0x0", address_source="fault", sender=None, instruction=None,
                       cause=None, summary="SIGSEGV (SEGV_MAPERR) at address 0x0 [/y]", thread=1, time=None,
                       time_ms=None, stack=[_frame("0x40")], code=1, code_name="SEGV_MAPERR",
                       address_owner=D.AddressOwnerDoc(owner="unmapped", region=WEIRD, note="[/z]", block=None))
    text.show_inspect(D.InspectDoc(
        core=WEIRD, process=D.ProcessRef(pid=1, exe=WEIRD), reason="crash", payload="kept", libtag=True,
        crash=crash, heap=D.HeapTotals(live_blocks=0, live_bytes=0, freed_blocks=0, freed_bytes=0),
        anomalies=[], top_stacks=[], threads=[], counters=None, types=[], signature=None, warnings=[]))
    out = buf.getvalue()
    assert f"core {WEIRD}" in out
    assert f"process 1 {WEIRD}" in out
    assert f"the address is unmapped ({WEIRD}): [/z]" in out
    assert "SIGSEGV in thread 1: SIGSEGV (SEGV_MAPERR) at address 0x0 [/y]" in out
