"""``SparkBackend``: each worker is the one task of a Spark job of its own.

Why not one barrier-mode job, as before: a barrier stage fails whole, so losing one task
restarted every worker. At 1,000 workers, where some executor is always dying, a run would
never finish an epoch. With one job per worker, a lost worker is replaced alone (a new
one-task job) while the others keep training, exactly as the local backend replaces a
process. Nor ordinary tasks of one job: in local mode ``spark.task.maxFailures`` is 1, so
one lost task would fail the job whole again, and Spark, not the driver, would decide when
a task starts anew. The barrier's one remaining service, gang scheduling, is not needed:
the driver waits until every worker has connected, and :meth:`SparkBackend.start` checks
first that the cluster has a task slot for each. Spark's own retry of a failed task is
declined (the retry returns at once): the driver decides whether and when a worker starts
anew, so no worker index ever runs twice. A speculative copy would be declined the same
way, and its success would kill the worker it copies, so speculating long tasks is refused.

What a barrier stage did better: it spread its tasks over the executors; one-task jobs go
to whichever executor Spark offers a free slot. With ``workers`` equal to the task slots
(the default), every slot holds one worker either way.
"""
from __future__ import annotations

import functools
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .._checks import Integer
from .._extras import require
from ..data._spark_python import explained, use_the_drivers_python_locally
from ._base import Backend, check_heartbeat_timeout, check_hops, check_max_restarts, check_positive

SHUTDOWN_GRACE_S = 5.0

DRIVER_PORT = Integer(low=0, high=65535, description="a port number, or 0 for any free port")


def check_no_long_task_speculation(conf: Any) -> None:
    """Raises where Spark would speculate the worker tasks: with a duration threshold it
    copies even a one-task job's task once it runs that long, and when the copy (declined,
    so done at once) succeeds Spark kills the worker it copies, again and again."""
    threshold = conf.get("spark.speculation.task.duration.threshold")
    if str(conf.get("spark.speculation", "false")).strip().lower() == "true" and threshold is not None:
        raise ValueError(f"spark.speculation.task.duration.threshold={threshold} with spark.speculation=true "
                         f"copies every task that runs longer, and a Cerebro worker's task runs for the whole "
                         f"run: the copy would end it. Unset the threshold or set spark.speculation=false")


def _spark_task(address: tuple[str, int], authkey_hex: str, rows: Iterator[int]) -> Iterator[int]:
    """A worker's one task: the same worker loop as a local worker process, for the whole run."""
    from pyspark import TaskContext

    from ..worker import run_worker
    [worker] = list(rows)      # read to the end, or Spark will not reuse this Python worker
    context = TaskContext.get()
    assert context is not None, "a Spark task has its TaskContext"
    if context.attemptNumber() > 0:
        return iter([worker])      # Spark retrying a lost worker: the driver starts its replacement
    gpus = context.resources().get("gpu")
    if gpus is not None and gpus.addresses:   # the GPUs Spark gave this task, before CUDA starts
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus.addresses)
    run_worker(address, bytes.fromhex(authkey_hex), worker,
               f"spark task {worker} of stage {context.stageId()}, attempt {context.attemptNumber()}")
    return iter([worker])


@dataclass
class _WorkerJob:
    """The Spark job that runs one worker, on a driver thread of its own."""

    group: str
    thread: threading.Thread
    error: BaseException | None = field(default=None)


class SparkBackend(Backend):
    """``workers`` long-running Spark tasks, each the one task of a job of its own and a
    Cerebro worker (see the module docstring for why not one barrier job).

    Every task loads its partitions from the store once and keeps them in memory; only model
    state moves, over the same protocol as local workers: from executor to executor (direct
    hops), and once per epoch into the store, where it becomes the checkpoint. Executors
    must reach the store (a shared or distributed file system), the driver's port and each
    other's ports; where executors cannot reach each other, ``hops="driver"`` sends every
    hop through the driver.

    Args:
        spark: a SparkSession; default: the active one.
        workers: worker tasks to run; default: every task slot of the cluster.
        threads_per_worker: torch threads per task; default: ``spark.task.cpus``.
        heartbeat_timeout: seconds without a heartbeat after which a worker counts as lost.
        driver_port: the port the driver listens on for its workers (0: any free port).
        max_restarts: how often each lost worker (its task, Python worker or executor died)
            is started anew, as a new one-task job, while the others keep training; its
            sub-epoch runs again meanwhile on a survivor, from the state the driver holds,
            so the results are the same.
        slot_wait: seconds to wait for executors to register before deciding there are
            too few task slots.
        hops: ``"direct"`` (default) or ``"driver"`` (see :class:`cerebro.backends.Hops`).

    Example:
        >>> spark = SparkSession.builder.master("spark://host:7077").getOrCreate()  # doctest: +SKIP
        >>> search.fit(data, backend=cb.SparkBackend(spark, workers=4), store="/shared/runs/exp1")  # doctest: +SKIP
    """

    def __init__(self, spark: Any = None, workers: int | None = None, threads_per_worker: int | None = None,
                 heartbeat_timeout: float = 60.0, driver_port: int = 0, slot_wait: float = 10.0,
                 max_restarts: int = 3, hops: str = "direct") -> None:
        require("cb.SparkBackend", "pyspark")
        if spark is None:
            from pyspark.sql import SparkSession
            spark = SparkSession.getActiveSession()
            if spark is None:
                raise ValueError("spark=None needs an active SparkSession; create one with "
                                 "SparkSession.builder...getOrCreate()  # doctest: +SKIP or pass it")
        self.spark = spark
        context = spark.sparkContext
        use_the_drivers_python_locally(context)
        check_no_long_task_speculation(context.getConf())
        if workers is not None:
            workers = check_positive("workers", workers)      # an int: run.json records it
        self.slot_wait = slot_wait
        slots = self._slots(workers, slot_wait)
        if slots == 0:
            raise ValueError(f"the Spark cluster at {context.master} has no task slots: no executor registered "
                             f"within slot_wait={slot_wait} s")
        self.workers = workers if workers is not None else slots
        self._check_slots(slots)
        task_cpus = int(context.getConf().get("spark.task.cpus", "1"))
        self.threads_per_worker = check_positive("threads_per_worker", threads_per_worker or task_cpus)
        self.heartbeat_timeout = check_heartbeat_timeout(heartbeat_timeout)
        DRIVER_PORT.check("driver_port", driver_port)
        self.driver_port = int(driver_port)
        self.max_restarts = check_max_restarts(max_restarts)
        self.hops = check_hops(hops)
        self._jobs: dict[int, _WorkerJob] = {}
        self._replaced: list[_WorkerJob] = []     # cancelled, maybe not yet ended: stop() waits
        self._task: functools.partial | None = None

    def _slots(self, wanted: int | None, wait: float) -> int:
        """Task slots the cluster has now; executors of a fresh session may still be registering."""
        context = self.spark.sparkContext._jsc.sc()
        profile = context.resourceProfileManager().defaultResourceProfile()
        deadline = time.monotonic() + wait
        while True:
            slots = int(context.maxNumConcurrentTasks(profile))
            if (slots > 0 and wanted is None) or (wanted is not None and slots >= wanted) \
                    or time.monotonic() > deadline:
                return slots
            time.sleep(0.5)

    def _check_slots(self, slots: int) -> None:
        if self.workers > slots:
            raise ValueError(f"workers={self.workers} needs {self.workers} task slots but the Spark cluster at "
                             f"{self.spark.sparkContext.master} has {slots}; use workers <= {slots} or add executors")

    def driver_address(self) -> tuple[str, int]:
        return (self.spark.sparkContext.getConf().get("spark.driver.host"), self.driver_port)

    def start(self, address: tuple[str, int], authkey: bytes) -> None:
        self._check_slots(self._slots(self.workers, self.slot_wait))   # executors may have gone since
        self._task = functools.partial(_spark_task, address, authkey.hex())
        for worker in range(self.workers):
            self._launch(worker)

    def _launch(self, worker: int) -> None:
        context = self.spark.sparkContext
        group = f"cerebro-{secrets.token_hex(4)}-worker-{worker}"
        task = self._task

        def run_job() -> None:
            context.setJobGroup(group, f"Cerebro MOP worker {worker}", interruptOnCancel=True)
            try:
                context.parallelize([worker], 1).mapPartitions(task).collect()
            except BaseException as error:   # reported through exited()
                job.error = error

        job = self._jobs[worker] = _WorkerJob(group, threading.Thread(target=run_job, daemon=True,
                                                                      name=f"cerebro-spark-worker-{worker}"))
        job.thread.start()

    def replace(self, worker: int) -> bool:
        self.release(worker)
        self._replaced = [job for job in self._replaced if job.thread.is_alive()]
        if worker in self._jobs:
            self._replaced.append(self._jobs[worker])
        self._launch(worker)
        return True

    def release(self, worker: int) -> None:
        job = self._jobs.get(worker)
        if job is not None and job.thread.is_alive():
            self.spark.sparkContext.cancelJobGroup(job.group)   # kills the task's Python worker

    def exited(self) -> dict[int, str]:
        context = self.spark.sparkContext
        return {worker: "ended with its Spark job" + ("" if job.error is None else
                                                      f", which failed: {_first_line(job.error, context)}")
                for worker, job in self._jobs.items() if not job.thread.is_alive()}

    def stop(self) -> None:
        # Workers told to shut down (or whose driver connection closed) end their tasks by
        # themselves; a cancelled task's Python worker is killed, not reused by the next fit.
        jobs, self._jobs, self._replaced = [*self._replaced, *self._jobs.values()], {}, []
        grace = time.monotonic() + SHUTDOWN_GRACE_S
        for job in jobs:
            job.thread.join(timeout=max(0.0, grace - time.monotonic()))
        deadline = time.monotonic() + 60
        for job in jobs:
            while job.thread.is_alive() and time.monotonic() < deadline:
                # again and again: the job may not have been submitted yet when stop() is called
                self.spark.sparkContext.cancelJobGroup(job.group)
                job.thread.join(timeout=1)

    def __repr__(self) -> str:
        return (f"SparkBackend(master={self.spark.sparkContext.master!r}, workers={self.workers}, "
                f"threads_per_worker={self.threads_per_worker})")


def _first_line(error: BaseException, context: Any) -> str:
    """The line that says why a worker's job failed: Py4J's first line names only the call."""
    return str(explained(error, context)).splitlines()[0]
