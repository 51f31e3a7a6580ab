"""Trials that fail or diverge end alone; a worker that dies stops the run at once, clearly;
with one partition a trial is exactly a plain torch training loop."""
from __future__ import annotations

import math
import os
import re
import signal
import sys
import threading
import time

import pandas as pd
import pytest
import torch
from _crash import assert_same_results
from _faults import epochs_journaled, striking
from _models import build, crashing_once, digits
from click.testing import CliRunner

import cerebro as cb
from cerebro.cli import main
from cerebro.data import read_layout, read_partition, sample_order
from cerebro.engine import MOPScheduler, init_seed, subepoch_seed
from cerebro.worker import in_preflight

pytestmark = pytest.mark.slow


def test_failed_and_diverged_trials_end_while_the_others_finish(tmp_path):
    space = {"fail": cb.choice([False, True]), "diverge": cb.choice([False, True])}
    result = cb.GridSearch(build, space, epochs=2).fit(digits(partitions=2), workers=2, seed=0,
                                                       store=tmp_path / "run", verbose=0)
    by_config = {(t.config["fail"], t.config["diverge"]): t for t in result.trials}
    healthy = by_config[(False, False)]
    assert healthy.status == "completed" and healthy.epochs == 2
    for key in ((True, False), (True, True)):
        failed = by_config[key]
        assert failed.status == "failed" and failed.epochs == 0
        assert "ValueError: boom: this configuration cannot be built" in failed.error
        with open(tmp_path / "run" / "trials" / failed.trial_id / "error.txt") as f:
            assert f.read() == failed.error
    diverged = by_config[(False, True)]
    assert diverged.status == "diverged"
    assert diverged.error.startswith("train loss became nan in epoch 1 on partition")
    assert result.best.trial_id == healthy.trial_id
    assert result.finished


def test_a_trial_that_kills_its_workers_fails_and_the_run_goes_on(tmp_path):
    space = {"crash": cb.choice([False, True])}
    result = cb.GridSearch(build, space, epochs=3).fit(digits(partitions=2), workers=2, seed=0,
                                                       store=tmp_path / "run", verbose=0)
    statuses = {t.trial_id: t.status for t in result.trials}
    assert statuses == {"t0000": "completed", "t0001": "failed"}
    error = result.trials[1].error
    assert error.startswith("lost the 3 workers that ran it: worker ")
    assert error.count("while running t0001 train epoch 1") == 3
    assert "closed its connection" in error or "exited with code 3" in error
    events = [e["event"] for e in result.store.events()]
    # Each loss either hands the partitions over or, with no worker left, starts all anew.
    assert events.count("worker_lost") == 3
    assert events.count("partitions_moved") + events.count("workers_restarted") == 3
    assert result.finished


def test_a_restart_after_the_trial_that_caused_it_failed_does_not_use_up_max_restarts(tmp_path):
    result = cb.GridSearch(build, {"crash": cb.choice([False, True])}, epochs=3).fit(
        digits(partitions=2), backend=cb.LocalBackend(2, max_restarts=0), seed=0, store=tmp_path / "run", verbose=0,
        max_trial_losses=2)        # its second loss leaves no worker: the trial is blamed before the restart
    assert [t.status for t in result.trials] == ["completed", "failed"]
    restarted = [e for e in result.store.events() if e["event"] == "workers_restarted"]
    assert len(restarted) == 1 and restarted[0]["restart"] == 0
    assert result.finished


def test_when_no_worker_is_left_and_none_may_start_the_run_stops_clearly(tmp_path):
    space = {"crash": cb.choice([True])}
    with pytest.raises(cb.WorkerLostError) as error:
        cb.GridSearch(build, space, epochs=3).fit(digits(partitions=2), backend=cb.LocalBackend(1, max_restarts=0),
                                                  seed=0, store=tmp_path / "run", verbose=0)
    message = str(error.value)
    assert "while running t0000 train epoch 1" in message
    assert "no worker is left and the backend may not start more (max_restarts=0)" in message
    assert f"Its journal and checkpoints are in {tmp_path / 'run'}" in message
    loaded = cb.load(tmp_path / "run")
    assert not loaded.finished
    assert loaded.trials[0].status == "parked" and loaded.state == "failed"


def test_with_one_partition_a_trial_equals_a_plain_torch_loop(tmp_path):
    torch.set_num_threads(1)
    config, seed, epochs = {"architecture": "cnn", "lr": 3e-3, "batch_size": 16}, 11, 3
    search = cb.GridSearch(build, {k: cb.choice([v]) for k, v in config.items()}, epochs=epochs)
    result = search.fit(digits(partitions=1), backend=cb.LocalBackend(1, threads_per_worker=1),
                        seed=seed, store=tmp_path / "run", verbose=0)
    features, label = (torch.from_numpy(a) for a in read_partition(str(tmp_path / "run" / "data"), "train", 0))
    layout = read_layout(str(tmp_path / "run" / "data"))

    torch.manual_seed(init_seed(seed, "t0000"))
    plain = build(config)
    for epoch in range(1, epochs + 1):
        batch_seed = subepoch_seed(seed, "t0000", epoch, 0)
        torch.manual_seed(batch_seed)
        order = torch.from_numpy(sample_order(layout.sample_order, batch_seed, len(features), layout.row_group_rows,
                                              layout.window))          # the documented sample order
        plain.model.train()
        for start in range(0, len(features), config["batch_size"]):
            rows = order[start:start + config["batch_size"]]
            plain.optimizer.zero_grad()
            plain.loss(plain.model(features[rows]), label[rows]).backward()
            plain.optimizer.step()

    trained = result.trials[0].state_dict()
    assert trained.keys() == plain.model.state_dict().keys()
    for name, tensor in plain.model.state_dict().items():
        assert torch.equal(trained[name], tensor), name


def test_run_directory_is_never_overwritten(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "something").write_text("mine")
    with pytest.raises(FileExistsError, match="is a directory that is not empty"):
        cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
            digits(partitions=2), workers=2, store=tmp_path / "run", verbose=0)
    assert os.listdir(tmp_path / "run") == ["something"]


def test_a_worker_that_hangs_is_lost_after_its_heartbeat_timeout(tmp_path):
    space = {"hang": cb.choice([False, True])}
    backend = cb.LocalBackend(workers=2, heartbeat_timeout=3)
    result = cb.GridSearch(hanging_build, space, epochs=2).fit(digits(partitions=2), backend=backend, seed=0,
                                                              store=tmp_path / "run", verbose=0)
    assert [t.status for t in result.trials] == ["completed", "failed"]
    assert re.search(r"sent no heartbeat for \d+ s while running t0001 train epoch 1", result.trials[1].error)
    events = list(result.store.events())
    frozen = [e for e in events if e["event"] == "worker_lost"]
    assert len(frozen) == 3                        # it froze the workers it moved to as well, up to max_trial_losses
    for launch in (e for e in events if e["event"] in ("run_started", "workers_restarted", "worker_replaced")):
        for worker in launch["workers"].values():  # every process ended, the frozen ones too
            with pytest.raises(ProcessLookupError):
                os.kill(worker["pid"], 0)


def hanging_build(config: dict) -> cb.TorchTrainable:
    """A trainable whose first loss freezes its worker process (SIGSTOP): no more heartbeats."""
    trainable = build({})
    if config["hang"]:
        def freeze(outputs, targets):
            if not in_preflight():      # a worker's, not the driver's
                os.kill(os.getpid(), signal.SIGSTOP)
            return torch.nn.functional.cross_entropy(outputs, targets)
        trainable.loss = freeze
    return trainable


@pytest.mark.parametrize("how", ["exit", "sigkill", "sigstop"])
def test_a_lost_workers_partitions_move_and_the_results_stay_the_same(tmp_path, how):
    space = {"lr": cb.choice([1e-2, 3e-3, 1e-3])}
    plain = cb.GridSearch(build, space, epochs=2).fit(
        digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1), seed=4, store=tmp_path / "a",
        verbose=0)
    marker = tmp_path / "crashed"
    moved = cb.GridSearch(crashing_once(str(marker), how), space, epochs=2).fit(
        digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1, heartbeat_timeout=3), seed=4,
        store=tmp_path / "b", verbose=0)
    assert marker.exists()
    events = list(moved.store.events())
    lost = next(e for e in events if e["event"] == "partitions_moved")
    survivor = 1 - lost["lost"]
    assert lost["moved"] == {str(survivor): [lost["lost"], lost["lost"] + 2]}
    assert [e["event"] for e in events].count("workers_restarted") == 0
    if how == "sigstop":      # a hang is found by the missing heartbeats, within the timeout
        assert re.fullmatch(r"sent no heartbeat for [34] s", next(e for e in events if e["event"] == "worker_lost")
                            ["reason"])
    schedule = moved.schedule()
    replaced = [e["time"] for e in events if e["event"] == "worker_replaced"] or [math.inf]
    after = schedule[(schedule.start > next(e["time"] for e in events if e["event"] == "worker_lost"))
                     & (schedule.start < replaced[0])]      # until the lost worker, started anew, is back
    assert set(after.worker) == {survivor} and set(after.partition) <= {0, 1, 2, 3} and len(after) > 0
    pd.testing.assert_frame_equal(plain.history(), moved.history(), check_exact=True)
    for a, b in zip(plain.trials, moved.trials):
        assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_a_lost_worker_is_started_anew_and_takes_its_partitions_back(tmp_path):
    marker = tmp_path / "crashed"
    space = {"lr": cb.choice([1e-2, 3e-3, 1e-3]), "slow": cb.choice([0.06])}     # a run of ~15 s
    result = cb.GridSearch(crashing_once(str(marker), "sigkill"), space, epochs=5).fit(
        digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1), seed=4, store=tmp_path / "run",
        verbose=0)
    assert marker.exists() and [t.status for t in result.trials] == ["completed"] * 3
    events = list(result.store.events())
    lost = next(e for e in events if e["event"] == "worker_lost")["worker"]
    started = next(e for e in events if e["event"] == "run_started")["workers"]
    replaced = next(e for e in events if e["event"] == "worker_replaced")
    assert replaced["worker"] == lost and replaced["workers"][str(lost)]["pid"] != started[str(lost)]["pid"]
    assert replaced["workers"][str(lost)]["partitions"] == [lost, lost + 2]
    schedule = result.schedule()
    back = schedule[schedule.start > replaced["time"]]
    assert set(back.worker) == {0, 1}                       # both workers busy again
    for worker, partitions in back.groupby("worker").partition:
        assert set(partitions) <= {worker, worker + 2}      # each on its own partitions once more
    assert set(back[back.worker == lost].pid) == {replaced["workers"][str(lost)]["pid"]}
    shown = CliRunner().invoke(main, ["status", str(tmp_path / "run")])
    assert shown.exit_code == 0 and "workers: 1 lost, 1 started anew, all restarted 0 times" in shown.output


def test_workers_started_anew_when_none_is_left_give_the_same_results(tmp_path):
    space = {"lr": cb.choice([1e-2, 3e-3, 1e-3])}
    plain = cb.GridSearch(build, space, epochs=2).fit(
        digits(partitions=2), backend=cb.LocalBackend(1, threads_per_worker=1), seed=4, store=tmp_path / "a",
        verbose=0)
    marker = tmp_path / "crashed"
    relaunched = cb.GridSearch(crashing_once(str(marker)), space, epochs=2).fit(
        digits(partitions=2), backend=cb.LocalBackend(1, threads_per_worker=1, max_restarts=1), seed=4,
        store=tmp_path / "b", verbose=0)
    assert marker.exists()
    assert [e["event"] for e in relaunched.store.events()].count("workers_restarted") == 1
    pd.testing.assert_frame_equal(plain.history(), relaunched.history(), check_exact=True)
    for a, b in zip(plain.trials, relaunched.trials):
        assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


class LosingEveryWorkerAtOnce(cb.LocalBackend):
    """Local workers that all die together (a machine that goes down) once ``marker``
    exists: the driver learns of every loss in one health check."""

    def __init__(self, marker: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.marker, self.killed = marker, False

    def exited(self) -> dict[int, str]:
        if not self.killed and os.path.exists(self.marker):
            self.killed = True
            for worker in range(self.workers):
                self.release(worker)
        return super().exited()


def hanging_once_on_worker_1(marker: str):
    """``build``, except that the first training batch on worker 1 claims ``marker`` and never
    returns: worker 1 is in the middle of a sub-epoch when every worker dies."""
    def build_hanging(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        trainable.loss = striking(trainable.loss, threading.Event().wait, marker=marker,
                                  when=lambda: sys.argv[-1] == "1")    # python -m cerebro.worker HOST PORT 1
        return trainable
    return build_hanging


def test_workers_lost_together_while_running_sub_epochs_are_restarted_and_the_results_stay_the_same(tmp_path):
    space = {"lr": cb.choice([1e-2, 3e-3, 1e-3])}
    plain = cb.GridSearch(build, space, epochs=2).fit(
        digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1), seed=4, store=tmp_path / "a",
        verbose=0)
    marker = str(tmp_path / "hung")
    together = cb.GridSearch(hanging_once_on_worker_1(marker), space, epochs=2).fit(
        digits(partitions=4), backend=LosingEveryWorkerAtOnce(marker, workers=2, threads_per_worker=1), seed=4,
        store=tmp_path / "b", verbose=0)
    events = list(together.store.events())
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert [e["worker"] for e in lost] == [0, 1] and lost[1]["running"] is not None
    assert [e["event"] for e in events].count("workers_restarted") == 1
    assert_same_results(together, plain)


class StallingGrid(cb.GridSearch):
    """Grid search whose driver stalls in its first report for longer than the workers'
    heartbeat timeout (as a slow store or a long epoch end would make it)."""

    stall = 0.0

    def report(self, trial_id, epoch, metrics):
        time.sleep(self.stall)          # the fault: a driver that reads nothing meanwhile
        self.stall = 0.0
        return super().report(trial_id, epoch, metrics)


def test_a_driver_that_stalls_past_the_heartbeat_timeout_loses_no_worker(tmp_path):
    space = {"lr": cb.choice([1e-2, 3e-3, 1e-3])}
    plain = cb.GridSearch(build, space, epochs=2).fit(
        digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1), seed=4, store=tmp_path / "a",
        verbose=0)
    stalling = StallingGrid(build, space, epochs=2)
    stalling.stall = 4.0
    stalled = stalling.fit(digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1,
                                                                          heartbeat_timeout=1.5),
                           seed=4, store=tmp_path / "b", verbose=0)
    events = [e["event"] for e in stalled.store.events()]
    assert "worker_lost" not in events and "workers_restarted" not in events
    assert_same_results(stalled, plain)


def test_a_sub_epoch_the_scheduler_loses_stops_the_run_resumable_instead_of_hanging(tmp_path, monkeypatch):
    space = {"lr": cb.choice([1e-2, 3e-3, 1e-3])}
    plain = cb.GridSearch(build, space, epochs=2).fit(
        digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1), seed=4, store=tmp_path / "a",
        verbose=0)
    assign, calls = MOPScheduler.assign, []

    def losing(self, idle_workers):     # the fault: a started step that is never sent (a bug)
        tasks = assign(self, idle_workers)
        calls.append(bool(tasks))
        return tasks[:-1] if tasks and calls.count(True) == 5 else tasks

    monkeypatch.setattr(MOPScheduler, "assign", losing)
    with pytest.raises(RuntimeError, match=r"^the sub-epochs of \[('t\d{4}'(, )?)+\] can start on none of the idle "
                                           r"workers \[0, 1\]: the scheduler lost track of them \(a bug\); the run "
                                           r"stopped and can be resumed from "):
        cb.GridSearch(build, space, epochs=2).fit(digits(partitions=4), seed=4, store=tmp_path / "b", verbose=0,
                                                  backend=cb.LocalBackend(2, threads_per_worker=1))
    monkeypatch.undo()
    assert_same_results(cb.resume(tmp_path / "b", verbose=0), plain)


def test_more_failures_than_max_failures_stop_the_run(tmp_path):
    space = {"fail": cb.choice([False, True]), "hidden": cb.choice([8, 16])}
    with pytest.raises(cb.TooManyFailuresError) as error:
        cb.GridSearch(build, space, epochs=2).fit(digits(partitions=2), workers=2, seed=0, store=tmp_path / "run",
                                                  verbose=0, max_failures=1)
    assert re.fullmatch(r"2 trials ended failed, diverged or timeout, more than max_failures=1: "
                        r"t000[23] failed \(ValueError: boom: this configuration cannot be built\); "
                        r"t000[23] failed \(ValueError: boom: this configuration cannot be built\)\. The run "
                        r"stopped; its journal and checkpoints are in .*", str(error.value))
    stopped = cb.load(tmp_path / "run")
    assert [e["event"] for e in stopped.store.events()][-2:] == ["trial_ended", "run_failed"]
    assert stopped.run_error == f"TooManyFailuresError: {error.value}"


def killed_twice(store: str, markers: str, victim: float):
    """``build`` whose worker, while training the trial with lr ``victim``, is killed once
    after 1 journaled epoch and once more after 2: two losses that are not the trial's fault."""
    def build_with_bad_luck(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        for number in (2, 1):        # the outer one, after 1 epoch, is asked first
            trainable.loss = striking(trainable.loss, lambda: os.kill(os.getpid(), signal.SIGKILL),
                                      marker=f"{markers}.{number}",
                                      when=lambda n=number: config["lr"] == victim and epochs_journaled(store) >= n)
        return trainable
    return build_with_bad_luck


def test_two_unrelated_losses_on_one_trial_leave_it_completed_and_the_results_unchanged(tmp_path):
    space = {"lr": cb.choice([1e-2, 3e-2])}
    store = str(tmp_path / "run")
    result = cb.GridSearch(killed_twice(store, str(tmp_path / "killed"), 3e-2), space, epochs=4).fit(
        digits(partitions=2), workers=2, seed=0, store=store, verbose=0)
    lost = [e for e in result.store.events() if e["event"] == "worker_lost"]
    assert len(lost) == 2 and {e["running"]["trial_id"] for e in lost} == {"t0001"}
    assert [t.status for t in result.trials] == ["completed", "completed"]
    expected = cb.GridSearch(build, space, epochs=4).fit(digits(partitions=2), workers=2, seed=0,
                                                         store=tmp_path / "undisturbed", verbose=0)
    assert_same_results(result, expected, partitions=2)
