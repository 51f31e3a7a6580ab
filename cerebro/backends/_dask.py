"""``DaskBackend``: each worker is one long-running Dask task, which runs a worker process.

The task starts ``python -m cerebro.worker`` on its Dask worker's machine and waits for it:
a process of its own, so a worker whose driver is gone can exit at once (as every worker
does) without taking the Dask worker with it, and the driver can end a hung one. Dask
would run a task again on another Dask worker when the first dies; the driver decides
instead: a task that finds its launch already begun returns at once, and the driver starts
the replacement as a new task, while the other workers train on. The run's token reaches
the tasks through Dask's memory (``client.scatter``), so no task's arguments, which the
scheduler's dashboard shows, hold it.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .._checks import Real
from .._extras import require
from .._python import python_module
from ._base import Backend, Hops, check_heartbeat_timeout, check_hops, check_max_restarts, check_positive

SHUTDOWN_GRACE_S = 10.0
WORKER_WAIT = Real(low=0, description="a number of seconds >= 0")


DECLINED = "declined: Dask ran it again after its Dask worker died (the driver replaces it)"


def _dask_task(address: tuple[str, int], authkey: bytes, worker: int, key: str, threads: int) -> str:
    """A worker's one task: start its worker process here, say where, wait for it, and say
    how it ended."""
    from distributed import Event, Variable, get_worker
    begun = Event(key)
    if begun.is_set():
        return DECLINED
    begun.set()
    here = get_worker().address
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    process = subprocess.Popen(python_module("cerebro.worker", address[0], str(address[1]), str(worker),
                                             f"dask task {key} on {here}"), env=env, stdin=subprocess.PIPE,
                               preexec_fn=_die_with_parent)
    Variable(f"{key}-pid").set([here, process.pid])
    assert process.stdin is not None       # stdin=PIPE
    try:      # on stdin: never on the command line (``ps``) or in the environment
        process.stdin.write(authkey.hex().encode() + b"\n")
        process.stdin.close()
    except BrokenPipeError:
        pass
    return f"its worker process exited with code {process.wait()}"


def _die_with_parent() -> None:
    """In the worker process, before it starts: SIGKILL it when the Dask worker that started
    it dies (Linux), so no orphan goes on training for a worker the driver has replaced."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)      # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass                   # not Linux: the worker exits once the driver closes its connection


def _kill(pid: int) -> None:
    """On a Dask worker (``client.run``): end a worker process it started."""
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def task_capacity(workers: list[dict[str, Any]], resources: dict[str, float] | None) -> int:
    """How many worker tasks needing ``resources`` the Dask workers described by ``workers``
    (the scheduler's ``scheduler_info()["workers"]``) run at once: a thread each, and the
    resources each asks."""
    total = 0
    for worker in workers:
        have = worker.get("resources") or {}
        fits = [int(have.get(name, 0) // amount) for name, amount in (resources or {}).items()]
        total += min([int(worker["nthreads"]), *fits])
    return total


def describe_cluster(workers: list[dict[str, Any]], resources: bool) -> str:
    """``"2 Dask workers, 2 threads in all"``, and the resources they declare where the
    tasks need some."""
    if not workers:
        return "no Dask worker"
    threads = sum(int(worker["nthreads"]) for worker in workers)
    said = f"{len(workers)} Dask worker{'s' * (len(workers) != 1)}, {threads} thread{'s' * (threads != 1)} in all"
    if not resources:
        return said
    declared: dict[str, float] = {}
    for worker in workers:
        for name, amount in (worker.get("resources") or {}).items():
            declared[name] = declared.get(name, 0) + amount
    return f"{said}, resources {declared} in all" if declared else f"{said}, no resources declared"


@dataclass
class _Task:
    key: str
    future: Any


class DaskBackend(Backend):
    """``workers`` long-running Dask tasks on the cluster of ``client``, each running a
    Cerebro worker process.

    Args:
        client: a ``distributed.Client``; default: the current one.
        workers: worker tasks to run.
        resources: Dask resources each task needs, e.g. ``{"GPU": 1}`` (the Dask workers
            must declare them: ``dask worker --resources GPU=1``).
        threads_per_worker: torch threads of each worker process.
        heartbeat_timeout: seconds without a heartbeat after which a worker counts as lost.
        max_restarts: how often each lost worker is started anew, as a new task, while the
            others keep training.
        hops: ``"direct"`` (default) or ``"driver"`` (see :class:`cerebro.backends.Hops`).
        worker_wait: seconds to wait for Dask workers to join until the cluster can run every
            worker task at once (each holds a Dask worker's thread for the whole run); then
            the backend refuses, naming what the cluster has.

    Example:
        >>> from distributed import Client  # doctest: +SKIP
        >>> search.fit(data, backend=cb.DaskBackend(Client("tcp://scheduler:8786"), workers=8),  # doctest: +SKIP
        ...            store="/shared/runs/exp1")
    """

    def __init__(self, client: Any = None, workers: int = 2, resources: dict[str, float] | None = None,
                 threads_per_worker: int = 1, heartbeat_timeout: float = 60.0, max_restarts: int = 3,
                 hops: str = "direct", worker_wait: float = 10.0) -> None:
        require("cb.DaskBackend", "distributed", "dask")
        if client is None:
            from distributed import default_client
            try:
                client = default_client()
            except ValueError:
                raise ValueError("client=None needs a current distributed.Client; create one with "
                                 "Client('tcp://scheduler:8786') or pass it") from None
        self.client = client
        self.workers = check_positive("workers", workers)
        if resources is not None and (not isinstance(resources, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and v > 0 for k, v in resources.items())):
            raise ValueError(f"resources={resources!r} must be None or a dict of resource names to positive "
                             f"amounts, e.g. {{'GPU': 1}}")
        self.resources = resources
        self.threads_per_worker = check_positive("threads_per_worker", threads_per_worker)
        self.heartbeat_timeout = check_heartbeat_timeout(heartbeat_timeout)
        self.max_restarts = check_max_restarts(max_restarts)
        self.hops = check_hops(hops)
        WORKER_WAIT.check("worker_wait", worker_wait)
        self.worker_wait = float(worker_wait)
        self._check_capacity()
        self._tasks: dict[int, _Task] = {}
        self._keys: list[str] = []
        self._launch, self._token = "", None

    def driver_address(self) -> tuple[str, int]:
        """The address of this machine that the Dask scheduler's network reaches."""
        parsed = urllib.parse.urlparse(self.client.scheduler.address)
        try:
            host = socket.gethostbyname(parsed.hostname or "")
            if parsed.scheme not in ("tcp", "tls") or ipaddress.ip_address(host).is_loopback:
                return ("127.0.0.1", 0)      # in-process or on this machine
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:   # no packet is sent
                probe.connect((host, parsed.port or 8786))
                return (probe.getsockname()[0], 0)
        except OSError:        # a name that does not resolve here, say: this machine's own address
            return (socket.gethostbyname(socket.gethostname()), 0)

    def _check_capacity(self) -> None:
        """Refuses more worker tasks than the cluster can run at once (after up to
        ``worker_wait`` s for Dask workers to join): the tasks beyond would wait for a thread
        that never frees, and the run with them."""
        deadline = time.monotonic() + self.worker_wait
        while True:
            joined = list(self.client.scheduler_info(n_workers=-1)["workers"].values())
            capacity = task_capacity(joined, self.resources)
            if capacity >= self.workers:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)    # polling the scheduler for joining workers, up to worker_wait
        threads = f"{self.workers} Dask worker thread{'s' * (self.workers != 1)}"
        each = "" if self.resources is None else f" with resources {self.resources} each"
        fewer = f"use workers <= {capacity}, or " if capacity else ""
        flags = "--nthreads" + (", --resources" if self.resources is not None else "")
        raise ValueError(f"workers={self.workers} needs {threads}{each} (each worker is a task that runs for the "
                         f"whole search) but the Dask cluster at {self.client.scheduler.address} has {capacity}: "
                         f"{describe_cluster(joined, self.resources is not None)} after "
                         f"worker_wait={self.worker_wait:g} s; {fewer}add Dask workers or threads (dask worker "
                         f"{flags})")

    def start(self, address: tuple[str, int], authkey: bytes) -> None:
        self._check_capacity()      # Dask workers may have left since the backend was made
        # On every Dask worker: a replacement needs it even where the worker holding it died.
        self._address, self._token = address, self.client.scatter(authkey, hash=False, broadcast=True)
        self._launch = secrets.token_hex(4)
        for worker in range(self.workers):
            self._submit(worker, 0)

    def _submit(self, worker: int, attempt: int) -> None:
        key = f"cerebro-{self._launch}-worker-{worker}-{attempt}"
        future = self.client.submit(_dask_task, self._address, self._token, worker, key, self.threads_per_worker,
                                    key=key, pure=False, resources=self.resources)
        self._tasks[worker] = _Task(key, future)
        self._keys.append(key)         # every attempt's markers, removed at stop()

    def exited(self) -> dict[int, str]:
        ended = {}
        for worker, task in self._tasks.items():
            if task.future.done():
                if task.future.status == "finished":
                    ended[worker] = f"ended with its Dask task: {task.future.result()}"
                else:
                    error = task.future.exception() if task.future.status == "error" else None
                    ended[worker] = f"its Dask task ended: {task.future.status}" + (
                        f": {type(error).__name__}: {error}" if error is not None else "")
        return ended

    def replace(self, worker: int) -> bool:
        self.release(worker)
        attempt = int(self._tasks[worker].key.rsplit("-", 1)[1]) + 1 if worker in self._tasks else 0
        self._submit(worker, attempt)
        return True

    def release(self, worker: int) -> None:
        task = self._tasks.get(worker)
        if task is None:
            return
        self.client.cancel(task.future, force=True)      # not begun: it never will
        from distributed import Event, Variable
        if not Event(task.key, client=self.client).is_set():
            return
        try:
            where, pid = Variable(f"{task.key}-pid", client=self.client).get(timeout=5)
        except TimeoutError:
            return             # its process never started
        if where in self.client.scheduler_info()["workers"]:    # a dead one's process died with it
            self.client.run(_kill, pid, workers=[where], on_error="ignore")

    def stop(self) -> None:
        if not self._tasks and not self._keys:
            return
        from distributed import Event, Variable, wait
        # Workers told to shut down end their processes, and so their tasks.
        try:
            wait([t.future for t in self._tasks.values()], timeout=SHUTDOWN_GRACE_S)
        except TimeoutError:
            pass               # those still running are ended below
        for worker in self._tasks:
            self.release(worker)       # cancels first: a rerun cannot begin once its marker is cleared
        for key in self._keys:
            Variable(f"{key}-pid", client=self.client).delete()
            Event(key, client=self.client).clear()
        self.client.cancel(self._token, force=True)
        self._tasks, self._keys, self._token = {}, [], None

    def __repr__(self) -> str:
        hops = "" if self.hops is Hops.DIRECT else f", hops={self.hops.value!r}"
        return (f"DaskBackend(scheduler={self.client.scheduler.address!r}, workers={self.workers}, "
                f"resources={self.resources!r}{hops})")
