"""``live.json``: what a run's workers are doing now, beside its journal, for the dashboard
and ``/metrics`` (which read a run directory, perhaps from another machine, and never talk
to the driver).

The journal says what is done; this file says what is under way: each worker's sub-epoch,
since when, and the batches it has begun of all it has (from the workers' heartbeats, so a
long sub-epoch is seen alive), the workers alive, and the bytes moved so far. The driver
rewrites it once a second (every 5 s on a remote store), news or not, atomically, from a
thread of its own: a slow store never slows the run, and its errors never reach it. A
reader takes a file older than :data:`STALE_AFTER`, or one that says the run ended, for a
run no driver is running.
"""
from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

from ..store import (
    RunFinished,
    RunStore,
    Traffic,
    WorkerLost,
    WorkerNotReplaced,
    WorkerProgress,
    WorkerReplaced,
    WorkersRestarted,
)
from ..store import _files as files
from ._progress import Progress

LIVE_FILE = "live.json"
INTERVAL = 1.0      # seconds between rewrites (REMOTE_INTERVAL on a store at a URL)
REMOTE_INTERVAL = 5.0
MAX_LIVE_BYTES = 16 << 20   # ~200 bytes a worker: room for tens of thousands
STALE_AFTER = 15.0  # seconds without a rewrite after which no driver is taken to be running
LARGEST = 2**53     # no count or time a driver writes is larger; a float holds every int up to it


class LiveFile(Progress):
    """Keeps ``live.json`` up to date as the run goes (an observer of the driver's events)."""

    def __init__(self, store: RunStore) -> None:
        self.path = store.file(LIVE_FILE)
        self.interval = REMOTE_INTERVAL if "://" in self.path else INTERVAL
        self.running: dict[int, dict[str, Any]] = {}
        self.alive: set[int] = set()
        self.traffic = {"sent": 0, "received": 0, "between_workers": 0}
        self.outcome: str | None = None
        # Guards the state above (the driver's thread changes it, the writer's reads it) and
        # wakes the writer; reentrant, as notify() hands sub-epochs on to their own methods.
        self._wake = threading.Condition(threading.RLock())
        self._flush = self._closing = False
        self._writer: threading.Thread | None = None

    def start(self, run_dir: str, workers: int) -> None:
        self.alive, self._flush = set(range(workers)), True
        self._writer = threading.Thread(target=self._writing, name="cerebro-live", daemon=True)
        self._writer.start()

    def notify(self, event: Any) -> None:
        with self._wake:
            match event:
                case WorkerProgress() if event.worker in self.running:
                    self.running[event.worker].update(batches=event.batches, total=event.total)
                case Traffic():
                    self.traffic = {"sent": event.sent, "received": event.received,
                                    "between_workers": event.between_workers}
                case RunFinished():
                    self.traffic = {"sent": event.bytes_sent, "received": event.bytes_received,
                                    "between_workers": event.bytes_between_workers}
                case WorkerLost() | WorkerNotReplaced():
                    self.alive.discard(event.worker)
                    self.running.pop(event.worker, None)
                case WorkerReplaced():
                    self.alive.add(event.worker)
                case WorkersRestarted():
                    self.alive = {int(w) for w in event.workers}
                case _:
                    super().notify(event)

    def sub_epoch_started(self, worker: int, trial_id: str, kind: str, epoch: int, partition: int) -> None:
        self.running[worker] = {"trial_id": trial_id, "kind": str(kind), "epoch": epoch, "partition": partition,
                                "since": time.time(), "batches": 0, "total": None}

    def sub_epoch_finished(self, worker: int) -> None:
        self.running.pop(worker, None)

    def finish(self, outcome: str) -> None:
        with self._wake:
            self.outcome, self.running, self.alive = outcome, {}, set()
            self._closing = True
            self._wake.notify()
        if self._writer is not None:
            self._writer.join(timeout=30)

    def _writing(self) -> None:
        """The writing thread: the state as it is now, once an interval, news or not (a
        driver with no news is alive all the same: a restart or a slow launch must not read
        as a dead run); the driver's thread only changes the state, never serializes it."""
        while True:
            with self._wake:
                if not (self._closing or self._flush):
                    self._wake.wait(self.interval)
                self._flush, closing = False, self._closing
                live = {"updated": time.time(), "outcome": self.outcome, "alive": sorted(self.alive),
                        "running": {str(w): dict(self.running[w]) for w in sorted(self.running)},
                        "traffic": self.traffic}
            try:
                files.write_atomic(self.path, json.dumps(live).encode(), durable=False)
            except Exception:             # noqa: BLE001 (a store's hiccup costs the view a second, never the run)
                pass
            if closing:
                return


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
