"""run.json, checked as it is read: anyone may have edited a run directory, and a reader
should say what is wrong with it rather than fail on a missing key somewhere later."""
from __future__ import annotations

import json
import reprlib
from typing import IO, Any

# The entries every reader needs (a dot: one inside another), with their types.
REQUIRED = {"seed": int, "workers": int, "searcher.class": str, "searcher.metric": str, "searcher.mode": str,
            "data.partitions": int}


class RunInfoError(ValueError):
    """A run.json that is not one Cerebro wrote: not JSON, or an entry missing or of another type."""


def checked_run_info(file: IO, path: str) -> dict[str, Any]:
    """The run.json in ``file`` (at ``path``, for the message), with its :data:`REQUIRED` entries."""
    try:
        info = json.load(file)
    except (ValueError, RecursionError) as error:     # nested past any reader's depth too
        raise RunInfoError(f"{path} is damaged: it is not JSON ({error})") from None
    if not isinstance(info, dict):
        raise RunInfoError(f"{path} is damaged: it holds a JSON {type(info).__name__}, not an object")
    for name, kind in REQUIRED.items():
        *parents, key = name.split(".")
        holder: Any = info
        for parent in parents:
            holder = holder.get(parent) if isinstance(holder, dict) else None
        value = holder.get(key) if isinstance(holder, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            found = "missing" if value is None else reprlib.repr(value)
            raise RunInfoError(f"{path} is damaged: its {name!r} must be "
                               f"{'a whole number' if kind is int else 'a string'}, not {found}")
    return info
