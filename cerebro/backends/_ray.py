"""``RayBackend``: each worker is one Ray actor running the worker loop for the whole run.

The actors are placed by a placement group (``SPREAD``: over as many nodes as have room),
one bundle per worker of ``num_cpus_per_worker`` CPUs and ``num_gpus_per_worker`` GPUs, so
Ray reserves every worker's resources before any starts and never gives a worker's CPUs to
another task. A lost actor (its process or node died) is replaced alone, as a new actor in
the same bundle, while the others train on. The run's token reaches the actors through
Ray's object store (``ray.put``): a task's arguments, which Ray keeps in its task table,
shows in its dashboard and writes to its logs, hold only the object's reference.
"""
from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass
from typing import Any

from .._checks import Real
from .._extras import require
from ._base import Backend, Hops, check_heartbeat_timeout, check_hops, check_max_restarts, check_positive

RESOURCES = Real(low=0, description="a number >= 0")
PLACEMENT_WAIT = Real(low=0, low_open=True, description="a number of seconds > 0")


def _run_actor_worker(address: tuple[str, int], authkey: bytes, worker: int) -> int:
    """An actor's one method call: the same worker loop as a local worker process."""
    import ray

    from ..worker import run_worker
    context = ray.get_runtime_context()
    run_worker(address, authkey, worker, f"ray actor {(context.get_actor_id() or '?')[:12]} on node "
                                         f"{context.get_node_id()[:12]}")
    return worker


@dataclass
class _Actor:
    handle: Any
    done: Any          # the ObjectRef of its run call: ready once the worker ended, or its actor died


class RayBackend(Backend):
    """``workers`` Ray actors, each a Cerebro worker, on the Ray cluster at ``address``.

    Args:
        workers: worker actors to start.
        address: the cluster to connect to where Ray is not initialized yet: None starts
            a local one (``ray.init()``), ``"auto"`` finds the one ``ray start`` made on this
            machine, ``"ray://host:10001"`` connects a Ray client. Where the program has
            called ``ray.init`` itself, that session is used and ``address`` must be None.
        num_cpus_per_worker: CPUs Ray reserves for each worker (its torch threads too).
        num_gpus_per_worker: GPUs Ray reserves for each worker (0 or 1, or a fraction to
            share one); Ray makes them the worker's visible CUDA devices.
        heartbeat_timeout: seconds without a heartbeat after which a worker counts as lost.
        max_restarts: how often each lost worker is started anew as a new actor, while the
            others keep training.
        placement_wait: seconds to wait for the cluster to have room for every worker (an
            autoscaling cluster may add nodes meanwhile) before the run fails, saying so.
        hops: ``"direct"`` (default) or ``"driver"`` (see :class:`cerebro.backends.Hops`).

    Example:
        >>> search.fit(data, backend=cb.RayBackend(workers=8, address="auto"),  # doctest: +SKIP
        ...            store="/shared/runs/exp1")
    """

    def __init__(self, workers: int = 2, address: str | None = None, num_cpus_per_worker: float = 1,
                 num_gpus_per_worker: float = 0, heartbeat_timeout: float = 60.0, max_restarts: int = 3,
                 hops: str = "direct", placement_wait: float = 120.0) -> None:
        require("cb.RayBackend", "ray")
        self.workers = check_positive("workers", workers)
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"address={address!r} must be None, 'auto' or a Ray address such as 'ray://host:10001'")
        self.address = address
        RESOURCES.check("num_cpus_per_worker", num_cpus_per_worker)
        RESOURCES.check("num_gpus_per_worker", num_gpus_per_worker)
        if num_cpus_per_worker == 0 and num_gpus_per_worker == 0:
            raise ValueError("num_cpus_per_worker=0 and num_gpus_per_worker=0: a worker must reserve a CPU or a GPU")
        self.num_cpus_per_worker, self.num_gpus_per_worker = num_cpus_per_worker, num_gpus_per_worker
        self.threads_per_worker = max(1, int(num_cpus_per_worker))
        self.heartbeat_timeout = check_heartbeat_timeout(heartbeat_timeout)
        self.max_restarts = check_max_restarts(max_restarts)
        self.hops = check_hops(hops)
        PLACEMENT_WAIT.check("placement_wait", placement_wait)
        self.placement_wait = float(placement_wait)
        self._actors: dict[int, _Actor] = {}
        self._group: Any = None
        self._token: Any = None
        self._initialized_here = False

    def _ray(self) -> Any:
        """Ray, initialized: the program's own session, else one for ``address`` (made once)."""
        import ray
        if not ray.is_initialized():
            ray.init(address=self.address)
            self._initialized_here = True
        elif self.address is not None and not self._initialized_here:
            raise ValueError(f"address={self.address!r}, but ray.init was called already: pass address=None to "
                             f"use that session")
        return ray

    def driver_address(self) -> tuple[str, int]:
        """This node's address in the Ray cluster, where the actors can reach the driver."""
        return (self._ray().util.get_node_ip_address(), 0)

    def start(self, address: tuple[str, int], authkey: bytes) -> None:
        ray = self._ray()
        _warn_if_shared(os.getcwd())
        from ray.util.placement_group import placement_group, remove_placement_group
        bundle = {k: v for k, v in {"CPU": self.num_cpus_per_worker, "GPU": self.num_gpus_per_worker}.items() if v}
        self._group = placement_group([bundle] * self.workers, strategy="SPREAD")
        try:
            ray.get(self._group.ready(), timeout=self.placement_wait)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self._group)
            self._group = None
            raise ValueError(f"the Ray cluster has no room for {self.workers} workers of {bundle} each within "
                             f"placement_wait={self.placement_wait} s: it has {ray.cluster_resources()}; use fewer "
                             f"workers or add nodes") from None
        self._address, self._token = address, ray.put(authkey)
        for worker in range(self.workers):
            self._launch(worker)

    def _launch(self, worker: int) -> None:
        ray = self._ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        actor_class = ray.remote(_WorkerActor).options(
            num_cpus=self.num_cpus_per_worker, num_gpus=self.num_gpus_per_worker, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=worker))
        handle = actor_class.remote()
        self._actors[worker] = _Actor(handle, handle.run.remote(self._address, self._token, worker))

    def exited(self) -> dict[int, str]:
        if not self._actors:
            return {}
        ray = self._ray()
        refs = {actor.done: worker for worker, actor in self._actors.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        return {refs[ref]: _ending(ray, ref) for ref in ready}

    def replace(self, worker: int) -> bool:
        self.release(worker)
        self._launch(worker)
        return True

    def release(self, worker: int) -> None:
        actor = self._actors.get(worker)
        if actor is not None:
            self._ray().kill(actor.handle, no_restart=True)

    def stop(self) -> None:
        if not self._actors and self._group is None:
            return
        ray = self._ray()
        # Workers told to shut down end their run calls; any still running is killed.
        ray.wait([a.done for a in self._actors.values()], num_returns=len(self._actors), timeout=10)
        for actor in self._actors.values():
            ray.kill(actor.handle, no_restart=True)
        self._actors, self._token = {}, None     # the token's object is freed with its last reference
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group
            remove_placement_group(self._group)
            self._group = None

    def __repr__(self) -> str:
        hops = "" if self.hops is Hops.DIRECT else f", hops={self.hops.value!r}"
        return (f"RayBackend(workers={self.workers}, address={self.address!r}, num_cpus_per_worker="
                f"{self.num_cpus_per_worker}, num_gpus_per_worker={self.num_gpus_per_worker}{hops})")


class _WorkerActor:
    """The Ray actor class (made remote when launched, so importing this module needs no Ray)."""

    def run(self, address: tuple[str, int], authkey: bytes, worker: int) -> int:
        return _run_actor_worker(address, authkey, worker)


def _warn_if_shared(directory: str) -> None:
    """Ray puts the driver's working directory first on every worker's path (its own rule,
    for a job's modules; ``ray/_private/worker.py``), so its actors, this backend's workers,
    import what is there before their own packages: say so where others can write there."""
    with contextlib.suppress(OSError):
        if os.stat(directory).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            logging.getLogger("cerebro").warning(
                "the working directory %s is writable by other users, and Ray puts it first on every worker's "
                "path: a module planted there would run in this run's workers. Start the driver from a directory "
                "of your own (or give ray.init a runtime_env working_dir)", directory)


def _ending(ray: Any, ref: Any) -> str:
    """What ended a worker's run call: its return, or why its actor died."""
    try:
        ray.get(ref, timeout=0)
        return "ended its Ray actor's run"
    except Exception as error:      # RayActorError, WorkerCrashedError, ...: the first line says which
        return f"its Ray actor ended: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
