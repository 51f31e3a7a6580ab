"""``RayBackend`` (issue 36): each worker a Ray actor. Its checks, and the run's token in no
Ray log, nor in the actors' command lines or environments (the bits and replacement in an
in-process session are in ``test_backends_common.py``; a two-node cluster in
``test_ray_cluster.py``)."""
from __future__ import annotations

import os

import psutil
import pytest
from _models import build, digits

import cerebro as cb

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def in_process_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_backend_says_how_it_was_made():
    backend = cb.RayBackend(workers=2)
    assert repr(backend) == "RayBackend(workers=2, address=None, num_cpus_per_worker=1, num_gpus_per_worker=0)"
    assert cb.RayBackend(4, num_cpus_per_worker=2.5).threads_per_worker == 2


class Recording(cb.RayBackend):
    """A RayBackend that keeps the run's token, to look for it where Ray keeps things."""

    def start(self, address: tuple[str, int], authkey: bytes) -> None:
        self.authkey = authkey
        super().start(address, authkey)


def recording_its_process(folder: str):
    """``build``, except that each process it runs in writes its command line and environment
    to a file of ``folder`` (named by its pid), while it is a worker."""
    def build_that_records(config: dict) -> cb.TorchTrainable:
        me = psutil.Process()
        with open(os.path.join(folder, f"{me.pid}.txt"), "w") as f:
            f.write(" ".join(me.cmdline()) + "\n" + "\n".join(f"{k}={v}" for k, v in os.environ.items()))
        return build(config)
    return build_that_records


@pytest.mark.slow
def test_the_runs_token_is_in_no_ray_log_task_or_process_argument(in_process_ray, tmp_path):
    backend, seen = Recording(workers=2), tmp_path / "processes"
    seen.mkdir()
    result = cb.GridSearch(recording_its_process(str(seen)), {"lr": cb.choice([1e-2])}, epochs=1).fit(
        digits(partitions=2), backend=backend, seed=1, verbose=0, store=tmp_path / "run")
    with pytest.raises(ValueError, match=r"^address='auto', but ray\.init was called already: pass address=None "
                                         r"to use that session$"):
        cb.RayBackend(workers=2, address="auto").driver_address()
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
    workers = {info["pid"] for info in result.workers.values()}
    recorded = {int(name.removesuffix(".txt")): (seen / name).read_text() for name in os.listdir(seen)}
    assert workers <= set(recorded)           # each actor's process, as it ran
    for text in recorded.values():
        assert token.hex() not in text and token.decode("latin-1") not in text


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
