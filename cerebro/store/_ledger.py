"""The journal read one way: what it says of each trial, event by event.

Resume (:mod:`cerebro.engine._replay`), ``cb.load``'s ``Result`` and ``cerebro status``
all fold the journal through :class:`Ledger`, so a trial's config, last epoch, best epoch
and status are worked out in one place; each adds only what it alone needs (replay the
searcher's answers, ``Result`` the history and schedule rows).

Example:
    >>> from cerebro.store import EpochEnd, TrialCreated, TrialEnded, TrialStatus
    >>> ledger = Ledger(metric="val_loss", mode="min")
    >>> for event in (TrialCreated("t0000", {"lr": 0.1}, 3, 0.0),
    ...               EpochEnd("t0000", 1, {"val_loss": 0.5}, 1.0),
    ...               EpochEnd("t0000", 2, {"val_loss": 0.7}, 2.0),
    ...               TrialEnded("t0000", TrialStatus.STOPPED, "rung 1", 2.0)):
    ...     _ = ledger.apply(event)
    >>> facts = ledger.trials["t0000"]
    >>> facts.epoch, facts.best, facts.status.value
    (2, (1, 0.5), 'stopped')
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from ._events import (
    EpochEnd,
    Exploited,
    RunExtended,
    TrialCreated,
    TrialEnded,
    TrialRetried,
    TrialStatus,
    TrialStopAsked,
    improved,
)


@dataclass
class TrialFacts:
    """What the journal says of one trial so far."""

    trial_id: str
    config: dict[str, Any]                    # the latest: PBT's exploits change it
    max_epochs: int
    warm_started_from: str | None = None
    epoch: int = 0                            # its last journaled epoch
    metrics: dict[str, float] = field(default_factory=dict)       # that epoch's
    epoch_metrics: dict[int, dict[str, float]] = field(default_factory=dict)   # every journaled epoch's
    best: tuple[int, float] | None = None     # (epoch, metric) of its best epoch
    best_metrics: dict[str, float] = field(default_factory=dict)  # that epoch's metrics
    status: TrialStatus | None = None         # None while it is live (or retried, or reopened)
    reason: str | None = None
    exploited_at: int | None = None           # the epoch after which PBT last copied another trial into it
    stop_epoch: int | None = None             # cb.stop(run_dir, trial=...): it ends going on after it


Facts = TypeVar("Facts", bound=TrialFacts)


class Ledger(Generic[Facts]):
    """Folds journal events (parsed: :func:`parse_event`) into each trial's :class:`TrialFacts`;
    ``make`` builds them (a subclass adds a reader's own fields). The best epoch is by
    ``metric`` under ``mode`` (None: not tracked). An event of a trial whose creation the
    ledger did not see (on a damaged line) is ignored."""

    # Without ``make`` a ledger holds TrialFacts; with it, what ``make`` builds (typed as such).
    @overload
    def __init__(self: Ledger[TrialFacts], metric: str | None = None, mode: str = "min") -> None: ...
    @overload
    def __init__(self, metric: str | None = None, mode: str = "min", *, make: Callable[..., Facts]) -> None: ...

    def __init__(self, metric: str | None = None, mode: str = "min", make: Callable[..., Any] = TrialFacts) -> None:
        self.metric, self.mode, self._make = metric, mode, make
        self.trials: dict[str, Facts] = {}

    def fold(self, events: Iterable[Any]) -> Ledger[Facts]:
        for event in events:
            self.apply(event)
        return self

    def apply(self, event: Any) -> Facts | None:
        """Take ``event`` in; the trial it is about (None: none, or one not created)."""
        if isinstance(event, TrialCreated):
            created = self.trials[event.trial_id] = self._make(event.trial_id, dict(event.config), event.max_epochs,
                                                               event.warm_started_from)
            return created
        if isinstance(event, RunExtended):    # cb.resume(..., epochs=N): the completed trials go on
            for trial_id in set(event.trials) & set(self.trials):
                self.trials[trial_id].status = self.trials[trial_id].reason = None
            return None
        trial = self.trials.get(getattr(event, "trial_id", ""))
        if trial is None:
            return None
        match event:
            case EpochEnd():
                trial.epoch, trial.metrics = event.epoch, event.metrics
                trial.epoch_metrics[event.epoch] = event.metrics
                if self.metric is not None and (best := improved(trial.best, event.epoch, event.metrics,
                                                                 self.metric, self.mode)):
                    trial.best, trial.best_metrics = best, event.metrics
            case Exploited():
                trial.config, trial.exploited_at = dict(event.config), event.epoch
            case TrialStopAsked():
                trial.stop_epoch = event.epoch
            case TrialEnded():
                trial.status, trial.reason = event.status, event.reason
            case TrialRetried():
                trial.status = trial.reason = None
        return trial
