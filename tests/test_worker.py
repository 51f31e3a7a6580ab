"""The worker's side of a sub-epoch, in-process: building, the trainable cache and state versions."""
from __future__ import annotations

import os
import re
import threading

import pytest
import torch
from _models import build, digits

import cerebro as cb
from cerebro.backends import Backend
from cerebro.data import InMemoryPartition, PartitionLayout, SampleScheme
from cerebro.store import TaskKind
from cerebro.worker import _loop, _outbox, run_worker
from cerebro.worker._loop import _run, _Trainables
from cerebro.worker._protocol import RunSubEpoch, StateMissing, SubEpochDone, SubEpochFailed

FEATURES = torch.rand(40, 64).numpy()
LABEL = torch.randint(0, 10, (40,)).numpy()
LAYOUT = PartitionLayout(1, (64,), (), "int64", {"train": [40], "val": [8]}, "float32", 40, 8, SampleScheme.WINDOWED)
DATA = {0: {"train": InMemoryPartition(LAYOUT, FEATURES, LABEL),
            "val": InMemoryPartition(LAYOUT, FEATURES[:8], LABEL[:8])}}
CPU = torch.device("cpu")


def task(trial_id: str, version: int, state=None, kind: TaskKind = TaskKind.TRAIN, config=None) -> RunSubEpoch:
    return RunSubEpoch(version, trial_id, config or {"lr": 1e-2}, kind, 1, 0, init_seed=3,
                       seed=100 + version, version=version, state=state)


def test_a_trial_whose_state_was_evicted_asks_for_it_and_then_trains_identically():
    torch.set_num_threads(1)
    small = _Trainables(build, torch.device("cpu"), budget=0, train_rows=[100])   # keeps only the latest trial
    first = _run(task("t0000", 0), small, DATA, CPU)
    assert isinstance(first, SubEpochDone)
    assert isinstance(_run(task("t0001", 0), small, DATA, CPU), SubEpochDone)   # evicts t0000
    assert _run(task("t0000", 1), small, DATA, CPU) == StateMissing(1)
    resent = _run(task("t0000", 1, first.state), small, DATA, CPU)

    roomy = _Trainables(build, torch.device("cpu"), budget=1 << 30, train_rows=[100])
    _run(task("t0000", 0), roomy, DATA, CPU)
    cached = _run(task("t0000", 1), roomy, DATA, CPU)                            # state left out: held here
    assert isinstance(cached, SubEpochDone) and isinstance(resent, SubEpochDone)
    assert cached.sums.loss == resent.sums.loss
    for name, tensor in cached.state["model"].items():
        assert (tensor.data == resent.state["model"][name].data).all()


def test_sub_epoch_done_names_exactly_the_trials_the_cache_evicted():
    small = _Trainables(build, torch.device("cpu"), budget=0, train_rows=[100])   # keeps only the latest trial
    first = _run(task("t0000", 0), small, DATA, CPU)
    assert first.evicted == ()
    assert _run(task("t0001", 0), small, DATA, CPU).evicted == ("t0000",)
    assert _run(task("t0001", 1), small, DATA, CPU).evicted == ()             # the one it holds again
    assert _run(task("t0000", 1, first.state, kind=TaskKind.EVAL), small, DATA, CPU).evicted == ("t0001",)
    # PBT's new config rebuilds the trial in its own place: nothing else goes.
    assert _run(task("t0000", 1, first.state, config={"lr": 1e-3}), small, DATA, CPU).evicted == ()

    one = 3 * sum(t.numel() * t.element_size() for t in build({}).model.state_dict().values())
    pair = _Trainables(build, torch.device("cpu"), budget=2 * one, train_rows=[100])   # the cache's estimate, twice
    assert [_run(task(trial, 0), pair, DATA, CPU).evicted for trial in ("t0000", "t0001")] == [(), ()]
    assert _run(task("t0000", 1), pair, DATA, CPU).evicted == ()             # t0001 is now the least recent
    assert _run(task("t0002", 0), pair, DATA, CPU).evicted == ("t0001",)
    assert _run(task("t0000", 2), pair, DATA, CPU).evicted == ()             # still held: no state needed


def test_a_stale_version_is_never_used():
    trainables = _Trainables(build, torch.device("cpu"), budget=1 << 30, train_rows=[100])
    _run(task("t0000", 0), trainables, DATA, CPU)                    # holds version 1
    assert _run(task("t0000", 2), trainables, DATA, CPU) == StateMissing(2)


def test_a_failing_build_is_reported_with_its_traceback():
    trainables = _Trainables(build, torch.device("cpu"), 0, train_rows=[100])
    result = _run(task("t0000", 0, config={"fail": True}), trainables, DATA, CPU)
    assert isinstance(result, SubEpochFailed)
    assert "ValueError: boom: this configuration cannot be built" in result.error


def test_build_must_return_a_trainable():
    trainables = _Trainables(lambda config: torch.nn.Linear(2, 2), CPU, 0, train_rows=[100])
    result = _run(task("t0000", 0), trainables, DATA, CPU)
    assert isinstance(result, SubEpochFailed)
    assert ("TypeError: build(config) must return a cerebro.Trainable (a cerebro.TorchTrainable, a "
            "cerebro.KerasTrainable, or a subclass of your own: docs/extending.md); got Linear" in result.error)


def test_eval_leaves_the_state_version_alone():
    trainables = _Trainables(build, torch.device("cpu"), budget=1 << 30, train_rows=[100])
    _run(task("t0000", 0), trainables, DATA, CPU)
    evaluated = _run(task("t0000", 1, kind=TaskKind.EVAL), trainables, DATA, CPU)
    assert isinstance(evaluated, SubEpochDone) and evaluated.state is None and evaluated.sums.rows == 8
    assert isinstance(_run(task("t0000", 1), trainables, DATA, CPU), SubEpochDone)   # version 1 still held


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
    from cerebro.worker._wire import authenticate

    server = socket.create_server(("127.0.0.1", 0))
    worker = threading.Thread(target=run_worker, args=(server.getsockname(), b"key", 0))
    worker.start()
    channel = authenticate(server.accept()[0], b"key")
    assert isinstance(channel.recv(), Hello)
    channel.send(Setup([0], str(tmp_path / "missing"), cloudpickle.dumps(build), 1, 1.0))
    failed = channel.recv()
    worker.join(timeout=30)
    assert isinstance(failed, SetupFailed) and failed.worker == 0
    assert "FileNotFoundError" in failed.error and "missing" in failed.error
    assert not worker.is_alive()
    channel.close()
    server.close()


class ThreadBackend(Backend):
    """Workers as threads of the test process, calling run_worker directly, so that the test
    can set what a worker reads at start-up (its cache budget) and watch what it answers."""

    threads_per_worker = 1
    heartbeat_timeout = 600.0         # heartbeats are off (see below); the run takes seconds

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._threads: list[threading.Thread] = []

    def start(self, address: tuple[str, int], authkey: bytes) -> None:
        self._threads = [threading.Thread(target=run_worker, args=(address, authkey, worker, "test thread"))
                         for worker in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def exited(self) -> dict[int, str]:
        return {worker: "thread ended" for worker, thread in enumerate(self._threads) if not thread.is_alive()}

    def stop(self) -> None:
        for thread in self._threads:      # the driver sent Shutdown: each ends its loop
            thread.join(timeout=30)


def _watch_answers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[RunSubEpoch, object]]:
    """Every task the workers (threads) run and what they answer, as they answer it."""
    answers: list[tuple[RunSubEpoch, object]] = []

    def watched_run(task: RunSubEpoch, trainables: _Trainables, sources: dict, device: torch.device) -> object:
        answer = _run(task, trainables, sources, device)
        answers.append((task, answer))
        return answer

    monkeypatch.setattr(_loop, "_run", watched_run)
    return answers


def test_the_driver_sends_the_state_of_a_trial_a_worker_evicted_so_no_worker_misses_it(tmp_path, monkeypatch):
    monkeypatch.setattr(_loop, "TRAINABLE_CACHE_BYTES", 0)     # each worker keeps only its latest trial
    answers = _watch_answers(monkeypatch)
    # A heartbeat that fails on a closing channel ends the worker's process with os._exit:
    # here that would be pytest's, so worker threads send none.
    monkeypatch.setattr(_loop, "_beat", lambda *args: None)
    threads = torch.get_num_threads()
    try:
        search = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-3, 1e-3])}, epochs=2, metric="val_accuracy",
                               mode="max")
        result = search.fit(digits(partitions=4, rows=200), backend=ThreadBackend(workers=2), seed=0, verbose=0,
                            store=tmp_path / "run")
    finally:
        torch.set_num_threads(threads)    # the workers set this process's thread count
    assert [(trial.status, trial.epochs) for trial in result.trials] == [("completed", 2)] * 3
    # No worker answered StateMissing though their small caches evicted trials, and the driver
    # still left the state out of the tasks a worker held the state of.
    assert [answer for _, answer in answers if not isinstance(answer, SubEpochDone)] == []
    assert any(answer.evicted for _, answer in answers)
    assert any(task.state is None and task.version > 0 for task, _ in answers)


def test_a_run_whose_outboxes_keep_nothing_completes_every_trial(tmp_path, monkeypatch):
    monkeypatch.setattr(_loop, "_beat", lambda *args: None)     # as above
    monkeypatch.setattr(_loop, "OUTBOX_BYTES", 0)      # each outbox keeps only the state it trained last,
    monkeypatch.setattr(_outbox.Outbox, "_write", lambda self, key, blob: None)             # and no disk
    answers = _watch_answers(monkeypatch)
    threads = torch.get_num_threads()
    try:
        # (Worker threads share torch's random state, so this run is not bitwise reproducible:
        # the bits of direct hops are tested with processes, in test_direct_hops.py.)
        result = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-3, 1e-3])}, epochs=2).fit(
            digits(partitions=4, rows=200), backend=ThreadBackend(workers=2), seed=1, verbose=0,
            store=tmp_path / "run")
    finally:
        torch.set_num_threads(threads)
    assert [(trial.status, trial.epochs) for trial in result.trials] == [("completed", 2)] * 3
    # A peer may be asked for a state it handed back before the driver read that: the safety
    # net (StateMissing, then the state from the driver, or the trial back to its last copy).
    assert all(isinstance(answer, SubEpochDone) or (isinstance(answer, StateMissing) and answer.unreachable is None)
               for _, answer in answers)
    # Which states go back to the driver depends on timing (a state forgotten before its
    # worker trains the next is not); the hand-back itself: test_direct_hops.py.


def test_a_result_the_wire_cannot_carry_fails_its_task_not_the_worker():
    from cerebro.store import frames
    from cerebro.worker._loop import reply
    from cerebro.worker._protocol import Sums

    class Wire:
        """Encodes as the real channel does, before any byte would go out."""
        def __init__(self):
            self.sent = []

        def send(self, message):
            frames(message)
            self.sent.append(message)

    wire = Wire()
    reply(wire, 7, SubEpochDone(7, Sums(1, 1.0, {}, {"f1": object()}), 0.1))
    [failed] = wire.sent
    assert isinstance(failed, SubEpochFailed) and failed.task_id == 7
    assert "TypeError: object cannot be written as data" in failed.error


def test_tensorflows_start_up_banners_are_hidden_and_every_other_line_passed_on(capfd):
    from cerebro._quiet import start_up_banners_hidden
    with start_up_banners_hidden():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"I0000 00:00:1795726585.270411   26637 port.cc:153] oneDNN custom operations are on.\n")
        os.write(2, b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow\n")
        os.write(2, b"F0000 00:00:1.0 1 cpu_feature_guard.cc:1] this CPU lacks AVX\n")
        os.write(2, b"a line of the user's\n")
    assert capfd.readouterr().err == ("F0000 00:00:1.0 1 cpu_feature_guard.cc:1] this CPU lacks AVX\n"
                                      "a line of the user's\n")
