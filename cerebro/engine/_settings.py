"""What ``fit`` was told about how to run, in one object the engine's parts share."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ._visit_order import VisitScheme


@dataclass(frozen=True)
class Limits:
    """How long a sub-epoch may take, and how many trials may fail before the run stops."""

    trial_timeout: float | None = None
    max_failures: int | None = None

    def __post_init__(self) -> None:
        timeout = self.trial_timeout
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 < timeout < math.inf):
            raise ValueError(f"trial_timeout={timeout!r} must be a positive number of seconds or None")
        failures = self.max_failures
        if failures is not None and (isinstance(failures, bool) or not isinstance(failures, int) or failures < 0):
            raise ValueError(f"max_failures={failures!r} must be an integer >= 0 or None")


@dataclass(frozen=True)
class RunSettings:
    """A run's settings as the driver, the worker pool and the trial book use them.

    Args:
        seed: the run's seed; every random choice derives from it (see ``_seeds``).
        num_partitions: partitions of the data, fixed for the run.
        evaluate: whether the data has a validation split, visited after each epoch.
        limits: ``trial_timeout`` and ``max_failures``.
        visit_scheme: the visit order's scheme, as recorded in run.json.
        heartbeat_interval: seconds between a worker's heartbeats.
        startup_timeout: seconds a worker may take to connect and load its partitions.
    """

    seed: int
    num_partitions: int
    evaluate: bool
    limits: Limits = Limits()
    visit_scheme: VisitScheme = VisitScheme.LATIN
    heartbeat_interval: float = 1.0
    startup_timeout: float = 300.0
