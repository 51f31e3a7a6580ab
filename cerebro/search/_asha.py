"""ASHA: asynchronous successive halving, made reproducible."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .._checks import Constraint, Integer, Real
from ..engine._interface import Decision, TrialRequest
from ..engine._seeds import search_rng, trial_index
from ._base import Searcher
from ._rungs import Rungs
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
        >>> import cerebro as cb
        >>> from cerebro.demo import build, load_data     # an MLP or a small CNN on the 8x8 digits
        >>> space = {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.loguniform(1e-4, 1e-2), "batch_size": 32}
        >>> search = cb.ASHA(build, space, num_trials=8, max_epochs=9, grace_period=1, reduction_factor=3,
        ...                  metric="val_accuracy", mode="max")
        >>> result = search.fit(load_data(), workers=2, seed=0)
        >>> result.best.metrics["val_accuracy"] > 0.5
        True
    """

    cannot_extend: ClassVar[str] = (
        "its rungs are placed by max_epochs, so with another budget other trials would have been promoted")
    cannot_multi_objective: ClassVar[str] = "it promotes the trials that rank best at each rung on one metric"
    _parameters: ClassVar[dict[str, Constraint]] = {
        "num_trials": Integer(low=1), "max_epochs": Integer(low=1), "grace_period": Integer(low=1),
        "reduction_factor": Real(low=2), "max_concurrent": Integer(low=1)}

    def __init__(self, build: Callable, space: Mapping[str, Any], *, num_trials: int = 20,
                 max_epochs: int = 27, grace_period: int = 1, reduction_factor: float = 3,
                 max_concurrent: int = 16, metric: str = "val_loss", mode: str = "min",
                 patience: int | None = None, min_delta: float = 0.0,
                 warm_start: Any = None, warm_start_epoch: str = "best") -> None:
        """Store the arguments as given; they are checked once every constructor has run."""
        super().__init__(build, space, metric=metric, mode=mode, patience=patience, min_delta=min_delta,
                         warm_start=warm_start, warm_start_epoch=warm_start_epoch)
        self.num_trials = num_trials
        self.max_epochs = max_epochs
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.max_concurrent = max_concurrent

    def _check(self) -> None:
        """The first rung cannot lie beyond ``max_epochs``."""
        if self.grace_period > self.max_epochs:
            raise ValueError(f"grace_period={self.grace_period!r} must be at most max_epochs={self.max_epochs!r}")

    def start(self, seed: int) -> None:
        """Draw from the run's ``seed``, with empty rungs and no trial created yet."""
        self._rng = search_rng(seed)
        self._rungs = Rungs(self.grace_period, self.reduction_factor, self.max_epochs, self.mode)
        self._created = 0

    def suggest(self) -> list[TrialRequest]:
        """New trials up to ``max_concurrent`` live ones, until ``num_trials`` were created."""
        count = min(self.num_trials - self._created, self.max_concurrent - len(self._rungs.live))
        requests = [TrialRequest(sample_config(self.space, self._rng), self.max_epochs) for _ in range(count)]
        for index in range(self._created, self._created + count):
            self._rungs.started(index)
        self._created += count
        return requests

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """Go on between rungs; at a rung go on, stop, or wait for the older trials (see :class:`Rungs`)."""
        return self._rungs.report(trial_index(trial_id), epoch, metrics[self.metric])

    def decide(self) -> dict[str, Decision]:
        """Decisions for waiting trials whose older peers have all reached the rung or ended."""
        return self._rungs.decide()

    def continues_after(self, trial_id: str, epoch: int) -> bool:
        """Between rungs a trial goes on whatever its metrics."""
        return epoch not in self._rungs.epochs

    def trial_ended(self, trial_id: str, status: str) -> None:
        """A trial that ended no longer holds up younger ones at its next rung."""
        self._rungs.ended(trial_index(trial_id))

    def stop_reason(self, trial_id: str) -> str | None:
        """The rung a stopped trial was stopped at, its rank and how many went on."""
        return self._rungs.reason(trial_index(trial_id))

    def state(self) -> dict[str, Any]:
        """How many trials were created, the waiting trials and every rung's values."""
        return {"created": self._created, **self._rungs.state()}
