"""The trial book as pure logic: a searcher's trials driven through their epochs with the
real scheduler and no processes; what it journals, how it ends trials, and that the
searcher's state keeps the journal linear in the number of trials."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _search_sim import QuietRecorder

import cerebro as cb
from cerebro.engine import Decision, MOPScheduler, TrialRequest
from cerebro.engine._search_state import apply_delta
from cerebro.engine._settings import Limits, RunSettings
from cerebro.engine._trials import TrialBook
from cerebro.store import TrialStatus
from cerebro.worker import Sums


class Recorder(QuietRecorder):
    """Keeps the journal's lines in memory."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.checkpoints: list[tuple[str, int]] = []

    def emit(self, event) -> None:
        self.lines.append(json.dumps({"event": event.name, **event.record()}))

    def write_checkpoint(self, trial_id, state, epoch, exploit=False) -> None:
        self.checkpoints.append((trial_id, epoch))

    def events(self, name: str) -> list[dict]:
        return [e for e in map(json.loads, self.lines) if e["event"] == name]


def loss_of(config: dict, epoch: int) -> float:
    return config["lr"] * 1000 / epoch + config["hidden"] % 7


def run_book(searcher, partitions: int = 2, max_failures: int | None = None) -> Recorder:
    """Every trial of ``searcher`` to its end on one worker holding every partition."""
    recorder = Recorder()
    scheduler = MOPScheduler({0: list(range(partitions))}, evaluate=False)
    settings = RunSettings(seed=3, num_partitions=partitions, evaluate=False, limits=Limits(max_failures=max_failures))
    book = TrialBook(searcher, scheduler, settings, recorder)
    searcher.start(settings.seed)
    book.add_trials()
    while book.live:
        for task in scheduler.assign([0]):
            trial = book.live[task.trial_id]
            loss = loss_of(trial.config, task.epoch) * (math.nan if trial.config["hidden"] == 0 else 1.0)
            book.sub_epoch_done(task, 0, Sums(rows=10, loss=10 * loss, metrics={}), state=task.epoch)
        book.apply_decisions()
        book.add_trials()
    return recorder


SPACE = {"lr": cb.loguniform(1e-3, 1e-1), "hidden": cb.randint(1, 512)}


def build(config):
    raise AssertionError("the book never builds a model")


def test_epoch_metrics_are_the_row_weighted_means_and_each_epoch_is_checkpointed():
    recorder = run_book(cb.GridSearch(build, {"lr": cb.choice([0.01, 0.02]), "hidden": 8}, epochs=3,
                                      metric="train_loss"))
    ends = recorder.events("epoch_end")
    assert [(e["trial_id"], e["epoch"]) for e in ends] == [(t, e) for e in (1, 2, 3) for t in ("t0000", "t0001")]
    assert all(e["metrics"] == {"train_loss": loss_of({"lr": c, "hidden": 8}, e["epoch"])}
               for e, c in zip(ends, [0.01, 0.02] * 3))
    assert recorder.checkpoints == [(e["trial_id"], e["epoch"]) for e in ends]
    assert [(e["trial_id"], e["status"]) for e in recorder.events("trial_ended")] == [
        ("t0000", TrialStatus.COMPLETED), ("t0001", TrialStatus.COMPLETED)]


def test_a_diverged_trial_ends_and_max_failures_stops_the_run():
    space = {"lr": 0.01, "hidden": cb.choice([0, 8, 0])}
    recorder = run_book(cb.GridSearch(build, space, epochs=2, metric="train_loss"))
    assert [(e["trial_id"], e["status"]) for e in recorder.events("trial_ended")] == [
        ("t0000", "diverged"), ("t0002", "diverged"), ("t0001", "completed")]
    with pytest.raises(cb.TooManyFailuresError, match=r"^2 trials ended failed, diverged or timeout, more than "
                                                       r"max_failures=1: t0000 diverged \(train loss became nan"):
        run_book(cb.GridSearch(build, space, epochs=2, metric="train_loss"), max_failures=1)


class RecordingASHA(cb.ASHA):
    """ASHA that remembers each state it gave the book."""

    def state(self):
        state = super().state()
        self.given = [*getattr(self, "given", []), json.loads(json.dumps(state))]
        return state


def search_state_bytes(trials: int) -> tuple[int, int]:
    """(bytes of the searcher's state in the journal, bytes of the whole journal)."""
    searcher = RecordingASHA(build, SPACE, num_trials=trials, max_epochs=4, grace_period=1, reduction_factor=2,
                             metric="train_loss")
    recorder = run_book(searcher, partitions=1)
    rebuilt, state = [], None
    for entry in recorder.events("search_state"):
        state = entry["state"] if "state" in entry else apply_delta(state, entry["delta"])
        rebuilt.append(state)
    assert rebuilt == [s for i, s in enumerate(searcher.given) if i == 0 or s != searcher.given[i - 1]]
    return sum(len(line) for line in recorder.lines if '"search_state"' in line[:30]), sum(map(len, recorder.lines))


def test_the_searchers_state_keeps_the_journal_linear_in_the_trials():
    small_state, small = search_state_bytes(250)
    large_state, large = search_state_bytes(2000)
    assert large_state / small_state < 8 * 1.25      # 8x the trials: about 8x the bytes (whole states: ~64x)
    assert large / small < 8 * 1.25


def test_trial_statuses_know_whether_they_are_finished_and_failures():
    assert [s for s in TrialStatus if not s.is_finished] == [TrialStatus.RUNNING, TrialStatus.PAUSED]
    assert [s for s in TrialStatus if s.is_failure] == [TrialStatus.FAILED, TrialStatus.DIVERGED, TrialStatus.TIMEOUT]
    assert TrialStatus.FAILED == "failed" and json.dumps(TrialStatus.FAILED) == '"failed"'


def test_numpy_limits_pass_and_are_kept_as_plain_numbers():
    limits = Limits(trial_timeout=np.float32(2.5), max_failures=np.int64(3))
    assert (type(limits.trial_timeout), type(limits.max_failures)) == (float, int)
    assert json.loads(json.dumps([limits.trial_timeout, limits.max_failures])) == [2.5, 3]
    assert Limits(trial_timeout=1).trial_timeout == 1 and type(Limits(trial_timeout=1).trial_timeout) is int


class StopsOneThenDecidesTheOther:
    """Pauses both trials after epoch 1; once both paused, decide() stops t0000, and only
    once that stop has ended it (trial_ended) lets t0001 go on: a second decide() is needed."""

    metric, mode = "train_loss", "min"

    def start(self, seed):
        self.ended, self.paused, self.suggested = set(), set(), False

    def suggest(self):
        if self.suggested:
            return []
        self.suggested = True
        return [TrialRequest({"lr": 0.01, "hidden": h}, 2) for h in (1, 2)]

    def report(self, trial_id, epoch, metrics):
        self.paused.add(trial_id)
        return Decision.PAUSE

    def decide(self):
        if len(self.paused) < 2:
            return {}
        return {"t0001": Decision.CONTINUE} if "t0000" in self.ended else {"t0000": Decision.STOP}

    def trial_ended(self, trial_id, status):
        self.ended.add(trial_id)

    def stop_reason(self, trial_id):
        return "stopped first"

    def state(self):
        return {}


def test_a_run_whose_paused_trials_need_a_second_decide_is_not_stuck():
    recorder, policy = Recorder(), StopsOneThenDecidesTheOther()
    scheduler = MOPScheduler({0: [0]}, evaluate=False)
    book = TrialBook(policy, scheduler, RunSettings(seed=3, num_partitions=1, evaluate=False), recorder)
    policy.start(3)
    book.add_trials()
    while book.live:                         # the driver's order: dispatch, the stuck check, decisions
        tasks = scheduler.assign([0])
        book.check_not_stuck(running=bool(tasks))
        for task in tasks:
            book.sub_epoch_done(task, 0, Sums(rows=1, loss=1.0, metrics={}), state=task.epoch)
        book.apply_decisions()
    assert [(e["trial_id"], e["status"]) for e in recorder.events("trial_ended")] == [
        ("t0000", "stopped"), ("t0001", "completed")]


@pytest.mark.parametrize("max_trial_losses", [1, 2, 4])
def test_a_trial_fails_on_its_max_trial_losses_th_lost_worker_and_not_before(max_trial_losses):
    recorder = Recorder()
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=False)
    settings = RunSettings(seed=3, num_partitions=2, evaluate=False,
                           limits=Limits(max_trial_losses=max_trial_losses))
    searcher = cb.GridSearch(build, {"lr": 0.01, "hidden": 8}, epochs=1, metric="train_loss")
    book = TrialBook(searcher, scheduler, settings, recorder)
    searcher.start(settings.seed)
    book.add_trials()
    reasons = []
    for loss in range(1, max_trial_losses + 1):
        [task] = scheduler.assign([0, 1])
        reasons.append(f"worker {task.worker} lost ({loss})")
        assert book.worker_lost(task, reasons[-1]) is (loss == max_trial_losses)
        assert [e["status"] for e in recorder.events("trial_ended")] == ([TrialStatus.FAILED] if
                                                                         loss == max_trial_losses else [])
    [ended] = recorder.events("trial_ended")
    assert ended["reason"] == f"lost the {max_trial_losses} workers that ran it: " + "; ".join(reasons)


def test_max_trial_losses_must_be_a_positive_integer():
    for bad in (0, -1, 2.5, "3", None):
        with pytest.raises((ValueError, TypeError), match=rf"^max_trial_losses={bad!r} must be a positive integer"):
            Limits(max_trial_losses=bad)
