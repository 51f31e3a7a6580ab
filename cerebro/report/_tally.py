"""The numbers of a run's Prometheus metrics, kept up to date a journal record at a time.

``/metrics`` used to load the whole run and redo pandas work over the whole schedule at each
scrape (~20 ms of the driver's CPU, under its GIL, at 9,000 sub-epochs). :class:`RunTally`
folds each record once, in O(1) (a record that takes sub-epochs back, rare, refolds the
schedule kept), and :meth:`RunTally.snapshot` gives a frozen :class:`Tally` in O(trials +
workers). What it counts is what :class:`cerebro.results.Result` reads from the same
records (the same :class:`Ledger` and :class:`RunLine`, the same schedule rules): counts and
the best metric are equal to the Result's; sums of seconds are added in the schedule's order
(pandas adds them pairwise, so they may differ from its in the last bits).
"""
from __future__ import annotations

import bisect
import copy
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..results._run_state import RunLine
from ..store import EpochEnd, Ledger, RunResumed, StateLost, SubEpoch, TrialStatus, parse_event

SUB_EPOCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_Buckets = tuple[tuple[tuple[str, float], ...], float]     # cumulative (le, count) pairs with +Inf, and the sum


@dataclass(frozen=True, slots=True)
class Row:
    """One sub-epoch of the schedule, as ``Result.schedule()`` has it; ``seq``: its place there."""

    trial_id: str
    epoch: int
    partition: int
    worker: int | None
    kind: str
    start: float | None
    end: float | None
    compute: float | None
    seq: int

    @property
    def seconds(self) -> float | None:
        return None if self.start is None or self.end is None else self.end - self.start

    @property
    def outside(self) -> float | None:
        """Its time outside its training loop (a hop's duration), at least 0."""
        seconds = self.seconds
        if seconds is None:
            return None
        outside = seconds - (self.compute if self.compute is not None else 0)
        return outside if math.isnan(outside) or outside >= 0 else 0.0


class Histogram:
    """Cumulative counts at ``bounds`` (and +Inf) and the sum, a value at a time; a missing
    value counts in +Inf only, as pandas' NaN does."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts, self.count, self.sum = bounds, [0] * len(bounds), 0, 0.0

    def add(self, value: float | None) -> None:
        self.count += 1
        if value is None or math.isnan(value):
            return
        self.sum += value
        at = bisect.bisect_left(self.bounds, value)      # the first bound >= value: value <= it
        if at < len(self.bounds):
            self.counts[at] += 1

    def buckets(self) -> _Buckets:
        cumulative, total = [], 0
        for bound, count in zip(self.bounds, self.counts):
            total += count
            cumulative.append((str(bound), float(total)))
        return (*cumulative, ("+Inf", float(self.count))), self.sum


@dataclass(frozen=True)
class Tally:
    """What ``/metrics`` says of the journal at one moment (see :class:`RunTally`)."""

    metric: str = ""                                      # the objective, and whether less is better
    mode: str = "min"
    sub_epochs: tuple[tuple[int, str, int], ...] = ()     # (worker, kind, count), sorted
    busy: tuple[tuple[int, float], ...] = ()              # (worker, seconds), sorted
    busy_total: float = 0.0
    span: float = math.nan                                # the last end - the first start
    hops: int = 0
    sub_epoch_seconds: tuple[tuple[str, _Buckets], ...] = ()     # (kind, buckets), sorted
    hop_seconds: _Buckets = field(default_factory=lambda: Histogram(HOP_BUCKETS).buckets())
    epochs: int = 0
    trials: tuple[tuple[str, int], ...] = ()              # (status, count) for every status
    best: float | None = None                             # result.best's metric: None where it has none

    def utilization(self, workers: int) -> float:
        """Busy time / (workers x the span of the sub-epochs), as ``_figures.utilization``."""
        return self.busy_total / (workers * self.span) if self.span > 0 else math.nan


class RunTally:
    """Folds journal records (as :class:`cerebro.store.RunStore` reads them) into the numbers of
    :class:`Tally`: the trials through the :class:`Ledger` and :class:`RunLine` a Result uses,
    the schedule by the Result's rules (a resume drops the sub-epochs of the epochs its crash
    cut short and skips those re-run to rebuild an epoch's checkpoint; a lost state drops
    the sub-epochs that train again)."""

    def __init__(self, metric: str, mode: str) -> None:
        self.metric, self.mode = metric, mode
        self.ledger = Ledger(metric, mode)
        self.line = RunLine()
        self._ended: set[tuple[str, int]] = set()      # (trial, epoch) of every epoch end
        self._redone: set[tuple[str, int]] = set()
        self.rows: list[Row] = []
        self._seq = 0
        self._refold()

    def apply(self, record: dict[str, Any]) -> None:
        event = parse_event(record)
        trial = self.ledger.apply(event)
        self.line.apply(event)
        if trial is None and getattr(event, "trial_id", None) is not None:
            return                              # its trial's creation is on a damaged line
        match event:
            case EpochEnd():
                self._ended.add((event.trial_id, event.epoch))
            case SubEpoch() if (event.trial_id, event.epoch) not in self._redone:
                self._seq += 1
                row = Row(event.trial_id, event.epoch, event.partition, event.worker, str(event.kind), event.start,
                          event.end, event.compute, self._seq)
                self.rows.append(row)
                self._count(row)
            case StateLost():                   # those train sub-epochs run again: the first count no more
                lost = set(event.partitions or ())
                self._drop(lambda r: r.trial_id == event.trial_id and r.epoch == event.epoch and r.kind == "train"
                           and r.partition in lost)
            case RunResumed():
                self._redone = set(self._ended)
                self._drop(lambda r: (r.trial_id, r.epoch) not in self._redone)

    def _drop(self, dropped: Callable[[Row], bool]) -> None:
        """Rows taken back: counted again from those kept (rare: O(schedule))."""
        self.rows = [row for row in self.rows if not dropped(row)]
        self._refold()

    def _refold(self) -> None:
        self._counts: Counter[tuple[int, str]] = Counter()
        self._busy: defaultdict[int, float] = defaultdict(float)
        self._busy_total, self._first, self._last = 0.0, math.inf, -math.inf
        self._durations: dict[str, Histogram] = {}
        self._trains: dict[str, Row] = {}        # each trial's latest train sub-epoch (by start)
        self._hops, self._hop_seconds, self._hops_unordered = 0, Histogram(HOP_BUCKETS), False
        for row in self.rows:
            self._count(row)

    def _count(self, row: Row) -> None:
        seconds = None if _missing(row.seconds) else row.seconds
        if row.worker is not None:              # as pandas' groupby, which drops a missing key
            self._counts[row.worker, row.kind] += 1
            self._busy[row.worker] += seconds or 0.0
        self._busy_total += seconds or 0.0
        if row.start is not None and not math.isnan(row.start):
            self._first = min(self._first, row.start)
        if row.end is not None and not math.isnan(row.end):
            self._last = max(self._last, row.end)
        self._durations.setdefault(row.kind, Histogram(SUB_EPOCH_BUCKETS)).add(seconds)
        if row.kind == "train" and not self._hops_unordered:
            self._count_hop(row)

    def _count_hop(self, row: Row) -> None:
        """A train sub-epoch on another worker than its trial's one before. A trial trains on
        one worker at a time, so its sub-epochs come in the order they started; one that
        does not (or has no start) leaves the hops to :func:`hops_of` over the whole schedule."""
        before = self._trains.get(row.trial_id)
        if row.start is None or math.isnan(row.start) or (
                before is not None and before.start is not None and row.start < before.start):
            self._hops_unordered = True
            return
        self._trains[row.trial_id] = row
        if before is not None and before.worker is not None and before.worker != row.worker:
            self._hops += 1
            self._hop_seconds.add(row.outside)

    def snapshot(self, lock: str) -> Tally:
        """The numbers now; ``lock``: the run's lock file, which tells a live run from a dead
        one (see :meth:`RunLine.settle`)."""
        hops, hop_seconds = (self._hops, self._hop_seconds) if not self._hops_unordered else hops_of(self.rows)
        return Tally(sub_epochs=tuple((w, k, n) for (w, k), n in sorted(self._counts.items())),
                     busy=tuple(sorted(self._busy.items())), busy_total=self._busy_total,
                     span=self._last - self._first if self.rows and self._last > -math.inf else math.nan,
                     hops=hops, sub_epoch_seconds=tuple((k, h.buckets()) for k, h in sorted(self._durations.items())),
                     hop_seconds=hop_seconds.buckets(), metric=self.metric, mode=self.mode, **self._trials(lock))

    def _trials(self, lock: str) -> dict[str, Any]:
        """The trials' part, as ``Result.trials`` and ``Result.best`` say it: each trial's
        status (a live one's from where the run stands), epochs, and the best metric of a
        trial that did not fail (ties: the one created first)."""
        line = copy.copy(self.line)       # settling is for this look only: the run may go on
        line.settle(lock)
        statuses: Counter[str] = Counter()
        epochs, best, sign = 0, None, 1 if self.mode == "min" else -1
        for facts in self.ledger.trials.values():
            status = facts.status or line.live_status(facts.trial_id)
            statuses[str(status)] += 1
            epochs += facts.epoch
            value = facts.best_metrics.get(self.metric)
            if not status.is_failure and isinstance(value, (int, float)) and math.isfinite(value) and (
                    best is None or sign * value < sign * best):
                best = value
        return {"epochs": epochs, "trials": tuple((str(s), statuses[str(s)]) for s in TrialStatus),
                "best": None if best is None else float(best)}


def hops_of(rows: list[Row]) -> tuple[int, Histogram]:
    """The hops of a schedule whose sub-epochs did not come in the order they started: each
    trial's train sub-epochs sorted by start (missing last, ties in schedule order)."""
    trains = sorted((r for r in rows if r.kind == "train"),
                    key=lambda r: (r.trial_id, _missing(r.start), 0.0 if _missing(r.start) else r.start, r.seq))
    hops, seconds = 0, Histogram(HOP_BUCKETS)
    for before, row in zip(trains, trains[1:]):
        if before.trial_id == row.trial_id and before.worker is not None and before.worker != row.worker:
            hops += 1
            seconds.add(row.outside)
    return hops, seconds


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)
