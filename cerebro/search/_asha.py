"""ASHA: asynchronous successive halving, made reproducible."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..engine import Decision, TrialRequest, search_rng, trial_index, trial_name
from ._base import Searcher, check_epochs
from ._ranking import ranked
from ._space import sample_config


def check_reduction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 2:
        raise ValueError(f"{name}={value!r} must be a number >= 2")
    return float(value)


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
        self._rung_epochs: list[int] = []
        epoch = self.grace_period
        while epoch < self.max_epochs:
            self._rung_epochs.append(epoch)
            epoch = math.ceil(epoch * self.reduction_factor)
        self._values: list[dict[int, float]] = [{} for _ in self._rung_epochs]   # rung -> trial -> value
        self._created = 0
        self._live: set[int] = set()
        self._waiting: dict[int, int] = {}          # paused trial -> its rung
        self._reasons: dict[int, str] = {}

    def suggest(self) -> list[TrialRequest]:
        count = min(self.num_trials - self._created, self.max_concurrent - len(self._live))
        requests = [TrialRequest(sample_config(self.space, self._rng), self.max_epochs) for _ in range(count)]
        self._live.update(range(self._created, self._created + count))
        self._created += count
        return requests

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        if epoch not in self._rung_epochs:
            return Decision.CONTINUE
        index, rung = trial_index(trial_id), self._rung_epochs.index(epoch)
        self._values[rung][index] = metrics[self.metric]
        decision = self._judge(index, rung)
        if decision is None:
            self._waiting[index] = rung
            return Decision.PAUSE
        return decision

    def decide(self) -> dict[str, Decision]:
        decisions = {}
        for index, rung in sorted(self._waiting.items()):
            decision = self._judge(index, rung)
            if decision is not None:
                del self._waiting[index]
                decisions[trial_name(index)] = decision
        return decisions

    def _judge(self, index: int, rung: int) -> Decision | None:
        """Go on or stop at ``rung``; None while an older trial may still reach it."""
        values = self._values[rung]
        if any(older not in values and older in self._live for older in range(index)):
            return None
        peers = {older: value for older, value in values.items() if older <= index}
        rank = ranked(peers, self.mode).index(index)
        if rank < len(peers) / self.reduction_factor:
            return Decision.CONTINUE
        self._reasons[index] = (f"stopped at rung {rung} (epoch {self._rung_epochs[rung]}): ranked {rank + 1} of "
                                f"{len(peers)}, only the top {math.ceil(len(peers) / self.reduction_factor)} go on")
        return Decision.STOP

    def trial_ended(self, trial_id: str, status: str) -> None:
        self._live.discard(trial_index(trial_id))

    def stop_reason(self, trial_id: str) -> str | None:
        return self._reasons.get(trial_index(trial_id))

    def state(self) -> dict[str, Any]:
        return {"created": self._created, "waiting": {trial_name(i): r for i, r in sorted(self._waiting.items())},
                "rungs": [{"epoch": epoch, "values": {trial_name(i): v for i, v in sorted(values.items())}}
                          for epoch, values in zip(self._rung_epochs, self._values)]}
