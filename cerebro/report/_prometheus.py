"""A run's metrics for Prometheus: a prometheus-client collector that reads them from the run
directory (the journal and ``live.json``) at each scrape, so the dashboard's ``/metrics``
and the driver's (``fit(metrics_port=...)``) say the same. All are ``cerebro_``-prefixed and
labelled with the run (its directory's name) and, where they are a worker's, the worker.

Hops are counted from the schedule: a train sub-epoch whose trial's train sub-epoch before
ran on another worker. A hop's duration is its sub-epoch's time outside the training loop:
the state fetched in, the model built or found, the result sent back.
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..results import NoBestTrialError, Result, load
from ..results._live import is_stale, read_live, well_formed
from ..store import TrialStatus
from ..store import _files as files
from ._figures import utilization

SUB_EPOCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
STUCK_AFTER = 10.0   # seconds after which a read of the journal under way is taken never to end


FRESH_FOR = 5.0     # a read's result serves for this many times the read's own duration


class Reread:
    """What ``make`` makes of a run's journal, made again only once the journal changed.

    No lock is held while ``make`` reads: a read that blocks or fails holds up or fails its
    own request only. The result is swapped in under the lock; while one read is under way
    the others get the result before it, so requests at once read the journal once (a read
    under way for longer than :data:`STUCK_AFTER` seconds no longer counts: it may never end)."""

    def __init__(self, run_dir: str, make: Callable[[], Any]) -> None:
        self.journal, self.make = files.join(run_dir, "journal.jsonl"), make
        self._lock = threading.Lock()
        self._key: Any = None
        self._made: Any = None
        self._reading: tuple[object, float] | None = None      # the read under way: its token, its start
        self._made_at = self._took = 0.0        # when the last read ended, and how long it took

    def get(self) -> Any:
        key = files.signature(self.journal)
        token, now = object(), time.monotonic()
        with self._lock:
            busy = self._reading is not None and now - self._reading[1] < STUCK_AFTER
            # A journal that grows every sub-epoch is read again at most once in FRESH_FOR
            # times its last read: a client scraping in a loop costs the driver's machine a
            # bounded share of a core (1 / FRESH_FOR), however long the journal grows. One
            # replaced or cut (not grown) is read at once.
            grew = key is not None and self._key is not None and (key[0] or 0) > (self._key[0] or 0)
            fresh = grew and now - self._made_at < FRESH_FOR * self._took
            if self._made is not None and (key is not None and key == self._key or busy or fresh):
                return self._made
            self._reading = token, now
        try:
            made = self.make()
        finally:
            with self._lock:
                if self._reading is not None and self._reading[0] is token:
                    self._reading = None
        with self._lock:
            self._made, self._key = made, key
            self._made_at, self._took = time.monotonic(), time.monotonic() - now
        return made


class RunCollector(Collector):
    """The metrics of the run in ``run_dir``, read afresh at each scrape."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = os.fspath(run_dir)
        self.run = os.path.basename(os.path.normpath(self.run_dir.rstrip("/")))
        self._journal = Reread(self.run_dir, self._read)

    def _read(self) -> tuple[Result, pd.DataFrame]:
        result = load(self.run_dir)
        return result, result.schedule()

    def collect(self) -> Iterator[Metric]:
        result, schedule = self._journal.get()      # raises where the run cannot be read: /metrics says why
        live = _live(self.run_dir)
        try:
            workers = list(self._workers(result, schedule, live))
        except (TypeError, ValueError, KeyError, OverflowError):   # live.json's part only: shown as none
            workers = list(self._workers(result, schedule, {}))
        yield from self._progress(result, schedule)
        yield from workers
        yield from _durations(self.run, schedule)

    def _progress(self, result: Result, schedule: pd.DataFrame) -> Iterator[Metric]:
        run = self.run
        sub_epochs = CounterMetricFamily("cerebro_sub_epochs", "Sub-epochs done", labels=["run", "worker", "kind"])
        for (worker, kind), rows in schedule.groupby(["worker", "kind"], sort=True):
            sub_epochs.add_metric([run, str(worker), str(kind)], len(rows))
        yield sub_epochs
        yield _one(CounterMetricFamily("cerebro_epochs", "Epochs done, over every trial", labels=["run"]), [run],
                   sum(t.epochs for t in result.trials))
        trials = GaugeMetricFamily("cerebro_trials", "Trials by status", labels=["run", "status"])
        counts = pd.Series([str(t.status) for t in result.trials], dtype=object).value_counts()
        for status in TrialStatus:
            trials.add_metric([run, str(status)], int(counts.get(str(status), 0)))
        yield trials
        best = GaugeMetricFamily("cerebro_best_metric", "The best objective so far: result.best's, finished trial "
                                 "or not (a failed one never)", labels=["run", "metric", "mode"])
        try:
            best.add_metric([run, result.metric, result.mode], float(result.best.best_metrics[result.metric]))
        except NoBestTrialError:
            pass        # no trial that did not fail has the metric yet: no sample
        yield best

    def _workers(self, result: Result, schedule: pd.DataFrame, live: dict[str, Any]) -> Iterator[Metric]:
        run = self.run
        workers = int(result.store.read_run_info()["workers"])
        busy = CounterMetricFamily("cerebro_worker_busy_seconds", "Seconds a worker ran sub-epochs",
                                   labels=["run", "worker"])
        for worker, rows in schedule.groupby("worker", sort=True):
            busy.add_metric([run, str(worker)], float((rows.end - rows.start).sum()))
        yield busy
        yield _one(GaugeMetricFamily("cerebro_workers_live", "Workers alive now (0 once the run ended)",
                                     labels=["run"]), [run], len(live.get("alive", [])))
        value = utilization(schedule, workers)
        yield _one(GaugeMetricFamily("cerebro_utilization", "Busy time / (workers x the span of the sub-epochs)",
                                     labels=["run"]), [run], 0.0 if math.isnan(value) else value)
        yield _one(CounterMetricFamily("cerebro_hops", "Train sub-epochs whose state came from another worker",
                                       labels=["run"]), [run], len(_hops(schedule)))
        moved = CounterMetricFamily("cerebro_bytes_moved", "Bytes of messages and states moved",
                                    labels=["run", "path"])
        traffic = live.get("traffic", {})
        for path, key in (("driver_to_workers", "sent"), ("workers_to_driver", "received"),
                          ("between_workers", "between_workers")):
            moved.add_metric([run, path], float(traffic.get(key, 0)))
        yield moved
        batches = GaugeMetricFamily("cerebro_sub_epoch_batches", "Batches begun in the sub-epoch a worker runs now",
                                    labels=["run", "worker", "trial_id"])
        total = GaugeMetricFamily("cerebro_sub_epoch_planned_batches", "Batches in all of the sub-epoch a worker "
                                  "runs now", labels=["run", "worker", "trial_id"])
        for worker, doing in sorted(live.get("running", {}).items()):
            batches.add_metric([run, worker, doing["trial_id"]], doing.get("batches", 0))
            if doing.get("total") is not None:
                total.add_metric([run, worker, doing["trial_id"]], doing["total"])
        yield batches
        yield total


def _live(run_dir: str) -> dict[str, Any]:
    """What ``live.json`` says, as far as /metrics shows it: nothing where it is missing, not
    one a driver wrote or cannot be read (a scrape answers all the same)."""
    try:
        live = read_live(run_dir)
    except Exception:       # noqa: BLE001 (whatever the file makes its read raise: none shown)
        return {}
    if live is None or not well_formed(live):
        return {}
    if is_stale(live):      # what was under way is no more: the traffic stays, the workers go
        return {"traffic": live.get("traffic", {})}
    return live


def _one(family: Any, labels: list[str], value: float) -> Any:
    family.add_metric(labels, value)
    return family


def _hops(schedule: pd.DataFrame) -> pd.DataFrame:
    """The train sub-epochs whose trial's train sub-epoch before ran on another worker."""
    train = schedule[schedule.kind == "train"].sort_values(["trial_id", "start"], kind="stable")
    before = train.groupby("trial_id").worker.shift()
    return train[before.notna() & (before != train.worker)]


def _durations(run: str, schedule: pd.DataFrame) -> Iterator[Metric]:
    sub_epochs = HistogramMetricFamily("cerebro_sub_epoch_seconds", "Sub-epoch durations", labels=["run", "kind"])
    for kind, rows in schedule.groupby("kind", sort=True):
        sub_epochs.add_metric([run, str(kind)], *_buckets((rows.end - rows.start).to_numpy(), SUB_EPOCH_BUCKETS))
    yield sub_epochs
    hops = _hops(schedule)
    outside = (hops.end - hops.start - hops.compute.fillna(0)).clip(lower=0).to_numpy()
    histogram = HistogramMetricFamily("cerebro_hop_seconds", "Time of a hop's sub-epoch outside its training loop",
                                      labels=["run"])
    histogram.add_metric([run], *_buckets(outside, HOP_BUCKETS))
    yield histogram

def _buckets(values: np.ndarray, bounds: tuple[float, ...]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative counts at each bound (and +Inf), and the values' sum."""
    counts = [(str(bound), float((values <= bound).sum())) for bound in bounds]
    return [*counts, ("+Inf", float(len(values)))], float(values.sum())
