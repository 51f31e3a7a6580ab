"""``RayBackend`` (issue 36): each worker a Ray actor. The same grid gives the local backend's
bits, in an in-process Ray session and on a cluster of a head and a second node started with
``ray start``; a worker whose actor process is killed is replaced alone, with the same bits;
the run's token is in no task's arguments."""
from __future__ import annotations

import os
import re

import pandas as pd
import psutil
import pytest
import torch
from _faults import assert_replaced_alone, waiting_for_the_replacement
from _models import build, crashing_once, digits

import cerebro as cb

ray = pytest.importorskip("ray")
SPACE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}


def _assert_same(a: cb.Result, b: cb.Result) -> None:
    pd.testing.assert_frame_equal(a.history(), b.history(), check_exact=True)
    for x, y in zip(a.trials, b.trials):
        assert (x.trial_id, x.status) == (y.trial_id, y.status)
        assert all(torch.equal(v, y.state_dict("last")[k]) for k, v in x.state_dict("last").items())


@pytest.fixture(scope="module")
def local_result(tmp_path_factory: pytest.TempPathFactory) -> cb.Result:
    return cb.GridSearch(build, SPACE, epochs=2).fit(digits(partitions=4), backend=cb.LocalBackend(2), seed=3,
                                                     verbose=0, store=tmp_path_factory.mktemp("local") / "run")


@pytest.fixture(scope="module")
def in_process_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def ray_actor(worker: int) -> str:
    """What a worker's ``launched_by`` says when it is a Ray actor."""
    return r"ray actor [0-9a-f]{12} on node [0-9a-f]{12}"


@pytest.mark.slow
def test_ray_actors_give_the_local_backends_bits_and_a_killed_one_is_replaced_alone(in_process_ray, local_result,
                                                                                    tmp_path):
    backend = cb.RayBackend(workers=2)
    assert repr(backend) == "RayBackend(workers=2, address=None, num_cpus_per_worker=1, num_gpus_per_worker=0)"
    result = cb.GridSearch(build, SPACE, epochs=2).fit(digits(partitions=4), backend=backend, seed=3, verbose=0,
                                                       store=tmp_path / "ray")
    _assert_same(result, local_result)
    assert all(re.fullmatch(ray_actor(index), info["launched_by"]) for index, info in result.workers.items())
    store, marker = str(tmp_path / "killed-run"), str(tmp_path / "killed")
    killed = cb.GridSearch(waiting_for_the_replacement(crashing_once(marker, how="sigkill"), store), SPACE,
                           epochs=2).fit(digits(partitions=4), backend=cb.RayBackend(workers=2), seed=3, verbose=0,
                                         store=store)
    assert os.path.exists(marker)
    assert_replaced_alone(list(killed.store.events()), killed, ray_actor)
    _assert_same(killed, local_result)


class Recording(cb.RayBackend):
    """A RayBackend that keeps the run's token, to look for it where Ray keeps things."""

    def start(self, address: tuple[str, int], authkey: bytes) -> None:
        self.authkey = authkey
        super().start(address, authkey)


@pytest.mark.slow
def test_the_runs_token_is_in_no_ray_log_task_or_process_argument(in_process_ray, tmp_path):
    backend = Recording(workers=2)
    cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(digits(partitions=2), backend=backend, seed=1,
                                                                 verbose=0, store=tmp_path / "run")
    token = backend.authkey
    session = ray._private.worker._global_node.get_session_dir_path()
    searched = 0
    for folder, _, names in os.walk(session):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) < 256 * 2**20:
                with open(path, "rb") as f:
                    content = f.read()
                assert token not in content and token.hex().encode() not in content, path
                searched += 1
    assert searched > 10      # Ray's logs, of the driver, the raylet and each actor's worker
    for process in psutil.process_iter(["cmdline"]):
        assert token.hex() not in " ".join(process.info["cmdline"] or ())


def test_ray_backend_checks_its_arguments_before_starting_anything():
    with pytest.raises(ValueError, match=r"^num_gpus_per_worker=-1 must be a number >= 0"):
        cb.RayBackend(num_gpus_per_worker=-1)
    with pytest.raises(ValueError, match=r"^num_cpus_per_worker=0 and num_gpus_per_worker=0: a worker must "
                                         r"reserve a CPU or a GPU$"):
        cb.RayBackend(num_cpus_per_worker=0)
    with pytest.raises(ValueError, match=r"^address='' must be None, 'auto' or a Ray address such as "
                                         r"'ray://host:10001'$"):
        cb.RayBackend(address="")
    with pytest.raises(ValueError, match=r"^workers=0 must be a positive integer"):
        cb.RayBackend(workers=0)
    with pytest.raises(ValueError, match=r"^placement_wait=0 must be a number of seconds > 0$"):
        cb.RayBackend(placement_wait=0)
