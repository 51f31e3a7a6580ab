"""Cerebro: deep-learning model selection at scale with Model Hopper Parallelism.

The public names load on first use (PEP 562): a worker process imports ``cerebro.worker``,
and loading the driver's side with it (pandas, reports, searchers) would cost each worker
45 MB of resident memory. TensorFlow, wherever it is imported from now on, keeps its start-up
banners and retracing warnings out of the terminal (:mod:`cerebro._quiet`).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._quiet import quiet_tensorflow
from ._version import __version__ as __version__

quiet_tensorflow()

# public name -> the package that defines it
_EXPORTS = {
    **dict.fromkeys(["Backend", "DaskBackend", "LocalBackend", "RayBackend", "SparkBackend"], ".backends"),
    "Dataset": ".data",
    **dict.fromkeys(["ResumeError", "StoreWriteError", "TooManyFailuresError", "WorkerLostError", "add_trial", "resume",
                     "stop"],
                    ".engine"),
    "MissingExtraError": "._extras",
    "metrics": ".metrics",
    "predict": ".serve",
    "simulate": "._simulate",
    "sql": ".sql",
    **dict.fromkeys(["Result", "TrialResult", "load"], ".results"),
    **dict.fromkeys(["ASHA", "BOHB", "PBT", "GridSearch", "Hyperband", "RandomSearch", "Searcher", "TPESearch",
                     "choice", "loguniform", "quniform", "randint", "uniform"], ".search"),
    **dict.fromkeys(["StoreInUseError", "TrustKeyError", "UntrustedCodeError", "UntrustedStateError"], ".store"),
    **dict.fromkeys(["KerasTrainable", "TorchTrainable", "Trainable"], ".worker"),
}

__all__ = ["ASHA", "BOHB", "PBT", "Backend", "DaskBackend", "Dataset", "GridSearch", "Hyperband", "KerasTrainable",
           "LocalBackend", "MissingExtraError", "RandomSearch", "RayBackend", "Result", "ResumeError", "Searcher",
           "SparkBackend", "StoreInUseError", "StoreWriteError", "TPESearch", "TooManyFailuresError", "TorchTrainable",
           "Trainable", "TrialResult", "TrustKeyError", "UntrustedCodeError", "UntrustedStateError", "WorkerLostError",
           "add_trial", "choice", "load", "loguniform", "metrics", "predict", "quniform", "randint", "resume",
           "simulate", "sql", "stop", "uniform"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cerebro' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name], __name__)
    value = module if name in ("metrics", "sql") else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API only (not this module's imports and helpers)."""
    return sorted([*__all__, "__version__"])


if TYPE_CHECKING:
    from . import metrics, sql
    from ._extras import MissingExtraError
    from ._simulate import simulate
    from .backends import Backend, DaskBackend, LocalBackend, RayBackend, SparkBackend
    from .data import Dataset
    from .engine import (
        ResumeError,
        StoreWriteError,
        TooManyFailuresError,
        WorkerLostError,
        add_trial,
        resume,
        stop,
    )
    from .results import Result, TrialResult, load
    from .search import (
        ASHA,
        BOHB,
        PBT,
        GridSearch,
        Hyperband,
        RandomSearch,
        Searcher,
        TPESearch,
        choice,
        loguniform,
        quniform,
        randint,
        uniform,
    )
    from .serve import predict
    from .store import StoreInUseError, TrustKeyError, UntrustedCodeError, UntrustedStateError
    from .worker import KerasTrainable, TorchTrainable, Trainable
