"""``cb.simulate``: try a searcher offline, on an objective function instead of training."""
from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Mapping
from numbers import Real
from typing import TYPE_CHECKING, Any

from . import _checks
from ._checks import Integer
from .engine._settings import RunSettings
from .engine._simulate import Simulation, run_simulation
from .search._base import Searcher
from .store import RunStore
from .store._files import check_location

if TYPE_CHECKING:
    from .results import Result


def simulate(searcher: Searcher, objective: Callable[[dict[str, Any], int], Mapping[str, float]], *,
             workers: int = 1, seed: int = 0, epoch_seconds: float | Callable[[dict[str, Any]], float] | None = None,
             store: str | os.PathLike | None = None) -> Result:
    """Run ``searcher`` against ``objective`` with no workers and no training, as the engine
    would schedule it on ``workers`` MOP workers, on simulated time; return its :class:`Result`.

    The decisions are the engine's own (the same trial book, scheduler and searcher calls as
    :meth:`Searcher.fit`), so they are those a real run makes when its trials report these
    metrics: the same trials, stops and promotions on 1 or 8 workers, deterministic for a
    seed. Use it to choose a searcher and its settings on a tabulated or surrogate benchmark
    before spending compute, or to test a searcher of your own (docs/extending.md).

    Args:
        searcher: any :class:`cerebro.Searcher` (its ``build`` is never called).
        objective: ``objective(config, epoch)`` -> the metrics of the trial with ``config``
            after ``epoch`` (1-based), a dict of names to numbers that holds the searcher's
            ``metric``. An objective that raises or answers without the metric fails that
            trial, a metric that is not finite ends it ``diverged``; the search goes on, as in
            a real run. PBT's exploits change a trial's config, not its past: the objective
            sees the new config.
        workers: the MOP workers simulated (one partition each).
        seed: the run's seed, as ``fit``'s.
        epoch_seconds: simulated seconds one epoch of a config takes: a number, or
            ``epoch_seconds(config)``; ``None`` (the default) is 1 second.
        store: the run directory written (the journal and run.json: ``cb.load``, ``cerebro
            status`` and ``cerebro report`` read it). ``None``: a new temporary directory.

    Returns:
        the run's :class:`Result`: ``history()``, ``best``, ``ranked()``, the trials'
        statuses, ``anytime()`` (the best metric against simulated time and trial-epochs) and,
        for several objectives, ``pareto()``.

    Example:
        >>> import cerebro as cb
        >>> space = {"lr": cb.loguniform(1e-4, 1e-1)}
        >>> def objective(config, epoch):      # a learning curve whose best lr is 1e-2
        ...     return {"val_loss": abs(config["lr"] - 1e-2) + 1 / epoch}
        >>> search = cb.ASHA(lambda config: None, space, num_trials=27, max_epochs=9, grace_period=1)
        >>> result = cb.simulate(search, objective, workers=4, seed=0)
        >>> len(result.trials), result.trials[0].status in ("completed", "stopped")
        (27, True)
        >>> result.best.best_metrics["val_loss"] < 0.2
        True
    """
    _check(searcher, objective, workers, seed, epoch_seconds, store)
    simulation = Simulation(objective, workers, _seconds(epoch_seconds))
    first = searcher.objectives()[0]         # what ranks epochs; several objectives: each is checked
    settings = RunSettings(seed, workers, evaluate=False, metric=first.metric, mode=first.mode,
                           patience=searcher.patience, min_delta=searcher.min_delta, tensorboard=False)
    path = tempfile.mkdtemp(prefix="cerebro-simulate-") if store is None else store
    run_store = RunStore.create(path)
    lock = run_store.lock()
    try:
        return run_simulation(searcher, simulation, run_store, settings, searcher._settings())
    finally:
        lock.close()


def _check(searcher: Any, objective: Any, workers: Any, seed: Any, epoch_seconds: Any, store: Any) -> None:
    """Every argument of :func:`simulate`, before anything runs; the first bad one raises, naming it."""
    if not isinstance(searcher, Searcher):
        raise TypeError(f"searcher={searcher!r} must be a cerebro.Searcher, such as cb.ASHA(build, space, ...)")
    searcher._validate()
    if searcher.warm_start is not None:
        raise ValueError(f"warm_start={searcher.warm_start!r}: a simulated run trains nothing, so it has no "
                         f"weights to start from; simulate the searcher without warm_start")
    _checks.Callable(description="a function objective(config, epoch) -> dict of metrics").check("objective",
                                                                                                  objective)
    Integer(low=1).check("workers", workers)
    Integer(low=0, description="a non-negative integer").check("seed", seed)
    if not (callable(epoch_seconds) or epoch_seconds is None or (
            not isinstance(epoch_seconds, bool) and isinstance(epoch_seconds, Real)
            and 0 < float(epoch_seconds) < math.inf)):
        raise ValueError(f"epoch_seconds={epoch_seconds!r} must be a positive, finite number of seconds, a "
                         f"function epoch_seconds(config) -> seconds, or None (1 second)")
    if store is not None:
        check_location("store", store)


def _seconds(epoch_seconds: float | Callable[[dict[str, Any]], float] | None) -> Callable[[dict[str, Any]], float]:
    """``epoch_seconds`` as a function of the config."""
    if callable(epoch_seconds):
        return epoch_seconds
    seconds = 1.0 if epoch_seconds is None else float(epoch_seconds)
    return lambda config: seconds
