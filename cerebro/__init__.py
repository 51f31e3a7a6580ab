"""Cerebro: deep-learning model selection at scale with Model Hopper Parallelism."""
from . import metrics
from ._version import __version__ as __version__
from .backends import Backend, LocalBackend, SparkBackend
from .data import Dataset
from .engine import ResumeError, StoreWriteError, TooManyFailuresError, WorkerLostError, resume
from .report import Result, TrialResult, load
from .search import (
    ASHA,
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
from .store import StoreInUseError, UntrustedStateError
from .worker import TorchTrainable

__all__ = ["ASHA", "PBT", "Backend", "Dataset", "GridSearch", "Hyperband", "LocalBackend", "RandomSearch", "Result",
           "ResumeError", "Searcher", "SparkBackend", "StoreInUseError", "StoreWriteError", "TPESearch",
           "TooManyFailuresError", "TorchTrainable", "TrialResult", "UntrustedStateError", "WorkerLostError",
           "choice", "load", "loguniform", "metrics", "quniform", "randint", "resume", "uniform"]
