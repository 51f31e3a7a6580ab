"""ASHA: asynchronous successive halving, made reproducible."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..engine import Decision, TrialRequest, search_rng, trial_index
from ._base import Searcher, check_epochs
from ._rungs import Rungs, check_reduction
from ._space import sample_config


class ASHA(Searcher):
    """Asynchronous successive halving (Li et al., "A System for Massively Parallel
    Hyperparameter Tuning", MLSys 2020).

    ``num_trials`` configurations are drawn from the space, at most ``max_concurrent`` live
    at once. Rungs lie at ``grace_period * reduction_factor**k`` epochs below ``max_epochs``.
    A trial reaching a rung goes on only if it ranks in the top ``1/reduction_factor`` of
    the trials that reached that rung, else it is stopped there.

    Reproducible by construction: a trial is compared with the older trials (smaller id) at
    its rung, never with whichever happened to arrive first, so it waits (paused, its
    worker free for others) until every older trial has reached the rung or ended. The
    decisions then equal those of ASHA with trials arriving in id order, on any number of
    workers, and ``max_concurrent`` changes only the timing.

    Example:
        >>> space = {"lr": cb.loguniform(1e-4, 1e-1), "hidden": cb.choice([64, 256])}
        >>> result = cb.ASHA(build, space, num_trials=32, max_epochs=27, grace_period=1,
        ...                  reduction_factor=3).fit(data, seed=0)
    """

    def __init__(self, build: Callable, space: Mapping[str, Any], *, num_trials: int = 20,
                 max_epochs: int = 27, grace_period: int = 1, reduction_factor: float = 3,
                 max_concurrent: int = 16, metric: str = "val_loss", mode: str = "min") -> None:
        super().__init__(build, space, metric=metric, mode=mode)
        self.num_trials = num_trials
        self.max_epochs = max_epochs
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.max_concurrent = max_concurrent

    def _check(self) -> None:
        check_epochs("num_trials", self.num_trials)
        check_epochs("max_epochs", self.max_epochs)
        check_epochs("grace_period", self.grace_period)
        check_epochs("max_concurrent", self.max_concurrent)
        check_reduction("reduction_factor", self.reduction_factor)
        if self.grace_period > self.max_epochs:
            raise ValueError(f"grace_period={self.grace_period!r} must be at most max_epochs={self.max_epochs!r}")

    def _settings(self) -> dict[str, Any]:
        return {"num_trials": self.num_trials, "max_epochs": self.max_epochs, "grace_period": self.grace_period,
                "reduction_factor": self.reduction_factor, "max_concurrent": self.max_concurrent}

    def start(self, seed: int) -> None:
        self._rng = search_rng(seed)
        self._rungs = Rungs(self.grace_period, self.reduction_factor, self.max_epochs, self.mode)
        self._created = 0

    def suggest(self) -> list[TrialRequest]:
        count = min(self.num_trials - self._created, self.max_concurrent - len(self._rungs.live))
        requests = [TrialRequest(sample_config(self.space, self._rng), self.max_epochs) for _ in range(count)]
        for index in range(self._created, self._created + count):
            self._rungs.started(index)
        self._created += count
        return requests

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        return self._rungs.report(trial_index(trial_id), epoch, metrics[self.metric])

    def decide(self) -> dict[str, Decision]:
        return self._rungs.decide()

    def trial_ended(self, trial_id: str, status: str) -> None:
        self._rungs.ended(trial_index(trial_id))

    def stop_reason(self, trial_id: str) -> str | None:
        return self._rungs.reason(trial_index(trial_id))

    def state(self) -> dict[str, Any]:
        return {"created": self._created, **self._rungs.state()}
