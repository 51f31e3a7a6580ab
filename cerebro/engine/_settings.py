"""What ``fit`` was told about how to run, in one object the engine's parts share, written
to run.json and read back from it (to resume) here only."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._checks import Integer, Optional, Real, quoted
from .._objectives import primary
from ..data import Storage
from ..store._run_info import RunInfoError
from ..store._trust import signature, signed_by_me
from ..worker._keras import TRAINING_BACKENDS as KERAS_BACKENDS
from ._visit_order import LEGACY_SCHEME, VisitScheme

if TYPE_CHECKING:
    import os

    from ..backends import Backend


@dataclass(frozen=True)
class WarmStartFrom:
    """The run to start from, and which epoch of its trials (``"best"`` or ``"last"``)."""

    run_dir: str
    epoch: str = "best"

    @classmethod
    def of_searcher(cls, searcher: dict[str, Any]) -> WarmStartFrom | None:
        """What the searcher's settings (run.json's ``searcher``) say to warm-start from."""
        run_dir = searcher.get("warm_start")
        return None if run_dir is None else cls(run_dir, searcher.get("warm_start_epoch", "best"))


@dataclass(frozen=True)
class Limits:
    """How long a sub-epoch may take, how many trials may fail before the run stops, on how
    many lost workers a trial may be before it is taken for their cause and fails, and the
    finished trials whose weights stay on disk (``keep_checkpoints``: the best k; None: all)."""

    trial_timeout: float | None = None
    max_failures: int | None = None
    max_trial_losses: int = 3
    keep_checkpoints: int | None = None
    hang_after: float | None = 300.0     # seconds without a new batch (see _hangs); None: never

    def __post_init__(self) -> None:
        for name, constraint in _LIMITS.items():
            constraint.check(name, getattr(self, name))
        # numpy numbers pass; run.json and the messages want them plain
        if self.max_failures is not None:
            object.__setattr__(self, "max_failures", int(self.max_failures))
        object.__setattr__(self, "max_trial_losses", int(self.max_trial_losses))
        if self.keep_checkpoints is not None:
            object.__setattr__(self, "keep_checkpoints", int(self.keep_checkpoints))
        for name in ("trial_timeout", "hang_after"):
            value = getattr(self, name)
            if value is not None and type(value) not in (int, float):
                object.__setattr__(self, name, float(value))


_LIMITS = {"trial_timeout": Optional(Real(0, math.inf, low_open=True, high_open=True,
                                          description="a positive number of seconds or None")),
           "max_failures": Optional(Integer(low=0, description="an integer >= 0 or None")),
           "max_trial_losses": Integer(low=1, description="a positive integer"),
           "keep_checkpoints": Optional(Integer(low=1, description="a positive integer or None")),
           "hang_after": Optional(Real(0, math.inf, low_open=True, high_open=True,
                                       description="a positive number of seconds or None"))}


@dataclass(frozen=True)
class RunOptions:
    """How ``fit`` is to run a search: its keywords, as the user gave them, in one object.

    :meth:`cerebro.Searcher.fit` builds it (its keywords and their defaults are the users'
    contract); :func:`._how.check_how` checks it before any work and resolves it into a
    :class:`._how.How` (the backend made, the partitions known), from which the run's
    :class:`RunSettings` are made and written to run.json. See ``Searcher.fit`` for each field.
    """

    backend: str | Backend
    workers: int | None
    store: str | os.PathLike | None
    seed: int | None
    verbose: int
    limits: Limits
    time_budget: float | None
    tensorboard: bool
    mlflow: bool | str
    metrics_port: int | None
    metrics_host: str
    resume: bool


@dataclass(frozen=True)
class RunSettings:
    """A run's settings as the driver, the worker pool and the trial book use them.

    Args:
        seed: the run's seed; every random choice derives from it (see ``_seeds``).
        num_partitions: partitions of the data, fixed for the run.
        evaluate: whether the data has a validation split, visited after each epoch.
        limits: ``trial_timeout``, ``max_failures`` and ``max_trial_losses``.
        visit_scheme: the visit order's scheme, as recorded in run.json.
        storage: how workers hold their partitions (in memory or streamed; a local cache).
        heartbeat_interval: seconds between a worker's heartbeats.
        startup_timeout: seconds a worker may take to connect and load its partitions.
        keras_backend: the Keras backend the workers use, where the build makes Keras models.
        metric, mode: what makes an epoch a trial's best (its weights are kept apart): the
            primary (first) objective of a search with several (see :mod:`cerebro._objectives`).
        patience, min_delta: early stopping (see :func:`._epoch_rules.plateau`); None: never.
        time_budget: seconds after which the run stops at its trials' next epoch boundaries,
            resumable (None: none); a resume's counts from its own start (none unless given).
        warm_start: the finished run whose trials start the ones of equal configs (see ``_warm``).
        tensorboard, mlflow: what observes the run besides the console (see ``observers``).
        metrics_port: where the driver serves the run's Prometheus ``/metrics`` (None: nowhere).
        metrics_host: the address it serves on ("127.0.0.1": this machine alone; "0.0.0.0": every interface).
    """

    seed: int
    num_partitions: int
    evaluate: bool
    limits: Limits = Limits()
    visit_scheme: VisitScheme = VisitScheme.LATIN
    storage: Storage = Storage()
    heartbeat_interval: float = 1.0
    startup_timeout: float = 300.0
    keras_backend: str | None = None
    metric: str = "val_loss"
    mode: str = "min"
    patience: int | None = None
    min_delta: float = 0.0
    time_budget: float | None = None
    warm_start: WarmStartFrom | None = None
    tensorboard: bool = True
    mlflow: bool | str = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def budget_note(self) -> str | None:
        """Why a run with a time budget is not reproducible as it stands; None without one."""
        if self.time_budget is None:
            return None
        return (f"time_budget={self.time_budget:g}: the run stops at its trials' first epoch boundaries after "
                f"{self.time_budget:g} s, so which trials and epochs finish by then depends on timing (resume goes "
                f"on to the reproducible results)")

    def run_info(self) -> dict[str, Any]:
        """The entries of run.json these settings own; the data's three are under ``data``,
        and ``metric``, ``mode``, early stopping and warm start are the searcher's own."""
        budget = None if self.time_budget is None else {"seconds": self.time_budget, "note": self.budget_note()}
        return {"seed": self.seed, "limits": dataclasses.asdict(self.limits), "time_budget": budget,
                "visit_order": self.visit_scheme.value, "keras_backend": self.keras_backend,
                "tensorboard": self.tensorboard, "mlflow": self.mlflow,
                "data": {"partitions": self.num_partitions, "in_memory": self.storage.in_memory,
                         "cache_dir": self.storage.cache_dir}}

    @classmethod
    def from_run_info(cls, info: dict[str, Any], trusted: bool = False) -> RunSettings:
        """The settings of the run whose run.json holds ``info``, to resume it: as it ran, but
        with no time budget (older runs lack some entries: their defaults then). Where the run
        directory is not ``trusted``, nothing in it points the run elsewhere: an MLflow tracking
        URI or a cache directory it names is not used (said once each), a run to warm-start
        from is refused (its weights would be copied here); a Keras backend must be one that
        trains, whoever wrote it; its limits are the defaults (said once). A run.json whose
        pointers and counts this user's key signed (as every run this user starts does:
        :func:`sign_pointers`) is trusted in them."""
        searcher, data = info["searcher"], info["data"]
        sized = counts_trusted(info, trusted)
        trusted = trusted or signed_by_me(pointers(info), str(info.get("pointers_signed", "")).encode(),
                                          info.get("run_id"))
        mlflow, cache_dir = info.get("mlflow", False), data.get("cache_dir")
        warm_start, keras_backend = WarmStartFrom.of_searcher(searcher), info.get("keras_backend")
        _check_keras_backend(keras_backend)
        if not trusted:
            mlflow, cache_dir = _untrusted(mlflow, cache_dir)
            _refuse_untrusted_warm_start(warm_start)
            _refuse_untrusted_keras_backend(keras_backend)
        first = primary(searcher["metric"], searcher["mode"])
        limits = _limits(info.get("limits", {}))
        if limits != Limits() and not sized:
            limits = _untrusted_limits(limits)
        return cls(info["seed"], data["partitions"], _evaluates(data.get("val_rows")),
                   limits, _visit_scheme(info.get("visit_order", LEGACY_SCHEME.value)),
                   Storage(data.get("in_memory", True), cache_dir),
                   keras_backend=keras_backend, metric=first.metric, mode=first.mode,
                   patience=searcher.get("patience"), min_delta=searcher.get("min_delta", 0.0),
                   warm_start=warm_start, tensorboard=info.get("tensorboard", False),
                   mlflow=mlflow)


def pointers(info: dict[str, Any]) -> bytes:
    """What in run.json points a resume elsewhere: a run to warm-start from, a module (the
    Keras backend), a directory (the cache), a server (MLflow's)."""
    searcher, data = info.get("searcher", {}), info.get("data", {})
    return json.dumps([searcher.get("warm_start"), searcher.get("warm_start_epoch"), info.get("keras_backend"),
                       data.get("cache_dir"), info.get("mlflow")], default=str).encode()


def counts(info: dict[str, Any]) -> bytes:
    """What in run.json sizes a resume: the workers it starts, and its limits (how long a
    sub-epoch may hang, the losses and failures taken, the checkpoints kept)."""
    return json.dumps([info.get("workers"), info.get("limits")], default=str, sort_keys=True).encode()


def counts_trusted(info: dict[str, Any], trusted: bool = False) -> bool:
    """Whether a resume may take run.json's :func:`counts` as they are: the user said so
    (``trusted``), or this user's key signed them for this run."""
    return trusted or signed_by_me(counts(info), str(info.get("counts_signed", "")).encode(), info.get("run_id"))


def sign_pointers(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with its :func:`pointers` and :func:`counts` signed by this user's key for its
    run (where there is a key): a resume of this user's own run uses them as they are, an
    edited one not."""
    pointed, sized = signature(pointers(info), info["run_id"]), signature(counts(info), info["run_id"])
    if pointed is None or sized is None:
        return info
    return {**info, "pointers_signed": pointed.decode(), "counts_signed": sized.decode()}


def _limits(value: Any) -> Limits:
    """run.json's limits, named where they are no object of a run's limits (Python's own
    error names an unknown key whole, and names no file)."""
    known = [field.name for field in dataclasses.fields(Limits)]
    if not isinstance(value, dict) or not set(value) <= set(known):
        raise RunInfoError(f"run.json's limits is {quoted(value)}; a run's is an object of {', '.join(known)}: the "
                           f"run directory was edited")
    return Limits(**value)


def _visit_scheme(value: Any) -> VisitScheme:
    """run.json's visit order, named where it is none (Python's own error quotes all of it)."""
    schemes = [scheme.value for scheme in VisitScheme]
    if value not in schemes:
        raise RunInfoError(f"run.json's visit_order is {quoted(value)}; a run's is one of {', '.join(schemes)}: the "
                           f"run directory was edited")
    return VisitScheme(value)


def _evaluates(val_rows: Any) -> bool:
    """Whether the run has validation rows, from run.json's count of each partition's."""
    if not isinstance(val_rows, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in val_rows):
        raise RunInfoError(f"run.json's data.val_rows is {quoted(val_rows)}; a run's is a list of whole numbers, "
                           f"one per partition: the run directory was edited")
    return sum(val_rows) > 0


def _check_keras_backend(keras_backend: Any) -> None:
    """run.json's Keras backend names the module a worker imports: one that trains, or none."""
    if keras_backend not in (None, *KERAS_BACKENDS):
        raise RunInfoError(f"run.json's keras_backend is {quoted(keras_backend)}; a run's is one of "
                           f"{', '.join(KERAS_BACKENDS)} or null (a torch run): the run directory was edited")


def _refuse_untrusted_warm_start(warm_start: WarmStartFrom | None) -> None:
    """A warm start named by an untrusted run.json would copy another run's weights (one this
    user may read, others may not) into this run's directory: refused, saying how to trust it."""
    if warm_start is not None:
        raise RunInfoError(f"run.json's searcher.warm_start is {quoted(warm_start.run_dir)}: resuming would copy that "
                           f"run's weights into this one, and a run directory's settings may have been edited by "
                           f"anyone who can write it; if you made this run, resume it with trust=True (--trust)")


def _refuse_untrusted_keras_backend(keras_backend: str | None) -> None:
    """An untrusted run.json's Keras backend is taken only where the user's ``KERAS_BACKEND``
    names it too: the fork server and every worker import Keras on it (a torch run edited to
    say 'jax' imported JAX in each)."""
    if keras_backend is not None and os.environ.get("KERAS_BACKEND") != keras_backend:
        raise RunInfoError(f"run.json's keras_backend is {quoted(keras_backend)}: resuming would import Keras on it in "
                           f"every worker, and a run directory's settings may have been edited by anyone who can "
                           f"write it; set KERAS_BACKEND={keras_backend} to resume on it, or if you made this run, "
                           f"resume it with trust=True (--trust)")


def _untrusted_limits(limits: Limits) -> Limits:
    """The limits a resume takes from an untrusted run.json: the defaults (an edit could make
    every sub-epoch a hang, a trial that kills its workers retried without end, or drop the
    checkpoints kept), said once."""
    warnings.warn(f"run.json's limits {quoted(dataclasses.asdict(limits))} are not signed by your key for this run "
                  f"(it was edited, or made by another user or an older version), so this resume keeps the default "
                  f"limits: resume with trust=True (--trust) to use them", stacklevel=4)
    return Limits()


def _untrusted(mlflow: Any, cache_dir: Any) -> tuple[bool, None]:
    """What a resume takes from an untrusted run.json's ``mlflow`` and ``cache_dir``: the run
    directory's own MLflow store (True) or none, and the default cache; what it named
    elsewhere (a server that would get the run's configs, a directory to write into) is left."""
    for name, value in (("mlflow", mlflow if not isinstance(mlflow, bool) else None), ("data.cache_dir", cache_dir)):
        if value is not None:
            warnings.warn(f"run.json's {name} is {quoted(value)}; a run directory's settings may have been edited by "
                          f"anyone who can write it, so this resume does not use it: resume with trust=True "
                          f"(--trust) to use it", stacklevel=4)
    return mlflow is True, None
