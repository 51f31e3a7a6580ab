"""Random search: ``num_trials`` configurations drawn from the space."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .._checks import Constraint, Integer
from ..engine._interface import TrialRequest
from ..engine._seeds import search_rng
from ._base import Searcher
from ._space import sample_config


class RandomSearch(Searcher):
    """Train ``num_trials`` configurations drawn independently from the space, each for ``epochs``.

    Draws come from the run's seed, so the same seed gives the same configurations.
    Bergstra & Bengio, "Random Search for Hyper-Parameter Optimization", JMLR 2012.

    Example:
        >>> import cerebro as cb
        >>> from cerebro.demo import build, load_data     # an MLP or a small CNN on the 8x8 digits
        >>> space = {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.loguniform(1e-4, 1e-2),
        ...          "batch_size": cb.choice([32, 64])}
        >>> search = cb.RandomSearch(build, space, num_trials=4, epochs=3, metric="val_accuracy", mode="max")
        >>> result = search.fit(load_data(), workers=2, seed=0)
        >>> result.best.metrics["val_accuracy"] > 0.5
        True
    """

    cannot_extend: ClassVar[str] = ""
    cannot_add: ClassVar[str] = ""
    cannot_multi_objective: ClassVar[str] = ""      # it trains every trial: the front is among them
    _parameters: ClassVar[dict[str, Constraint]] = {"num_trials": Integer(low=1), "epochs": Integer(low=1)}

    def __init__(self, build: Callable, space: Mapping[str, Any], *, num_trials: int = 10,
                 epochs: int = 10, metric: str | list[str] = "val_loss", mode: str | list[str] = "min",
                 patience: int | None = None, min_delta: float = 0.0,
                 warm_start: Any = None, warm_start_epoch: str = "best") -> None:
        """Store the arguments as given; they are checked once every constructor has run."""
        super().__init__(build, space, metric=metric, mode=mode, patience=patience, min_delta=min_delta,
                         warm_start=warm_start, warm_start_epoch=warm_start_epoch)
        self.num_trials = num_trials
        self.epochs = epochs

    def start(self, seed: int) -> None:
        """Draw from the run's ``seed``; all trials are still to be suggested."""
        self._rng = search_rng(seed)
        self._pending = True

    def suggest(self) -> list[TrialRequest]:
        """All ``num_trials`` configurations at once, drawn in trial order; nothing after that."""
        if not self._pending:
            return []
        self._pending = False
        return [TrialRequest(sample_config(self.space, self._rng), self.epochs)
                for _ in range(self.num_trials)]
