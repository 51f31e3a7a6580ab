"""What a trial of a :class:`~cerebro.results.Result` reads of its run: the store, the metric,
how many trials kept their weights, and the run's ``build``. The trials refer to this, not to
the Result: a Result and its trials then form no reference cycle, and are freed the moment
they are no longer used, by reference counting, rather than by a pass of Python's cyclic
collector over every object a 10,000-trial Result holds (a quarter of a second, the GIL held
throughout: the dashboard, which reads a growing run again and again, answered nothing
meanwhile).

Example:
    >>> run = TrialRun(store=None, run_dir="runs/exp1", metric="val_loss", keep_checkpoints=None,
    ...                given_build=len)
    >>> run.build is len
    True
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from ..store import RunStore


@dataclass
class TrialRun:
    """A run as its trials see it (the :class:`~cerebro.results._trial_result.Run` protocol)."""

    store: RunStore
    run_dir: str
    metric: str
    keep_checkpoints: int | None
    given_build: Callable[[dict], Any] | None       # the build given to load or fit; None: the stored one
    _build: Callable[[dict], Any] | None = field(default=None, repr=False)

    @property
    def build(self) -> Callable[[dict], Any]:
        """The given ``build``, or the stored one (unpickled on first use: it is code, so
        only :meth:`TrialResult.model` and resume need it)."""
        if self._build is None:
            self._build = cloudpickle.loads(self.store.read_build()) if self.given_build is None \
                else self.given_build
        return self._build
