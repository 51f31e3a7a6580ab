"""Grid search: every combination of the ``choice`` values in the space."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .._checks import Constraint, Integer
from ..engine._interface import TrialRequest
from ._base import Searcher
from ._configs import grid_values


class GridSearch(Searcher):
    """Train one trial per combination of the space's ``cb.choice`` values, each for ``epochs``.

    Constants in the space are passed to every trial as they are; any other primitive
    (``uniform``, ``loguniform``, ...) cannot be enumerated and is an error. Trials are
    created in ``itertools.product`` order of the space's keys. A choice among dicts (a
    nested space) gives each branch's own grid in turn: the product within a branch only.

    Example:
        >>> import cerebro as cb
        >>> from cerebro.demo import build, load_data     # an MLP or a small CNN on the 8x8 digits
        >>> space = {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.choice([1e-3, 3e-3]), "batch_size": 32}
        >>> search = cb.GridSearch(build, space, epochs=3, metric="val_accuracy", mode="max")
        >>> result = search.fit(load_data(), workers=2, seed=0)
        >>> result.best.metrics["val_accuracy"] > 0.5
        True
    """

    cannot_extend: ClassVar[str] = ""
    cannot_add: ClassVar[str] = ""
    cannot_multi_objective: ClassVar[str] = ""      # it trains every trial: the front is among them
    _parameters: ClassVar[dict[str, Constraint]] = {"epochs": Integer(low=1)}

    def __init__(self, build: Callable, space: Mapping[str, Any], *, epochs: int = 10,
                 metric: str | list[str] = "val_loss", mode: str | list[str] = "min",
                 patience: int | None = None, min_delta: float = 0.0,
                 warm_start: Any = None, warm_start_epoch: str = "best") -> None:
        """Store the arguments as given; they are checked once every constructor has run."""
        super().__init__(build, space, metric=metric, mode=mode, patience=patience, min_delta=min_delta,
                         warm_start=warm_start, warm_start_epoch=warm_start_epoch)
        self.epochs = epochs

    def _check(self) -> None:
        """Every primitive in the space must be a ``cb.choice``, the only one a grid enumerates."""
        grid_values(self.space, "space")

    def start(self, seed: int) -> None:
        """The grid is still to be suggested."""
        self._pending = True

    def suggest(self) -> list[TrialRequest]:
        """The whole grid at once, in ``itertools.product`` order; nothing after that."""
        if not self._pending:
            return []
        self._pending = False
        return [TrialRequest(config, self.epochs) for config in grid_values(self.space, "space")]
