"""A backend starts worker processes somewhere; everything else is the engine's job."""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import Any

from .._checks import Integer, Real


class Hops(enum.StrEnum):
    """How a trial's state goes from the worker that trained it to the one that trains it next.

    ``DIRECT`` (the default): worker to worker, over an authenticated connection; the driver
    only says who sends what to whom, and the worker that ends an epoch writes the state to
    the store, where it becomes the checkpoint. ``DRIVER``: every hop goes through the
    driver, for clusters whose workers cannot open connections to each other (firewalled
    executors, some container networks).
    """

    DIRECT = "direct"
    DRIVER = "driver"

POSITIVE = Integer(low=1, description="a positive integer")
HEARTBEAT_TIMEOUT = Real(low=1, low_open=True, description="a number of seconds > 1")
MAX_RESTARTS = Integer(low=0)


def check_hops(value: Any) -> Hops:
    """``value`` as :class:`Hops`; raises unless it is ``"direct"`` or ``"driver"``."""
    try:
        return Hops(value)
    except ValueError:
        raise ValueError(f"hops={value!r} is not one of {[h.value for h in Hops]}: \"direct\" sends states "
                         f"worker to worker, \"driver\" through the driver") from None


def check_positive(name: str, value: Any) -> int:
    """``value`` as an int; raises unless it is a positive integer."""
    POSITIVE.check(name, value)
    return int(value)


def check_heartbeat_timeout(value: Any) -> float:
    """``value`` in seconds; raises unless it is a number > 1."""
    HEARTBEAT_TIMEOUT.check("heartbeat_timeout", value)
    return float(value)


def check_max_restarts(value: Any) -> int:
    """``value`` as an int; raises unless it is an integer >= 0."""
    MAX_RESTARTS.check("max_restarts", value)
    return int(value)


class Backend(ABC):
    """Launches ``workers`` worker processes that connect back to the driver.

    A worker is started as ``python -m cerebro.worker HOST PORT INDEX [LAUNCHED_BY]`` (or by
    calling :func:`cerebro.worker.run_worker`) with the auth token, one line of hex, on its
    stdin (never on the command line, which ``ps`` shows, nor in the environment); it then
    speaks the protocol of :mod:`cerebro.worker._protocol`. ``LAUNCHED_BY`` says how, for
    the journal and ``result.workers`` (e.g. ``"spark task 3 of stage 0, attempt 0"``).

    Writing a backend (docs/extending.md has a worked one): a subclass sets ``workers`` and
    implements :meth:`start`, :meth:`exited` and :meth:`stop`; :meth:`release` and
    :meth:`replace` let the driver end a hung worker and start a lost one anew (without
    them the run goes on with the others); :meth:`expect_keras` lets it import Keras ahead
    of a Keras run's workers. Scheduling, hops, heartbeats and failures are
    the engine's: a backend only starts processes, and ``fit(backend=...)`` takes any
    instance, with nothing to register.
    """

    workers: int
    threads_per_worker: int = 1     # torch intra-op threads; 1 gives the same bits on any worker count
    heartbeat_timeout: float = 60.0  # a worker silent this many seconds is lost
    max_restarts: int = 0      # times a lost worker may be started anew, and all workers after losing all
    hops: Hops = Hops.DIRECT   # how states go from worker to worker (see Hops)

    def driver_address(self) -> tuple[str, int]:
        """Where the driver listens for its workers: (host, port); port 0 picks a free one."""
        return ("127.0.0.1", 0)

    def expect_keras(self, backend: str | None) -> None:
        """Told as a run starts, before its partitions are written and :meth:`start`, which
        Keras backend its workers will import (None: none, a torch run), so that a backend
        whose workers start from a warm process may import it there once, ahead of them
        (:class:`LocalBackend` does). The default does nothing."""

    @abstractmethod
    def start(self, address: tuple[str, int], authkey: bytes) -> None:
        """Start the workers, which connect to the driver at ``address``."""

    @abstractmethod
    def exited(self) -> dict[int, str]:
        """Workers known to have ended, as worker index -> what happened (for error messages)."""

    @abstractmethod
    def stop(self) -> None:
        """End every worker still running; safe to call twice."""

    def release(self, worker: int) -> None:
        """The driver gave up on ``worker`` (lost or hung): end it if it still runs."""

    def replace(self, worker: int) -> bool:
        """Start ``worker`` anew in the running launch after the driver gave it up; False
        where this backend cannot (the default): the run goes on with the others."""
        return False

    def __repr__(self) -> str:
        """The class and its workers, for logs and run.json; a backend with more settings
        shows them in its own."""
        return f"{type(self).__name__}(workers={self.workers})"
