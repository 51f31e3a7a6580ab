"""``fit``'s HOW (backend, workers, store, seed, limits, observers), checked before any work:
the same checks whether the fit starts a run or goes on with the one its store holds
(``fit(..., resume=True)``, :mod:`._rerun`)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .._checks import Boolean, Integer, Optional, Real
from ..backends import Backend, LocalBackend
from ..data import Dataset
from ..observe._metrics import check_port
from ..observe._mlflow import check_mlflow
from ..store._files import check_location
from ._settings import Limits


@dataclass(frozen=True)
class How:
    """``fit``'s keyword arguments, checked: the backend resolved, the partitions known."""

    backend: Backend
    partitions: int               # the data's, or one per worker where it does not say
    seed: int | None              # None: drawn as a run starts (one gone on with keeps its own)
    verbose: int
    store: str | os.PathLike | None
    limits: Limits
    time_budget: float | None
    tensorboard: bool
    mlflow: bool | str
    metrics_port: int | None
    metrics_host: str
    resume: bool


def check_how(data: Dataset, *, backend: str | Backend, workers: int | None, store: str | os.PathLike | None,
              seed: int | None, verbose: int, limits: Limits | None = None, time_budget: float | None = None,
              tensorboard: bool = True, mlflow: bool | str = False, metrics_port: int | None = None,
              metrics_host: str = "127.0.0.1", resume: bool = False) -> How:
    """Every argument of ``fit`` but the searcher's, checked; the first bad one raises, naming it."""
    if not isinstance(data, Dataset):
        raise TypeError(f"data must be a cerebro.Dataset (e.g. cb.Dataset.from_numpy(X, y)); "
                        f"got {type(data).__name__}")
    backend = resolve_backend(backend, workers)
    partitions = data.partitions or backend.workers
    data.check_partitions(partitions)
    if partitions < backend.workers:
        raise ValueError(f"partitions={partitions} is fewer than the {backend.workers} workers; "
                         f"every worker needs a partition, so use more partitions or fewer workers")
    if seed is not None:
        Integer(low=0, description="a non-negative integer or None").check("seed", seed)
    if verbose not in (0, 1):
        raise ValueError(f"verbose={verbose!r} must be 0 (silent) or 1 (progress)")
    if store is not None:
        check_location("store", store)
    check_time_budget(time_budget)
    Boolean().check("tensorboard", tensorboard)
    check_mlflow(mlflow)
    check_metrics_port(metrics_port, metrics_host)
    Boolean().check("resume", resume)
    if resume and store is None:
        raise ValueError("resume=True goes on with the run in store=, so give the store (the same each time the "
                         "script runs), e.g. store='runs/exp1'")
    return How(backend, partitions, seed, verbose, store, Limits() if limits is None else limits, time_budget,
               tensorboard, mlflow, metrics_port, metrics_host, resume)


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
        raise ValueError(f"backend={backend!r} must be 'local' or a Backend instance such as "
                         f"cb.LocalBackend(workers=4)")
    return LocalBackend(workers=workers if workers is not None else (os.cpu_count() or 1))
