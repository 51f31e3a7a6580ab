"""The searcher base class: WHAT to search, and ``fit`` that runs it with MOP."""
from __future__ import annotations

import os
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle
import numpy as np
import torch

from ..backends import Backend, LocalBackend
from ..data import Dataset
from ..engine import Decision, TrialRequest, execute
from ..report import ConsoleProgress, NoProgress, Result
from ..worker import TorchTrainable
from ._space import check_space, sample_config


def check_epochs(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1")
    return int(value)


class Searcher(ABC):
    """A model selection algorithm on top of MOP.

    The constructor says WHAT to search; :meth:`fit` says HOW to run it. Arguments are
    stored as given and checked at ``fit``, before any worker starts.

    Subclasses implement narrow waist 1 (:class:`cerebro.engine.SearchPolicy`):
    :meth:`suggest` (which trials to start now) and, optionally, :meth:`report` (continue
    or stop a trial after an epoch) and :meth:`trial_ended`. :meth:`_start` resets any
    state at the start of each ``fit``.

    Args:
        build: ``build(config)`` -> :class:`cerebro.TorchTrainable`; runs on the workers.
        space: parameter name -> a primitive (``cb.choice``, ``cb.uniform``, ...) or a constant.
        metric: what ``result.best`` ranks by: ``val_loss`` (default), ``train_loss``, or
            ``train_<name>`` / ``val_<name>`` for a metric the trainable logs.
        mode: ``"min"`` or ``"max"``.
    """

    def __init__(self, build: Callable[[dict], TorchTrainable], space: Mapping[str, Any], *,
                 metric: str = "val_loss", mode: str = "min") -> None:
        self.build = build
        self.space = space
        self.metric = metric
        self.mode = mode

    # --- narrow waist 1 -----------------------------------------------------------------
    @abstractmethod
    def suggest(self) -> list[TrialRequest]:
        """Trials to start now; called at the start and after every trial's epoch."""

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """``trial_id`` finished ``epoch`` with ``metrics``; the default lets it go on."""
        return Decision.CONTINUE

    def trial_ended(self, trial_id: str, status: str) -> None:
        """``trial_id`` ended as ``status``; the default ignores it."""

    # --- hooks for subclasses -----------------------------------------------------------
    def _check(self) -> None:
        """Validate the subclass's own constructor arguments; raise ValueError naming them."""

    def _start(self, seed: int) -> None:
        """Reset the search for a new ``fit`` with the run's ``seed``."""

    def _settings(self) -> dict[str, Any]:
        """The subclass's arguments, for run.json."""
        return {}

    # --- running it ---------------------------------------------------------------------
    def fit(self, data: Dataset, *, backend: str | Backend = "local", workers: int | None = None,
            store: str | os.PathLike | None = None, seed: int | None = None,
            verbose: int = 1) -> Result:
        """Train the trials of this search with MOP and return the :class:`Result`.

        Args:
            data: a :class:`cerebro.Dataset`.
            backend: ``"local"`` (worker processes on this machine) or a Backend instance.
            workers: number of local workers (default: the machine's cores).
            store: the run directory (default: ``./cerebro_runs/<searcher>-<time>``).
            seed: the run's seed; ``None`` draws one, recorded in run.json and ``result.seed``.
            verbose: 1 shows live progress on stderr, 0 is silent.
        """
        self._check_common()
        self._check()
        if not isinstance(data, Dataset):
            raise TypeError(f"data must be a cerebro.Dataset (e.g. cb.Dataset.from_numpy(X, y)); "
                            f"got {type(data).__name__}")
        backend = _resolve_backend(backend, workers)
        num_partitions = data.partitions or backend.workers
        data.check_partitions(num_partitions)
        if seed is None:
            seed = secrets.randbelow(2**31)
        elif not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative integer or None")
        if verbose not in (0, 1):
            raise ValueError(f"verbose={verbose!r} must be 0 (silent) or 1 (progress)")
        build_blob = _pickle_build(self.build)
        self._check_metric(data.has_validation)
        if store is None:
            store = os.path.join("cerebro_runs", f"{type(self).__name__.lower()}-"
                                                 f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")
        self._start(int(seed))
        progress = ConsoleProgress(self.metric, self.mode) if verbose else NoProgress()
        settings = {"class": type(self).__name__, "metric": self.metric, "mode": self.mode,
                    "space": {k: repr(v) for k, v in self.space.items()}, **self._settings()}
        return execute(self, build=self.build, build_blob=build_blob, data=data,
                       num_partitions=num_partitions, backend=backend, store=os.fspath(store),
                       seed=int(seed), searcher=settings, progress=progress)

    def _check_common(self) -> None:
        if not callable(self.build):
            raise TypeError(f"build={self.build!r} must be a function build(config) -> cb.TorchTrainable")
        check_space(self.space)
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode={self.mode!r} must be 'min' or 'max'")
        if not isinstance(self.metric, str):
            raise TypeError(f"metric={self.metric!r} must be a string such as 'val_loss'")

    def _check_metric(self, has_validation: bool) -> None:
        """``metric`` must be one the trainable logs; learned from a build on the meta device."""
        try:
            with torch.device("meta"):
                trainable = self.build(sample_config(self.space, np.random.default_rng(0)))
        except Exception:
            return  # that trial will fail on its worker, with its traceback
        if not isinstance(trainable, TorchTrainable):
            raise TypeError(f"build(config) must return a cerebro.TorchTrainable; got {type(trainable).__name__}")
        prefixes = ("train", "val") if has_validation else ("train",)
        logged = [f"{p}_{name}" for p in prefixes for name in ("loss", *trainable.metrics)]
        if self.metric not in logged:
            hint = "" if has_validation else " (the data has no validation split)"
            raise ValueError(f"metric={self.metric!r} is not logged{hint}; logged metrics are {logged}")


def _resolve_backend(backend: str | Backend, workers: int | None) -> Backend:
    if isinstance(backend, Backend):
        if workers is not None and workers != backend.workers:
            raise ValueError(f"workers={workers!r} differs from the backend's workers={backend.workers}; "
                             f"give the number of workers to the backend only")
        return backend
    if backend != "local":
        raise ValueError(f"backend={backend!r} must be 'local' or a Backend instance such as "
                         f"cb.LocalBackend(workers=4)")
    return LocalBackend(workers=workers if workers is not None else (os.cpu_count() or 1))


def _pickle_build(build: Callable) -> bytes:
    try:
        return cloudpickle.dumps(build)
    except Exception as error:
        raise TypeError(f"build={build!r} cannot be pickled to send to the workers: "
                        f"{type(error).__name__}: {error}") from None
