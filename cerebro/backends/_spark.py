"""``SparkBackend``: the workers are the tasks of one barrier-mode Spark job."""
from __future__ import annotations

import functools
import os
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

from .._checks import Integer
from ._base import Backend, check_heartbeat_timeout, check_max_restarts, check_positive

SHUTDOWN_GRACE_S = 5.0

DRIVER_PORT = Integer(low=0, high=65535, description="a port number, or 0 for any free port")


def _spark_task(address: tuple[str, int], authkey_hex: str, rows: Iterator[Any]) -> Iterator[int]:
    """One barrier task: the same worker loop as a local worker process, for the whole run."""
    from pyspark import BarrierTaskContext

    from ..worker import run_worker
    context = BarrierTaskContext.get()
    worker = context.partitionId()
    gpus = context.resources().get("gpu")
    if gpus is not None and gpus.addresses:   # the GPUs Spark gave this task, before CUDA starts
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus.addresses)
    run_worker(address, bytes.fromhex(authkey_hex), worker,
               f"spark task {worker} of stage {context.stageId()}, attempt {context.attemptNumber()}")
    yield worker


class SparkBackend(Backend):
    """``workers`` long-running tasks of one barrier-mode Spark job, each a Cerebro worker.

    Every task loads its partitions from the store once and keeps them in memory; only model
    state moves, over the same protocol as local workers, to the driver at
    ``spark.driver.host``. Executors must reach the store (a shared or distributed file
    system) and the driver's port.

    Args:
        spark: a SparkSession; default: the active one.
        workers: barrier tasks to run; default: every task slot of the cluster.
        threads_per_worker: torch threads per task; default: ``spark.task.cpus``.
        heartbeat_timeout: seconds without a heartbeat after which a worker counts as lost.
        driver_port: the port the driver listens on for its workers (0: any free port).
        max_restarts: how often a lost task (its executor or Python worker died) makes the
            driver relaunch the barrier job; running sub-epochs then run again from the
            states the driver holds, so the results are the same.
        slot_wait: seconds to wait for executors to register before deciding there are
            too few task slots.

    Example:
        >>> spark = SparkSession.builder.master("spark://host:7077").getOrCreate()
        >>> search.fit(data, backend=cb.SparkBackend(spark, workers=4), store="/shared/runs/exp1")
    """

    workers_fail_together = True    # a failed barrier task fails its whole stage

    def __init__(self, spark: Any = None, workers: int | None = None, threads_per_worker: int | None = None,
                 heartbeat_timeout: float = 60.0, driver_port: int = 0, slot_wait: float = 10.0,
                 max_restarts: int = 3) -> None:
        if spark is None:
            from pyspark.sql import SparkSession
            spark = SparkSession.getActiveSession()
            if spark is None:
                raise ValueError("spark=None needs an active SparkSession; create one with "
                                 "SparkSession.builder...getOrCreate() or pass it")
        self.spark = spark
        context = spark.sparkContext
        if workers is not None:
            check_positive("workers", workers)
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
        self._job: threading.Thread | None = None
        self._job_error: BaseException | None = None
        self._group = ""

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
        context = self.spark.sparkContext
        self._check_slots(self._slots(self.workers, self.slot_wait))   # executors may have gone since
        self._group = f"cerebro-{secrets.token_hex(4)}"
        self._job_error = None
        task = functools.partial(_spark_task, address, authkey.hex())

        def run_job() -> None:
            context.setJobGroup(self._group, "Cerebro MOP workers", interruptOnCancel=True)
            try:
                context.parallelize(range(self.workers), self.workers).barrier().mapPartitions(task).collect()
            except BaseException as error:   # reported through exited()
                self._job_error = error

        self._job = threading.Thread(target=run_job, name="cerebro-spark-job", daemon=True)
        self._job.start()

    def exited(self) -> dict[int, str]:
        if self._job is None or self._job.is_alive():
            return {}
        what = "ended with its Spark job" if self._job_error is None else \
            f"ended with its Spark job, which failed: {str(self._job_error).splitlines()[0]}"
        return {worker: what for worker in range(self.workers)}

    def stop(self) -> None:
        if self._job is None:
            return
        # Workers told to shut down (or whose driver connection closed) end their tasks by
        # themselves; a cancelled task's Python worker is killed, not reused by the next fit.
        self._job.join(timeout=SHUTDOWN_GRACE_S)
        deadline = time.monotonic() + 60
        while self._job.is_alive() and time.monotonic() < deadline:
            # again and again: the job may not have been submitted yet when stop() is called
            self.spark.sparkContext.cancelJobGroup(self._group)
            self._job.join(timeout=1)
        self._job = None

    def __repr__(self) -> str:
        return (f"SparkBackend(master={self.spark.sparkContext.master!r}, workers={self.workers}, "
                f"threads_per_worker={self.threads_per_worker})")
