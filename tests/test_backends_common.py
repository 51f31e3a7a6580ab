"""The tests every backend passes (scikit-learn's common-tests idea): local processes, Spark
(``local[2]``), Ray (an in-process ``ray.init``), Dask (a ``LocalCluster`` of two processes)
and docs/extending.md's worked example (``NiceBackend``: local processes under ``nice``, its
section run as written first). Each gives the local backend's bits on the same grid (and,
but for the example, whose workers are LocalBackend's own, on one whose trials have frozen
layers computed once on the workers), replaces a worker whose
process is killed by SIGKILL alone while the other trains on (the same bits again), and
keeps the ``Backend`` contract: its settings as attributes, nothing to report or stop
before it starts. A backend's own tests (its cluster, its errors) are in its own module."""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
import pytest
import torch
from _docs import run_section
from _faults import assert_replaced_alone, waiting_for_the_replacement
from _frozen_models import builds
from _models import build, crashing_once, digits

import cerebro as cb

SPACE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}
FROZEN_SPACE = {"lr": cb.choice([1e-2]), "depth": cb.choice([2, 4])}


@dataclass
class Kind:
    """One backend as these tests use it: how to make it for 2 workers, and what its
    workers' ``launched_by`` says (a regex, by worker index)."""

    make: Callable[[], cb.Backend]
    launched_by: Callable[[int], str]
    names_the_launch: bool = True      # a replacement's launched_by differs from the one it replaces
    # Another backend whose workers are LocalBackend's own (``python -m cerebro.worker`` on
    # this machine): what happens inside them (frozen layers) is proven with LocalBackend.
    same_workers_as_local: bool = False


@pytest.fixture(scope="module", params=["local", "spark", "ray", "dask", "extending"])
def kind(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    name = request.param
    if name == "local":
        yield Kind(lambda: cb.LocalBackend(2), lambda worker: r"local process", names_the_launch=False)
    elif name == "extending":
        with contextlib.chdir(tmp_path_factory.mktemp("extending")):
            namespace, printed = run_section("docs/extending.md", "A backend", 2)
        assert printed.splitlines()[0] == "['process at niceness 10']"
        assert namespace["result"].best.metrics["val_accuracy"] > 0.8
        # Its niceness changes none of the properties here, and a niced run waits on every other
        # process of the machine (another test's workers): these runs take it at 0.
        yield Kind(lambda: namespace["NiceBackend"](workers=2, niceness=0), lambda worker: r"process at niceness 0",
                   names_the_launch=False, same_workers_as_local=True)
    elif name == "spark":
        from _spark import session
        spark = session("local[2]")
        yield Kind(lambda: cb.SparkBackend(spark, workers=2),
                   lambda worker: rf"spark task {worker} of stage \d+, attempt 0")
        spark.stop()
    elif name == "ray":
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield Kind(lambda: cb.RayBackend(workers=2), lambda worker: r"ray actor [0-9a-f]{12} on node [0-9a-f]{12}")
        ray.shutdown()
    else:
        distributed = pytest.importorskip("distributed")
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                                      dashboard_address=None) as cluster, distributed.Client(cluster) as client:
            yield Kind(lambda: cb.DaskBackend(client, workers=2),
                       lambda worker: rf"dask task cerebro-[0-9a-f]{{8}}-worker-{worker}-\d+ on tcp://127\.0\.0\.1:\d+")


@pytest.fixture(scope="module")
def local_result(tmp_path_factory: pytest.TempPathFactory) -> cb.Result:
    return cb.GridSearch(build, SPACE, epochs=2).fit(digits(partitions=4), backend=cb.LocalBackend(2), seed=3,
                                                     verbose=0, store=tmp_path_factory.mktemp("local") / "run")


def _assert_same(a: cb.Result, b: cb.Result) -> None:
    pd.testing.assert_frame_equal(a.history(), b.history(), check_exact=True)
    for x, y in zip(a.trials, b.trials):
        assert (x.trial_id, x.status, x.config) == (y.trial_id, y.status, y.config)
        for epoch in ("best", "last"):
            assert all(torch.equal(v, y.state_dict(epoch)[k]) for k, v in x.state_dict(epoch).items())


@pytest.mark.slow
def test_the_same_grid_gives_the_local_backends_bits(kind, local_result, tmp_path):
    result = cb.GridSearch(build, SPACE, epochs=2).fit(digits(partitions=4), backend=kind.make(), seed=3, verbose=0,
                                                       store=f"file://{tmp_path}/run")     # a file:// URL store
    assert sorted(result.workers) == [0, 1]
    for index, info in result.workers.items():
        assert re.fullmatch(kind.launched_by(index), info["launched_by"]), info["launched_by"]
        assert info["pid"] != os.getpid()
    assert set(result.schedule().pid) == {info["pid"] for info in result.workers.values()}
    _assert_same(result, local_result)


@pytest.fixture(scope="module")
def plain_frozen_result(tmp_path_factory: pytest.TempPathFactory) -> cb.Result:
    """Two freeze depths with the frozen layers inside each model, on local workers: what
    ``frozen=`` must give on every backend."""
    return cb.GridSearch(builds()[1], FROZEN_SPACE, epochs=2).fit(
        digits(partitions=4), backend=cb.LocalBackend(2), seed=3, verbose=0,
        store=tmp_path_factory.mktemp("plain-frozen") / "run")


@pytest.mark.slow
def test_frozen_layers_computed_once_on_the_workers_give_the_plain_runs_bits(kind, plain_frozen_result, tmp_path):
    if kind.same_workers_as_local:
        pytest.skip("its workers are local worker processes, as LocalBackend's: frozen layers are proven there")
    result = cb.GridSearch(builds()[0], FROZEN_SPACE, epochs=2).fit(
        digits(partitions=4), backend=kind.make(), seed=3, verbose=0, store=tmp_path / "run")
    pd.testing.assert_frame_equal(result.history(), plain_frozen_result.history(), check_exact=True)
    for ours, plain in zip(result.trials, plain_frozen_result.trials, strict=True):
        assert all(torch.equal(v, plain.state_dict()[f"1.{k}"]) for k, v in ours.state_dict().items())


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_replaced_alone_with_the_same_bits(kind, local_result, tmp_path):
    store, marker = str(tmp_path / "run"), str(tmp_path / "killed")
    result = cb.GridSearch(waiting_for_the_replacement(crashing_once(marker, how="sigkill"), store), SPACE,
                           epochs=2).fit(digits(partitions=4), backend=kind.make(), seed=3, verbose=0, store=store)
    assert os.path.exists(marker)
    assert_replaced_alone(list(result.store.events()), result, kind.launched_by, kind.names_the_launch)
    _assert_same(result, local_result)


@pytest.mark.slow
def test_a_backend_keeps_the_contract_before_it_starts(kind):
    backend = kind.make()
    assert isinstance(backend, cb.Backend) and backend.workers == 2
    assert backend.threads_per_worker >= 1 and backend.heartbeat_timeout > 1 and backend.max_restarts >= 0
    assert backend.hops is cb.backends.Hops.DIRECT
    host, port = backend.driver_address()
    assert isinstance(host, str) and host and port == 0
    assert backend.exited() == {}
    backend.stop()
    backend.stop()                 # safe twice
    assert repr(backend).startswith(f"{type(backend).__name__}(") and "workers=2" in repr(backend)
