"""Reading ``live.json``, which the driver rewrites as the run goes
(:class:`cerebro.observe._live.LiveFile`): what its workers are doing now. A run directory is
data anyone may have written, so a reader takes the file for what it says only when it is
:func:`well_formed`, and takes one older than :data:`STALE_AFTER`, or one that says the run
ended, for a run no driver is running.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any

from ..store import _files as files

LIVE_FILE = "live.json"
MAX_LIVE_BYTES = 16 << 20   # ~200 bytes a worker: room for tens of thousands
STALE_AFTER = 15.0  # seconds without a rewrite after which no driver is taken to be running
LARGEST = 2**53     # no count or time a driver writes is larger; a float holds every int up to it


def is_stale(live: dict[str, Any]) -> bool:
    """Whether no driver runs the run: it ended, or nothing rewrote the file for a while (a
    driver killed without a word)."""
    return bool(live.get("outcome")) or time.time() - float(live.get("updated", 0)) > STALE_AFTER


def read_live(run_dir: str) -> dict[str, Any] | None:
    """``run_dir``'s ``live.json``, or None where the run has none (written before it, or
    by a driver that has not started yet) or it cannot be read as one. What it holds is
    for :func:`well_formed` to check."""
    try:       # a regular file of a bounded size: a FIFO or a link to /dev/zero must not hang or fill a reader
        content = files.read_regular(files.join(str(run_dir), LIVE_FILE), MAX_LIVE_BYTES)
        live = json.loads(content, parse_constant=_no_constant)
    except (OSError, ValueError, RecursionError):
        return None
    return live if isinstance(live, dict) else None


def well_formed(live: dict[str, Any]) -> bool:
    """Whether ``live`` has the fields and types a driver writes, and no others a reader
    would trip on: a run directory is data that anyone may have written. Types are checked
    in full, so a reader may use each field as what it is: workers are short decimal ASCII
    digits (``int("²")`` raises), numbers are finite and no larger than a driver writes."""
    running = live.get("running")
    traffic = live.get("traffic", {})
    return (_number(live.get("updated")) and (live.get("outcome") is None or isinstance(live["outcome"], str))
            and isinstance(live.get("alive"), list) and all(_integer(w) for w in live["alive"])
            and isinstance(traffic, dict) and all(isinstance(k, str) and _number(v) for k, v in traffic.items())
            and isinstance(running, dict) and all(_doing(k, v) for k, v in running.items()))


def _doing(worker: Any, doing: Any) -> bool:
    """One entry of ``running``: a worker's sub-epoch under way."""
    return (_worker(worker) and isinstance(doing, dict)
            and isinstance(doing.get("trial_id"), str) and isinstance(doing.get("kind"), str)
            and all(_integer(doing.get(k)) for k in ("epoch", "partition", "batches")) and _number(doing.get("since"))
            and (doing.get("total") is None or _integer(doing["total"])))


def _worker(key: Any) -> bool:
    """A worker's number as ``running`` keys it: ``str.isdigit`` alone passes "²" and "٣"."""
    return isinstance(key, str) and 0 < len(key) <= 9 and key.isascii() and key.isdigit()


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -LARGEST <= value <= LARGEST


def _number(value: Any) -> bool:
    # json reads 1e999 as inf without asking parse_constant: finiteness is checked here
    return _integer(value) or (isinstance(value, float) and math.isfinite(value))


def _no_constant(name: str) -> float:
    raise ValueError(f"{LIVE_FILE} holds {name}, which a driver never writes")
