"""``--json`` output: one JSON document on stdout and nothing else there.

Apart from forensics.output.text so that a verb asked for JSON does not
import rich (~45 ms of a whoowns' start-up).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from forensics.answers.documents import to_json


def print_json(document: Any) -> None:
    """Print one JSON document on stdout; nothing else may go to stdout then."""
    json.dump(to_json(document), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
