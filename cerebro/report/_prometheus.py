"""A run's metrics for Prometheus: a prometheus-client collector that reads them from the run
directory (the journal and ``live.json``), so the dashboard's ``/metrics`` and the driver's
(``fit(metrics_port=...)``) say the same. All are ``cerebro_``-prefixed and labelled with the
run (its directory's name) and, where they are a worker's, the worker.

Hops are counted from the schedule: a train sub-epoch whose trial's train sub-epoch before
ran on another worker. A hop's duration is its sub-epoch's time outside the training loop:
the state fetched in, the model built or found, the result sent back.

A scrape costs O(the answer), never O(the run): the journal is followed, each line folded
once (:mod:`._tally`), and :class:`MetricsText` makes the text again only when the journal or
``live.json`` changed, at most once in :data:`REFRESH` seconds, whatever the clients.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .._objectives import primary
from ..results._live import LIVE_FILE, is_stale, read_live, well_formed
from ..store import RunStore
from ..store import _files as files
from ._journal_tail import JournalTail
from ._tally import RunTally, Tally

STUCK_AFTER = 10.0   # seconds after which a read of the journal under way is taken never to end
FRESH_FOR = 5.0     # a read's result serves for this many times the read's own duration
REFRESH = 0.5       # seconds for which /metrics answers the same text while the run goes on


class Reread:
    """What ``make`` makes of a run's journal, made again only once the journal changed.

    No lock is held while ``make`` reads: a read that blocks or fails holds up or fails its
    own request only. The result is swapped in under the lock; while one read is under way
    the others get the result before it, so requests at once read the journal once (a read
    under way for longer than :data:`STUCK_AFTER` seconds no longer counts: it may never end).

    The first read, and that of a journal replaced or cut, is made in the request that asks;
    that of a journal that grew (the run went on) in a thread of its own, the request getting
    the result before it at once: a 10,000-trial run's read takes seconds, the dashboard asks
    each second. A read in a thread that fails leaves the next request to read, and say why."""

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
            made = self._made
            if made is not None and (key is not None and key == self._key or busy or fresh):
                return made
            self._reading = token, now
        if made is not None and grew:
            threading.Thread(target=self._read_behind, args=(token, now, key), name="cerebro-reread",
                             daemon=True).start()
            return made
        return self._read(token, now, key)

    def _read(self, token: object, now: float, key: Any) -> Any:
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

    def _read_behind(self, token: object, now: float, key: Any) -> None:
        try:
            self._read(token, now, key)
        except Exception:      # noqa: BLE001 (whatever a run directory makes a read raise: the next request says it)
            logging.getLogger("cerebro").debug("reading %s failed", self.journal, exc_info=True)
            with self._lock:
                self._key = None        # no longer taken for the journal read: the next request reads it


class Following:
    """The :class:`Tally` of the run in ``run_dir``, following its journal: each look folds the
    lines written since the one before. One thread at a time (see :class:`MetricsText`)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self._tail = JournalTail(files.join(run_dir, "journal.jsonl"))
        self._tally: RunTally | None = None

    def look(self) -> tuple[Tally, int]:
        """The tally now, and the run's workers; raises where the run cannot be read."""
        store = RunStore.open(self.run_dir)
        info = store.read_run_info()
        try:
            started_over, records = self._tail.read()
            if started_over or self._tally is None:
                self._tally = RunTally(*primary(info["searcher"]["metric"], info["searcher"]["mode"]))
            for record in records:
                self._tally.apply(record)
        except BaseException:      # a fold cut short: read the journal whole at the next look
            self._tail, self._tally = JournalTail(self._tail.path), None
            raise
        return self._tally.snapshot(store.file(".lock")), int(info["workers"])


class RunCollector(Collector):
    """The metrics of the run in ``run_dir`` as they are at each scrape: the journal's lines
    written since the last scrape folded in, ``live.json`` read."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = os.fspath(run_dir)
        self.run = os.path.basename(os.path.normpath(self.run_dir.rstrip("/")))
        self._following = Following(self.run_dir)
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            tally, workers = self._following.look()     # raises where the run cannot be read: /metrics says why
        live = _live(self.run_dir)
        try:
            shown = list(self._workers(tally, workers, live))
        except (TypeError, ValueError, KeyError, OverflowError):   # live.json's part only: shown as none
            shown = list(self._workers(tally, workers, {}))
        yield from self._progress(tally)
        yield from shown
        yield from self._durations(tally)

    def _progress(self, tally: Tally) -> Iterator[Metric]:
        run = self.run
        sub_epochs = CounterMetricFamily("cerebro_sub_epochs", "Sub-epochs done", labels=["run", "worker", "kind"])
        for worker, kind, count in tally.sub_epochs:
            sub_epochs.add_metric([run, str(worker), kind], count)
        yield sub_epochs
        yield _one(CounterMetricFamily("cerebro_epochs", "Epochs done, over every trial", labels=["run"]), [run],
                   tally.epochs)
        trials = GaugeMetricFamily("cerebro_trials", "Trials by status", labels=["run", "status"])
        for status, count in tally.trials:
            trials.add_metric([run, status], count)
        yield trials
        best = GaugeMetricFamily("cerebro_best_metric", "The best objective so far: result.best's, finished trial "
                                 "or not (a failed one never)", labels=["run", "metric", "mode"])
        if tally.best is not None:      # None: no trial that did not fail has the metric yet: no sample
            best.add_metric([run, tally.metric, tally.mode], tally.best)
        yield best

    def _workers(self, tally: Tally, workers: int, live: dict[str, Any]) -> Iterator[Metric]:
        run = self.run
        busy = CounterMetricFamily("cerebro_worker_busy_seconds", "Seconds a worker ran sub-epochs",
                                   labels=["run", "worker"])
        for worker, seconds in tally.busy:
            busy.add_metric([run, str(worker)], seconds)
        yield busy
        yield _one(GaugeMetricFamily("cerebro_workers_live", "Workers alive now (0 once the run ended)",
                                     labels=["run"]), [run], len(live.get("alive", [])))
        value = tally.utilization(workers)
        yield _one(GaugeMetricFamily("cerebro_utilization", "Busy time / (workers x the span of the sub-epochs)",
                                     labels=["run"]), [run], 0.0 if math.isnan(value) else value)
        yield _one(CounterMetricFamily("cerebro_hops", "Train sub-epochs whose state came from another worker",
                                       labels=["run"]), [run], tally.hops)
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

    def _durations(self, tally: Tally) -> Iterator[Metric]:
        sub_epochs = HistogramMetricFamily("cerebro_sub_epoch_seconds", "Sub-epoch durations", labels=["run", "kind"])
        for kind, (buckets, total) in tally.sub_epoch_seconds:
            sub_epochs.add_metric([self.run, kind], list(buckets), total)
        yield sub_epochs
        histogram = HistogramMetricFamily("cerebro_hop_seconds", "Time of a hop's sub-epoch outside its training loop",
                                          labels=["run"])
        histogram.add_metric([self.run], list(tally.hop_seconds[0]), tally.hop_seconds[1])
        yield histogram


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


class MetricsText:
    """The ``/metrics`` answer of the run in ``run_dir``, made again only where the journal or
    ``live.json`` changed, and while the run goes on (its journal grows) at most once in
    ``refresh`` seconds: every client meanwhile gets the same bytes, so a request costs two
    files' signatures and its answer, however many clients and however long the run.

    As :class:`Reread`: no lock is held while the text is made, and while it is, the others
    get the text before it (a making under way for :data:`STUCK_AFTER` seconds is left: a
    fresh follower of the journal takes over). A journal replaced or cut is read at once."""

    def __init__(self, run_dir: str | os.PathLike, refresh: float = REFRESH) -> None:
        self.run_dir, self.refresh = os.fspath(run_dir), refresh
        self.watched = files.join(self.run_dir, "journal.jsonl"), files.join(self.run_dir, LIVE_FILE)
        self.made = 0                       # how many times the text was made (the tests count them)
        self._collector = RunCollector(self.run_dir)
        self._lock = threading.Lock()
        self._text: bytes | None = None
        self._keys: tuple[Any, ...] = ()
        self._made_at = self._started = -math.inf      # when the text was made, and when its making began
        self._making: tuple[object, float] | None = None

    def get(self) -> bytes:
        keys = tuple(files.signature(path) for path in self.watched)
        token, now = object(), time.monotonic()
        with self._lock:
            busy = self._making is not None and now - self._making[1] < STUCK_AFTER
            if self._text is not None and (keys == self._keys or busy or self._going_on(keys, now)):
                return self._text
            if busy:             # none made yet: this request reads on its own
                collector = RunCollector(self.run_dir)
            else:                # none under way, or one stuck: left to end (its text is dropped)
                if self._making is not None:
                    self._collector = RunCollector(self.run_dir)
                collector, self._making = self._collector, (token, now)
        try:
            text = _text(collector)
        finally:
            with self._lock:
                if self._making is not None and self._making[0] is token:
                    self._making = None
        with self._lock:
            if now >= self._started:        # a making that began before this one's text is older
                self._text, self._keys, self._started, self._made_at = text, keys, now, time.monotonic()
                self.made += 1
        return text

    def _going_on(self, keys: tuple[Any, ...], now: float) -> bool:
        """Whether the run only went on since the text was made (its journal grew, or only
        ``live.json`` changed) and the text is younger than ``refresh``."""
        journal, before = keys[0], self._keys[0]
        grew = journal == before or (journal is not None and before is not None
                                     and (journal[0] or 0) > (before[0] or 0))
        return grew and now - self._made_at < self.refresh


def _text(collector: Collector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
