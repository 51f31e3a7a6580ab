"""Writing ``live.json``: what a run's workers are doing now, beside its journal, for the
dashboard and ``/metrics`` (which read a run directory, perhaps from another machine, and
never talk to the driver; :mod:`cerebro.results._live` reads it).

The journal says what is done; this file says what is under way: each worker's sub-epoch,
since when, and the batches it has begun of all it has (from the workers' heartbeats, so a
long sub-epoch is seen alive), the workers alive, and the bytes moved so far. The driver
rewrites it once a second (every 5 s on a remote store), news or not, atomically, from a
thread of its own: a slow store never slows the run, and its errors never reach it.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

from ..results._live import LIVE_FILE
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

INTERVAL = 1.0      # seconds between rewrites (REMOTE_INTERVAL on a store at a URL)
REMOTE_INTERVAL = 5.0


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
