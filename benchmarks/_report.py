"""What every benchmark records with its numbers: the command that made them, the machine,
and the JSON file they go to."""
from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from typing import Any


def provenance() -> dict[str, Any]:
    """The command line as it ran, and the machine's cores and Python."""
    return {"command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version()}}


def write_json(report: dict[str, Any], out: str) -> None:
    """Write ``report`` to ``out`` (its folder made where missing) and say where."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {out}")
