"""Random search: ``num_trials`` configurations drawn from the space."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..engine import TrialRequest, search_rng
from ._base import Searcher, check_epochs
from ._space import sample_config


class RandomSearch(Searcher):
    """Train ``num_trials`` configurations drawn independently from the space, each for ``epochs``.

    Draws come from the run's seed, so the same seed gives the same configurations.
    Bergstra & Bengio, "Random Search for Hyper-Parameter Optimization", JMLR 2012.

    Example:
        >>> space = {"lr": cb.loguniform(1e-4, 1e-1), "hidden": cb.randint(32, 512)}
        >>> result = cb.RandomSearch(build, space, num_trials=16, epochs=5).fit(data, seed=0)
    """

    def __init__(self, build: Callable, space: Mapping[str, Any], *, num_trials: int = 10,
                 epochs: int = 10, metric: str = "val_loss", mode: str = "min") -> None:
        super().__init__(build, space, metric=metric, mode=mode)
        self.num_trials = num_trials
        self.epochs = epochs

    def _check(self) -> None:
        check_epochs("num_trials", self.num_trials)
        check_epochs("epochs", self.epochs)

    def start(self, seed: int) -> None:
        self._rng = search_rng(seed)
        self._pending = True

    def _settings(self) -> dict[str, Any]:
        return {"num_trials": self.num_trials, "epochs": self.epochs}

    def suggest(self) -> list[TrialRequest]:
        if not self._pending:
            return []
        self._pending = False
        return [TrialRequest(sample_config(self.space, self._rng), self.epochs)
                for _ in range(self.num_trials)]
