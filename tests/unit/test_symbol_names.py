"""Function names as the symbolizer gives them, named as gdb names them."""

from forensics.reader.symbols import _whole_function


def test_a_cold_part_is_named_by_its_function():
    # gcc's "f.cold" (and "f.cold.N") hold f's unlikely code; the debug
    # information calls that code f, and so does gdb's bt
    assert [_whole_function(n) for n in ("crash_handler.cold", "parse.cold.2")] == ["crash_handler", "parse"]


def test_other_names_are_kept():
    # clones (.isra, .constprop, .part) are functions of their own in the
    # debug information: their names stay, as does a function named "cold"
    assert [_whole_function(n) for n in ("copy.isra.0", "cold", "coldness", None)] == [
        "copy.isra.0", "cold", "coldness", None]
