"""run.json, checked as it is read: anyone may have edited a run directory, and a reader
should say what is wrong with it rather than fail on a missing key somewhere later."""
from __future__ import annotations

import json
import reprlib
from typing import IO, Any

from .._objectives import objectives

# The entries every reader needs (a dot: one inside another), with their types: a search's
# metric and mode are strings, or lists of them where it has several objectives.
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "seed": int, "workers": int, "searcher.class": str, "searcher.metric": (str, list),
    "searcher.mode": (str, list), "data.partitions": int}
_KINDS = {int: "a whole number", str: "a string", (str, list): "a string or a list of strings"}


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
            raise RunInfoError(f"{path} is damaged: its {name!r} must be {_KINDS[kind]}, not {found}")
    try:
        objectives(info["searcher"]["metric"], info["searcher"]["mode"], recorded=True)
    except (TypeError, ValueError) as error:
        raise RunInfoError(f"{path} is damaged: its searcher's {error}") from None
    return info
