"""The journal's schema: one frozen dataclass per event (a trial's statuses: ``_statuses``).

A journal line is ``{"event": <name>, <the event's fields>..., "crc": ...}``; the names and
fields are those the journal had from the start, so every run directory ever written reads
with :func:`parse_event`. ``time`` is seconds since the run started (its ``clock`` in
``run_started``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ._statuses import TaskKind, TrialStatus
from ._stop_cause import StopCause


@dataclass(frozen=True)
class Event:
    """Base of the journal's events; ``name`` is the ``event`` field of its line."""

    name: ClassVar[str]
    journaled: ClassVar[bool] = True    # False: told to the observers only (progress), as it happens

    def record(self) -> dict[str, Any]:
        """The event's fields, in declaration order, as they go into its journal line."""
        return {name: getattr(self, name) for name in field_names(type(self))}


# Each event's field names (not functools.cache: mypy takes a dataclass's type for unhashable).
_FIELD_NAMES: dict[type[Event], tuple[str, ...]] = {}


def field_names(cls: type[Event]) -> tuple[str, ...]:
    """An event's field names, in declaration order, worked out once: ``dataclasses.fields``
    at each of a long journal's lines was a fifth of reading it."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


@dataclass(frozen=True)
class RunStarted(Event):
    name = "run_started"
    workers: dict[int, dict[str, Any]]
    time: float
    clock: float            # time.monotonic() on the driver at time 0


@dataclass(frozen=True)
class RunResumed(RunStarted):
    name = "run_resumed"


@dataclass(frozen=True)
class RunFinished(Event):
    """The run ended; the bytes the driver sent to and received from its workers, and those the
    workers fetched from each other (direct hops)."""

    name = "run_finished"
    time: float
    bytes_sent: int
    bytes_received: int
    bytes_between_workers: int = 0


@dataclass(frozen=True)
class RunInterrupted(Event):
    name = "run_interrupted"
    time: float
    cause: StopCause | None = None     # None: written before causes were journaled


@dataclass(frozen=True)
class RunFailed(Event):
    """The driver raised (its workers lost, a store that cannot be written, ...): the run
    stopped, resumable once ``reason`` is dealt with."""

    name = "run_failed"
    reason: str
    time: float


@dataclass(frozen=True)
class JournalRepaired(Event):
    name = "journal_repaired"
    dropped_bytes: int
    time: float


@dataclass(frozen=True)
class WorkerLost(Event):
    name = "worker_lost"
    worker: int
    reason: str
    running: dict[str, Any] | None     # the sub-epoch it was running: trial_id, kind, epoch, partition
    time: float


@dataclass(frozen=True)
class PartitionsMoved(Event):
    name = "partitions_moved"
    lost: int
    reason: str
    moved: dict[str, list[int]]        # surviving worker -> the lost worker's partitions it took
    time: float


@dataclass(frozen=True)
class WorkerReplaced(Event):
    name = "worker_replaced"
    worker: int
    workers: dict[int, dict[str, Any]]
    time: float


@dataclass(frozen=True)
class WorkerNotReplaced(Event):
    name = "worker_not_replaced"
    worker: int
    reason: str
    time: float


@dataclass(frozen=True)
class WorkersRestarted(Event):
    name = "workers_restarted"
    reason: str
    restart: int
    workers: dict[int, dict[str, Any]]
    time: float


@dataclass(frozen=True)
class TrialCreated(Event):
    name = "trial_created"
    trial_id: str
    config: dict[str, Any]
    max_epochs: int
    time: float
    warm_started_from: str | None = None     # RUN_DIR:TRIAL@EPOCH whose state it starts from


@dataclass(frozen=True)
class SubEpoch(Event):
    name = "sub_epoch"
    trial_id: str
    epoch: int
    partition: int
    worker: int
    kind: TaskKind
    start: float
    end: float
    compute: float | None     # seconds in the training or evaluation loop; None if it failed


@dataclass(frozen=True)
class SubEpochStarted(Event):
    """A sub-epoch was sent to its worker (the journal's ``sub_epoch`` has its start)."""

    name = "sub_epoch_started"
    journaled = False
    trial_id: str
    epoch: int
    partition: int
    worker: int
    kind: TaskKind


@dataclass(frozen=True)
class SubEpochAborted(SubEpochStarted):
    """A sub-epoch will not finish where it was sent (its worker was lost, or its partition
    moved); it runs again elsewhere."""

    name = "sub_epoch_aborted"


@dataclass(frozen=True)
class WorkerProgress(Event):
    """A worker's heartbeat during a sub-epoch: the batches it has begun of the sub-epoch's
    ``total``, so a long sub-epoch is seen alive (the dashboard, ``/metrics``)."""

    name = "worker_progress"
    journaled = False
    worker: int
    trial_id: str
    batches: int
    total: int


@dataclass(frozen=True)
class Traffic(Event):
    """The bytes the driver has sent to and received from its workers so far, and those the
    workers fetched from each other (direct hops); told when they change."""

    name = "traffic"
    journaled = False
    sent: int
    received: int
    between_workers: int


@dataclass(frozen=True)
class EpochEnd(Event):
    name = "epoch_end"
    trial_id: str
    epoch: int
    metrics: dict[str, float]
    time: float


def improved(best: tuple[int, float] | None, epoch: int, metrics: dict[str, float], metric: str,
             mode: str) -> tuple[int, float] | None:
    """(``epoch``, its ``metric``) where that is better under ``mode`` than ``best`` (a tie
    keeps the earlier epoch); else None. A missing or non-finite metric is never better."""
    value = metrics.get(metric)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if best is None or (value < best[1] if mode == "min" else value > best[1]):
        return epoch, float(value)
    return None


@dataclass(frozen=True)
class Decided(Event):
    """The searcher's answer to ``report`` at an epoch end: continue, stop or pause."""

    name = "decision"
    trial_id: str
    epoch: int
    decision: str


@dataclass(frozen=True)
class DecidedPaused(Event):
    """What ``decide`` answered for paused trials: trial -> "continue", "stop" or an exploit."""

    name = "decide"
    decisions: dict[str, Any]
    time: float


@dataclass(frozen=True)
class SearchState(Event):
    """The searcher's state (JSON data, for people reading the journal; resume does not need
    it): whole in ``state``, or in ``delta`` what changed since the entry before (see
    ``cerebro.engine._search_state``). Journals written before deltas have ``state`` only."""

    name = "search_state"
    time: float
    state: dict[str, Any] | None = None
    delta: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        return {"time": self.time, **({"state": self.state} if self.delta is None else {"delta": self.delta})}


@dataclass(frozen=True)
class Exploited(Event):
    name = "exploit"
    trial_id: str
    epoch: int
    source: str
    previous_config: dict[str, Any]
    config: dict[str, Any]
    time: float


@dataclass(frozen=True)
class TrialEnded(Event):
    name = "trial_ended"
    trial_id: str
    status: TrialStatus
    reason: str | None
    time: float


@dataclass(frozen=True)
class TrialTakenUp(Event):
    """Resume took up a trial the journal created before the crash."""

    name = "trial_taken_up"
    journaled = False
    trial_id: str
    config: dict[str, Any]
    max_epochs: int


@dataclass(frozen=True)
class TrialRolledBack(Event):
    """Resume found a trial's latest checkpoint damaged: it redoes epochs from ``to_epoch``."""

    name = "trial_rolled_back"
    trial_id: str
    from_epoch: int
    to_epoch: int
    checkpoints: list[Any]
    time: float


@dataclass(frozen=True)
class StateLost(Event):
    """Direct hops: the only copy of a trial's latest state was on a worker that was lost (or
    that its peers could not reach). The trial goes back to the state the driver holds and
    trains ``partitions`` of ``epoch`` again, with the same seeds: the results do not change."""

    name = "state_lost"
    trial_id: str
    epoch: int
    partitions: list[int]
    reason: str
    time: float


@dataclass(frozen=True)
class TrialRetried(Event):
    """``resume(..., retry_failed=True)`` runs a failed trial again, from its last good epoch:
    its ``trial_ended`` before this line no longer counts."""

    name = "trial_retried"
    trial_id: str
    epoch: int                 # the epoch it goes on from
    time: float


@dataclass(frozen=True)
class RunExtended(Event):
    """``resume(..., epochs=N)``: from here on the run is the one it would have been with
    ``epochs`` from the start. Every trial's budget is ``epochs``, and the ``trials`` that had
    completed at the old budget go on: their ``decision`` and ``trial_ended`` at that epoch,
    before this line, no longer count."""

    name = "run_extended"
    epochs: int
    trials: list[str]
    time: float


@dataclass(frozen=True)
class TrialStopAsked(Event):
    """``cb.stop(run_dir, trial=...)``: the trial ends ``stopped`` at the first decision to go
    on after it, the one about ``epoch`` (its epoch in flight; with the evals of an earlier
    epoch still running, that one; where it pauses, the epoch it paused at)."""

    name = "trial_stop_asked"
    trial_id: str
    epoch: int
    time: float


@dataclass(frozen=True)
class TrialAdded(Event):
    """``cb.add_trial``: the next ``trial_created`` is this config, which the user gave, not
    the searcher."""

    name = "trial_added"
    config: dict[str, Any]
    time: float


EVENTS: dict[str, type[Event]] = {cls.name: cls for cls in (
    RunStarted, RunResumed, RunFinished, RunInterrupted, RunFailed, JournalRepaired, WorkerLost, PartitionsMoved,
    WorkerReplaced, WorkerNotReplaced, WorkersRestarted, TrialCreated, SubEpoch, EpochEnd, Decided,
    DecidedPaused, SearchState, Exploited, TrialEnded, TrialRolledBack, StateLost, TrialRetried, RunExtended,
    TrialStopAsked, TrialAdded)}


def parse_event(record: dict[str, Any]) -> Event | None:
    """The typed event of a journal line; None for a name this version does not know.

    Fields a line lacks (written by an older version) take None; fields this version does
    not know are ignored.
    """
    cls = EVENTS.get(record.get("event", ""))
    if cls is None:
        return None
    values: dict[str, Any] = {name: record.get(name) for name in field_names(cls)}
    if cls is TrialEnded:
        values["status"] = TrialStatus(values["status"])
    elif cls is SubEpoch:
        values["kind"] = TaskKind(values["kind"])
    return cls(**values)
