"""``fit``'s HOW (backend, workers, store, seed, limits, observers: a :class:`RunOptions`), checked before any work:
the same checks whether the fit starts a run or goes on with the one its store holds
(``fit(..., resume=True)``, :mod:`._rerun`)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .._checks import Boolean, Integer, Optional, Real, quoted
from ..backends import Backend, LocalBackend
from ..data import Dataset
from ..observe._metrics import check_port
from ..observe._mlflow import check_mlflow
from ..store._files import check_location
from ._settings import RunOptions


@dataclass(frozen=True)
class How:
    """``fit``'s options, checked: the backend they name made, the data's partitions known."""

    options: RunOptions
    backend: Backend
    partitions: int               # the data's, or one per worker where it does not say


def check_how(data: Dataset, options: RunOptions) -> How:
    """``data`` and every option of ``fit`` but the searcher's, checked before any work; the
    first bad one raises, naming it."""
    if not isinstance(data, Dataset):
        raise TypeError(f"data must be a cerebro.Dataset (e.g. cb.Dataset.from_numpy(X, y)); "
                        f"got {type(data).__name__}")
    backend = resolve_backend(options.backend, options.workers)
    partitions = data.partitions or backend.workers
    data.check_partitions(partitions)
    if partitions < backend.workers:
        raise ValueError(f"partitions={partitions} is fewer than the {backend.workers} workers; "
                         f"every worker needs a partition, so use more partitions or fewer workers")
    if options.seed is not None:
        Integer(low=0, description="a non-negative integer or None").check("seed", options.seed)
    if options.verbose not in (0, 1):
        raise ValueError(f"verbose={options.verbose!r} must be 0 (silent) or 1 (progress)")
    if options.store is not None:
        check_location("store", options.store)
    check_time_budget(options.time_budget)
    Boolean().check("tensorboard", options.tensorboard)
    check_mlflow(options.mlflow)
    check_metrics_port(options.metrics_port, options.metrics_host)
    Boolean().check("resume", options.resume)
    if options.resume and options.store is None:
        raise ValueError("resume=True goes on with the run in store=, so give the store (the same each time the "
                         "script runs), e.g. store='runs/exp1'")
    return How(options, backend, partitions)


def check_time_budget(seconds: float | None) -> None:
    """``fit``'s or ``resume``'s ``time_budget``: a positive number of seconds, or None."""
    Optional(Real(0, math.inf, low_open=True, high_open=True, description="a positive number of seconds or None")
             ).check("time_budget", seconds)


def check_metrics_port(port: int | None, host: str = "127.0.0.1") -> None:
    """A port (or None) and an address ``fit`` or ``resume`` can serve ``/metrics`` on,
    checked before any work."""
    Optional(Integer(0, 65535, description="a port number (0: any free port) or None")).check("metrics_port", port)
    check_port(port, host)


def resolve_backend(backend: str | Backend, workers: int | None) -> Backend:
    """The backend ``fit(backend=, workers=)`` asks for: the instance given, or local worker
    processes (one per core unless ``workers`` says)."""
    if isinstance(backend, Backend):
        if workers is not None and workers != backend.workers:
            raise ValueError(f"workers={workers!r} differs from the backend's workers={backend.workers}; "
                             f"give the number of workers to the backend only")
        return backend
    if backend != "local":
        raise ValueError(f"backend={quoted(backend)} must be 'local' or a Backend instance such as "
                         f"cb.LocalBackend(workers=4)")
    return LocalBackend(workers=workers if workers is not None else (os.cpu_count() or 1))
