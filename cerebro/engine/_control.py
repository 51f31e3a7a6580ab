"""Steering a live run from outside its driver, through its run directory (so it works on
any backend and on a shared store): :func:`stop` asks the driver to stop at its trials' next
epoch boundaries, resumable."""
from __future__ import annotations

import json
import os
import time

from ..store import STOP_FILE, RunStore
from ..store import _files as files


def stop(run_dir: str | os.PathLike) -> None:
    """Ask the live run in ``run_dir`` to stop: its driver starts no new trial and no new
    epoch, lets the epochs in flight end, and leaves the run resumable (``cb.resume`` goes
    on, to the results the run would have had). Returns at once; the run's ``fit`` returns
    an unfinished :class:`cerebro.Result` when it has stopped.

    Example (a fragment: it needs a live run):
        >>> cb.stop("runs/exp1")
    """
    store = RunStore.open(run_dir)
    events = [e["event"] for e in store.events()]
    if events and events[-1] == "run_finished":
        raise ValueError(f"run {store.path!r} has finished; there is nothing to stop")
    files.write_atomic(store.file(STOP_FILE), json.dumps({"asked": time.time()}).encode())
