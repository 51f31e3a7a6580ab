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
import textwrap
import time
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
    backend = cb.DaskBackend(client, workers=2, hops="driver")
    assert re.fullmatch(r"DaskBackend\(scheduler='tcp://127\.0\.0\.1:\d+', workers=2, resources=None, "
                        r"hops='driver'\)", repr(backend))


def test_more_workers_than_the_cluster_runs_at_once_are_refused_naming_what_it_has(client):
    """Each worker holds a Dask thread for the whole search: a third on two threads, or a task
    needing resources no Dask worker declares, would wait for ever; refused after worker_wait."""
    address = re.escape(client.scheduler.address)
    started = time.monotonic()
    with pytest.raises(ValueError, match=rf"^workers=3 needs 3 Dask worker threads \(each worker is a task that "
                                         rf"runs for the whole search\) but the Dask cluster at {address} has 2: 2 "
                                         rf"Dask workers, 2 threads in all after worker_wait=0\.5 s; use workers "
                                         rf"<= 2, or add Dask workers or threads \(dask worker --nthreads\)$"):
        cb.DaskBackend(client, workers=3, worker_wait=0.5)
    assert time.monotonic() - started < 10
    with pytest.raises(ValueError, match=rf"^workers=1 needs 1 Dask worker thread with resources \{{'GPU': 1\}} "
                                         rf"each \(each worker is a task that runs for the whole search\) but the "
                                         rf"Dask cluster at {address} has 0: 2 Dask workers, 2 threads in all, no "
                                         rf"resources declared after worker_wait=0 s; add Dask workers or threads "
                                         rf"\(dask worker --nthreads, --resources\)$"):
        cb.DaskBackend(client, workers=1, resources={"GPU": 1}, worker_wait=0)


@pytest.mark.slow
def test_a_script_asking_a_two_worker_cluster_for_three_workers_fails_at_once_and_exits(tmp_path):
    """As a user ran it: a LocalCluster of two workers, fit with three. It hung for minutes,
    then for ever at exit; now the script fails on the backend's line and exits."""
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import numpy as np
        from distributed import Client, LocalCluster
        import cerebro as cb
        from _models import build

        if __name__ == "__main__":
            client = Client(LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None))
            data = cb.Dataset.from_numpy(np.zeros((40, 64), np.float32), np.arange(40) % 10, partitions=3)
            cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
                data, backend=cb.DaskBackend(client, workers=3, worker_wait=1), store="run")
    """))
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    ran = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=env)
    assert ran.returncode == 1, ran.stderr[-3000:]
    [said] = [line for line in ran.stderr.splitlines() if line.startswith("ValueError")]   # Dask may log after it
    assert re.fullmatch(r"ValueError: workers=3 needs 3 Dask worker threads \(each worker is a task that runs for "
                        r"the whole search\) but the Dask cluster at tcp://127\.0\.0\.1:\d+ has 2: 2 Dask workers, "
                        r"2 threads in all after worker_wait=1 s; use workers <= 2, or add Dask workers or threads "
                        r"\(dask worker --nthreads\)", said), ran.stderr[-3000:]
    assert not (tmp_path / "run").exists()       # refused before anything was written


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
    with pytest.raises(ValueError, match=r"^worker_wait=-1 must be a number of seconds >= 0$"):
        cb.DaskBackend(client, worker_wait=-1)




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
