"""docs/guide.md documents every option of every verb.

GIVEN the command line's parser (the same one `forensics VERB --help` prints)
WHEN every --flag of every verb's help is collected
THEN each one appears in docs/guide.md of this checkout.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from forensics.cli import VERBS
from forensics.cli.main import build_parser

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def _verb_help() -> dict[str, str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    return {verb: sub.choices[verb].format_help() for verb in VERBS}


@pytest.mark.parametrize("verb", VERBS)
def test_every_flag_of_the_verb_is_in_the_guide(verb):
    guide = GUIDE.read_text()
    flags = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", _verb_help()[verb])))
    assert flags, f"{verb} --help names no flag at all"
    missing = [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", guide)]
    assert missing == [], f"forensics {verb}: {missing} are not in docs/guide.md"
