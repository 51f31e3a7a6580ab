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

    def write_checkpoint(self, trial_id, state, epoch, exploit=False, best=False) -> None:
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
    book.write_search_state(now=True)       # as the driver does at the run's end
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


def search_state_bytes(trials: int) -> tuple[int, int, int]:
    """(bytes of the searcher's state in the journal, bytes of the whole journal, how many
    times the book asked for the state)."""
    searcher = RecordingASHA(build, SPACE, num_trials=trials, max_epochs=4, grace_period=1, reduction_factor=2,
                             metric="train_loss")
    recorder = run_book(searcher, partitions=1)
    rebuilt, state = [], None
    for entry in recorder.events("search_state"):
        state = entry["state"] if "state" in entry else apply_delta(state, entry["delta"])
        rebuilt.append(state)
    assert rebuilt == [s for i, s in enumerate(searcher.given) if i == 0 or s != searcher.given[i - 1]]
    assert rebuilt[-1] == json.loads(json.dumps(searcher.state()))      # the run's end journals the last one
    return (sum(len(line) for line in recorder.lines if '"search_state"' in line[:30]), sum(map(len, recorder.lines)),
            len(searcher.given))


def test_the_searchers_state_keeps_the_journal_linear_in_the_trials():
    small_state, small, _ = search_state_bytes(250)
    large_state, large, _ = search_state_bytes(2000)
    assert large_state / small_state < 8 * 1.25      # 8x the trials: about 8x the bytes (whole states: ~64x)
    assert large / small < 8 * 1.25


def test_the_state_is_asked_for_once_every_trials_over_64_decisions_so_a_decision_costs_the_same_at_any_size():
    asked = {trials: search_state_bytes(trials)[2] for trials in (250, 2000)}
    # Each ask costs O(trials) and comes once every trials/64 decisions: 8x the trials add
    # ~64 * ln 8 asks where asking at every decision asked ~8x as often (119 and 245 here).
    assert asked[2000] < 3 * asked[250]


def test_trial_statuses_know_whether_they_are_finished_and_failures():
    assert [s for s in TrialStatus if not s.is_finished] == \
        [TrialStatus.RUNNING, TrialStatus.PAUSED, TrialStatus.PARKED]
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


class StateRecorder(Recorder):
    """Also keeps the state each checkpoint was written with."""

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[tuple[str, int], object] = {}

    def write_checkpoint(self, trial_id, state, epoch, exploit=False, best=False) -> None:
        super().write_checkpoint(trial_id, state, epoch, exploit, best)
        self.states[trial_id, epoch] = state.get()


def trained_one_epoch(searcher=None):
    """One trial (of ``searcher``; a grid search of 3 epochs by default), two partitions on
    two workers, each epoch evaluated, once it has trained its first epoch."""
    if searcher is None:
        searcher = cb.GridSearch(build, {"lr": 0.01, "hidden": 8}, epochs=3, metric="val_loss")
    recorder = StateRecorder()
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=True)
    book = TrialBook(searcher, scheduler, RunSettings(seed=3, num_partitions=2, evaluate=True), recorder)
    searcher.start(3)
    book.add_trials()
    for _ in range(2):
        [task] = scheduler.assign([0, 1])
        finish(book, task)
    return book, scheduler, recorder, task


def finish(book: TrialBook, task, loss: float = 1.0) -> None:
    """``task`` ran; a train sub-epoch leaves the state (epoch, partition)."""
    book.sub_epoch_done(task, task.worker, Sums(rows=10, loss=10 * loss, metrics={}),
                        state=(task.epoch, task.partition))


class NeedsMetrics(cb.GridSearch):
    def continues_after(self, trial_id: str, epoch: int) -> bool:
        return False


def test_evals_run_alongside_the_next_epoch_on_the_state_its_training_left():
    book, scheduler, recorder, task = trained_one_epoch()
    last = (1, task.partition)
    trial = book.live["t0000"]
    assert trial.epoch == 2 and trial.evaluations[1].state.get() == last and trial.evaluations[1].version == 2
    started = scheduler.assign([0, 1])
    # The next epoch's first step goes first on its worker; an eval of epoch 1 on the other.
    assert sorted((t.kind.value, t.epoch) for t in started) == [("eval", 1), ("train", 2)]
    for task in started:
        finish(book, task, loss=2.0)
    assert recorder.events("epoch_end") == []              # one eval of epoch 1 is still to run
    evaluation, train = sorted(scheduler.assign([0, 1]), key=lambda t: t.kind.value)
    assert (evaluation.kind.value, evaluation.epoch, train.kind.value, train.epoch) == ("eval", 1, "train", 2)
    finish(book, train)
    finish(book, evaluation, loss=3.0)
    [end] = recorder.events("epoch_end")
    assert end["epoch"] == 1 and end["metrics"] == {"train_loss": 1.0, "val_loss": 2.5}
    assert recorder.states["t0000", 1] == last and trial.state.get() != last   # the epoch's own state
    while book.live:
        for task in scheduler.assign([0, 1]):
            finish(book, task)
    assert [e["epoch"] for e in recorder.events("epoch_end")] == [1, 2, 3]
    assert [recorder.states["t0000", e][0] for e in (1, 2, 3)] == [1, 2, 3]
    assert [e["status"] for e in recorder.events("trial_ended")] == [TrialStatus.COMPLETED]


def test_a_searcher_that_needs_the_metrics_gets_them_before_the_next_epoch():
    book, scheduler, _, _ = trained_one_epoch(NeedsMetrics(build, {"lr": 0.01, "hidden": 8}, epochs=2,
                                                           metric="val_loss"))
    assert book.live["t0000"].epoch == 1 and not book.live["t0000"].evaluations
    evals = scheduler.assign([0, 1])
    assert sorted((t.kind.value, t.epoch) for t in evals) == [("eval", 1), ("eval", 1)]


def test_a_trial_that_diverges_while_its_last_epoch_is_evaluated_ends_after_that_epoch_is_reported():
    book, scheduler, recorder, _ = trained_one_epoch()
    train, evaluation = sorted(scheduler.assign([0, 1]), key=lambda t: t.kind.value != "train")
    finish(book, train, loss=math.nan)                      # epoch 2 diverges
    assert "t0000" in book.live and recorder.events("trial_ended") == []
    [last_eval] = scheduler.assign([0, 1])                  # it trains no further
    assert (last_eval.kind.value, last_eval.epoch) == ("eval", 1)
    finish(book, evaluation)
    finish(book, last_eval)
    assert [e["epoch"] for e in recorder.events("epoch_end")] == [1]
    [ended] = recorder.events("trial_ended")
    assert ended["status"] == TrialStatus.DIVERGED and "in epoch 2" in ended["reason"]
    assert book.live == {} and scheduler.unfinished() == []


def test_a_failed_eval_of_the_epoch_before_ends_the_trial_at_once():
    book, scheduler, recorder, _ = trained_one_epoch()
    evaluation = next(t for t in scheduler.assign([0, 1]) if t.kind.value == "eval")
    book.end(book.live["t0000"], TrialStatus.FAILED, "its eval crashed", evaluation.epoch)
    assert book.live == {} and scheduler.unfinished() == []
    assert [(e["status"], e["reason"]) for e in recorder.events("trial_ended")] == [
        (TrialStatus.FAILED, "its eval crashed")]
