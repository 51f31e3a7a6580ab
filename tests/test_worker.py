"""The worker's side of a sub-epoch, in-process: building, the trainable cache and state versions."""
from __future__ import annotations

import re

import pytest
import torch
from _models import build

import cerebro as cb
from cerebro.store import TaskKind
from cerebro.worker._loop import _run, _Trainables
from cerebro.worker._protocol import RunSubEpoch, StateMissing, SubEpochDone, SubEpochFailed

FEATURES = torch.rand(40, 64)
LABEL = torch.randint(0, 10, (40,))
DATA = {0: {"train": (FEATURES, LABEL), "val": (FEATURES[:8], LABEL[:8])}}


def task(trial_id: str, version: int, state=None, kind: TaskKind = TaskKind.TRAIN, config=None) -> RunSubEpoch:
    return RunSubEpoch(version, trial_id, config or {"lr": 1e-2}, kind, 1, 0, init_seed=3,
                       seed=100 + version, version=version, state=state)


def test_a_trial_whose_state_was_evicted_asks_for_it_and_then_trains_identically():
    torch.set_num_threads(1)
    small = _Trainables(build, torch.device("cpu"), budget=0)   # keeps only the latest trial
    first = _run(task("t0000", 0), small, DATA)
    assert isinstance(first, SubEpochDone)
    assert isinstance(_run(task("t0001", 0), small, DATA), SubEpochDone)   # evicts t0000
    assert _run(task("t0000", 1), small, DATA) == StateMissing(1)
    resent = _run(task("t0000", 1, first.state), small, DATA)

    roomy = _Trainables(build, torch.device("cpu"), budget=1 << 30)
    _run(task("t0000", 0), roomy, DATA)
    cached = _run(task("t0000", 1), roomy, DATA)                            # state left out: held here
    assert isinstance(cached, SubEpochDone) and isinstance(resent, SubEpochDone)
    assert cached.sums.loss == resent.sums.loss
    for name, tensor in cached.state["model"].items():
        assert (tensor.data == resent.state["model"][name].data).all()


def test_a_stale_version_is_never_used():
    trainables = _Trainables(build, torch.device("cpu"), budget=1 << 30)
    _run(task("t0000", 0), trainables, DATA)                    # holds version 1
    assert _run(task("t0000", 2), trainables, DATA) == StateMissing(2)


def test_a_failing_build_is_reported_with_its_traceback():
    result = _run(task("t0000", 0, config={"fail": True}), _Trainables(build, torch.device("cpu"), 0), DATA)
    assert isinstance(result, SubEpochFailed)
    assert "ValueError: boom: this configuration cannot be built" in result.error


def test_build_must_return_a_trainable():
    result = _run(task("t0000", 0), _Trainables(lambda config: torch.nn.Linear(2, 2), torch.device("cpu"), 0), DATA)
    assert isinstance(result, SubEpochFailed)
    assert "TypeError: build(config) must return a cerebro.TorchTrainable; got Linear" in result.error


def test_eval_leaves_the_state_version_alone():
    trainables = _Trainables(build, torch.device("cpu"), budget=1 << 30)
    _run(task("t0000", 0), trainables, DATA)
    evaluated = _run(task("t0000", 1, kind=TaskKind.EVAL), trainables, DATA)
    assert isinstance(evaluated, SubEpochDone) and evaluated.state is None and evaluated.sums.rows == 8
    assert isinstance(_run(task("t0000", 1), trainables, DATA), SubEpochDone)   # version 1 still held


def test_a_metric_may_not_be_called_loss():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=re.escape("metric name 'loss' must be a non-empty string other than "
                                                   "'loss', which is always logged")):
        cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.mse_loss,
                          batch_size=4, metrics={"loss": cb.metrics.mean_squared_error})


def test_a_worker_that_cannot_load_its_partitions_says_why_and_exits(tmp_path):
    import socket
    import threading

    import cloudpickle

    from cerebro.worker import run_worker
    from cerebro.worker._protocol import Hello, Setup, SetupFailed
    from cerebro.worker._wire import accept

    server = socket.create_server(("127.0.0.1", 0))
    worker = threading.Thread(target=run_worker, args=(server.getsockname(), b"key", 0))
    worker.start()
    channel = accept(server, b"key")
    assert isinstance(channel.recv(), Hello)
    channel.send(Setup([0], str(tmp_path / "missing"), cloudpickle.dumps(build), 1, 1.0))
    failed = channel.recv()
    worker.join(timeout=30)
    assert isinstance(failed, SetupFailed) and failed.worker == 0
    assert "FileNotFoundError" in failed.error and "missing" in failed.error
    assert not worker.is_alive()
    channel.close()
    server.close()
