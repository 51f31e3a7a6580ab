"""``DaskBackend`` (issue 36): each worker a long-running Dask task running a worker process.
Its checks, and ``cerebro run --backend dask`` on a scheduler and two workers started as
processes, bitwise the local results (the bits and replacement on a ``LocalCluster`` are in
``test_backends_common.py``)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pandas as pd
import psutil
import pytest
from _cli_runs import run_on
from _faults import striking, waiting_for_the_replacement
from _models import build, digits

import cerebro as cb

distributed = pytest.importorskip("distributed")
SPACE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        yield client


def test_dask_backend_says_how_it_was_made(client):
    backend = cb.DaskBackend(client, workers=2, resources={"GPU": 1})
    assert re.fullmatch(r"DaskBackend\(scheduler='tcp://127\.0\.0\.1:\d+', workers=2, resources=\{'GPU': 1\}\)",
                        repr(backend))


def killing_its_dask_worker(marker: str):
    """``build``, except that the first training batch anywhere kills the Dask worker that
    started this worker process (its parent) with SIGKILL: the worker process dies with it."""
    def build_that_kills(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        trainable.loss = striking(trainable.loss, lambda: os.kill(os.getppid(), signal.SIGKILL), marker=marker)
        return trainable
    return build_that_kills


@pytest.mark.slow
def test_a_dask_worker_killed_mid_run_takes_its_worker_process_along_and_the_run_gives_the_same_bits(
        client, tmp_path):
    expected = cb.GridSearch(build, SPACE, epochs=2).fit(digits(partitions=4), backend=cb.LocalBackend(2), seed=3,
                                                         verbose=0, store=tmp_path / "local")
    store, marker = str(tmp_path / "run"), str(tmp_path / "killed")
    result = cb.GridSearch(waiting_for_the_replacement(killing_its_dask_worker(marker), store), SPACE,
                           epochs=2).fit(digits(partitions=4), backend=cb.DaskBackend(client, workers=2), seed=3,
                                         verbose=0, store=store)
    assert os.path.exists(marker)
    events = list(result.store.events())
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert len(lost) == 1 and [e["event"] for e in events].count("worker_replaced") == 1
    started = next(e for e in events if e["event"] == "run_started")["workers"]
    assert not psutil.pid_exists(started[str(lost[0]["worker"])]["pid"])     # no orphan trains on
    pd.testing.assert_frame_equal(result.history(), expected.history(), check_exact=True)


def test_dask_backend_checks_its_arguments_before_starting_anything(client):
    with pytest.raises(ValueError, match=r"^resources=\{'GPU': 0\} must be None or a dict of resource names to "
                                         r"positive amounts, e.g. \{'GPU': 1\}$"):
        cb.DaskBackend(client, resources={"GPU": 0})
    with pytest.raises(ValueError, match=r"^workers=0 must be a positive integer"):
        cb.DaskBackend(client, workers=0)




@contextlib.contextmanager
def dask_cluster(tmp_path, workers: int = 2) -> Iterator[str]:
    """A Dask scheduler and ``workers`` workers of one thread each, as processes on 127.0.0.1;
    yields the scheduler's address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    logs = open(tmp_path / "dask.log", "wb")
    processes = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                   "--dashboard-address", ":0", "--no-show"], stdout=logs, stderr=logs)]
    try:
        with distributed.Client(address, timeout=60):    # waits for the scheduler to answer
            pass
        processes += [subprocess.Popen([dask, "worker", address, "--nworkers", "1", "--nthreads", "1", "--host",
                                        "127.0.0.1", "--no-dashboard"], stdout=logs, stderr=logs)
                      for _ in range(workers)]
        with distributed.Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
        yield address
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        logs.close()


@pytest.mark.slow
def test_cerebro_run_on_a_dask_scheduler_and_two_worker_processes_gives_the_local_bits(tmp_path):
    @contextlib.contextmanager
    def cluster() -> Iterator[dict[str, str]]:
        with dask_cluster(tmp_path) as address:
            yield {**os.environ, "DASK_SCHEDULER_ADDRESS": address}

    workers = run_on(tmp_path, "dask", cluster)
    hosts = {info["launched_by"].rsplit(" on ", 1)[1] for info in workers.values()}
    assert len(hosts) == 2                   # one task on each Dask worker
