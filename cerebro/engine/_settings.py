"""What ``fit`` was told about how to run, in one object the engine's parts share."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .._checks import Integer, Optional, Real
from ..data import Storage
from ._visit_order import VisitScheme


@dataclass(frozen=True)
class WarmStartFrom:
    """The run to start from, and which epoch of its trials (``"best"`` or ``"last"``)."""

    run_dir: str
    epoch: str = "best"


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
        metric, mode: what makes an epoch a trial's best (its weights are kept apart).
        patience, min_delta: early stopping (see :func:`._epoch_rules.plateau`); None: never.
        time_budget: seconds after which the run stops at its trials' next epoch boundaries,
            resumable (None: none; a resume has none).
        warm_start: the finished run whose trials start the ones of equal configs (see ``_warm``).
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
