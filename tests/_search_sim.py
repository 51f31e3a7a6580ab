"""A run without workers for searcher tests: the driver's own trial book (``TrialBook``) takes
a searcher's trials through their epochs, with a scheduler stand-in that lets one trial's epoch
run at a time, drawn from ``timing_seed`` (what timing does to a real run), so tests can check
that decisions never depend on that order. The trials are read back from the book's events
and checkpoints, as a run's journal and checkpoints tell them."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cerebro.engine import EVAL, TRAIN, Decision, Task
from cerebro.engine._settings import RunSettings
from cerebro.engine._trials import TrialBook
from cerebro.store import Decided, DecidedPaused, EpochEnd, Exploited, TrialCreated, TrialEnded, TrialStatus
from cerebro.worker import Sums


@dataclass
class SimTrial:
    trial_id: str
    config: dict
    max_epochs: int
    epoch: int = 0
    paused: bool = False
    status: str = "running"       # then the TrialStatus it ended with
    values: list[float] = field(default_factory=list)     # the objective after each epoch
    exploits: list[tuple[int, str, dict]] = field(default_factory=list)   # (epoch, source, new config)


class QuietRecorder:
    """A recorder for a TrialBook that keeps nothing: subclasses keep what they test."""

    path = "memory"

    def emit(self, event) -> None:
        pass

    def write_checkpoint(self, trial_id, state, epoch, exploit=False, best=False) -> None:
        pass

    def remove_checkpoints(self, trial_id, keep=()) -> None:
        pass

    def write_config(self, trial_id, config) -> None:
        pass

    def write_error(self, trial_id, error) -> None:
        pass

    def now(self) -> float:
        return 0.0


class Recorder(QuietRecorder):
    """The book's recorder: keeps each trial as its events and checkpoints tell it."""

    def __init__(self) -> None:
        self.trials: dict[str, SimTrial] = {}

    def emit(self, event) -> None:
        if isinstance(event, TrialCreated):
            self.trials[event.trial_id] = SimTrial(event.trial_id, dict(event.config), event.max_epochs)
        elif isinstance(event, EpochEnd):
            self.trials[event.trial_id].epoch = event.epoch
        elif isinstance(event, Decided):
            self.trials[event.trial_id].paused = event.decision == Decision.PAUSE.value
        elif isinstance(event, DecidedPaused):
            for trial_id in event.decisions:
                self.trials[trial_id].paused = False
        elif isinstance(event, Exploited):
            trial = self.trials[event.trial_id]
            trial.config = dict(event.config)
            trial.exploits.append((event.epoch, event.source, dict(event.config)))
        elif isinstance(event, TrialEnded):
            self.trials[event.trial_id].status = event.status

    def write_checkpoint(self, trial_id, state, epoch, exploit=False, best=False) -> None:
        self.trials[trial_id].values = list(state.get())      # an exploit's: the source's values


class Timing:
    """The scheduler as the book uses it: an epoch is one train and one eval sub-epoch, and
    which trial's epoch runs next is drawn from ``timing_seed`` among those due."""

    def __init__(self, timing_seed: int) -> None:
        self.rng = np.random.default_rng(timing_seed)
        self.due: set[str] = set()

    def start_epoch(self, trial_id: str, epoch: int, order: list[int], overlap_evals: bool = False,
                    then: int | None = None) -> None:
        self.due.add(trial_id)

    def may_start_next(self, trial_id: str) -> bool:
        return False        # each epoch ends with its eval: no overlap to model here

    def remove(self, trial_id: str) -> None:
        self.due.discard(trial_id)

    def complete(self, task: Task) -> bool:
        return task.kind == EVAL

    def next(self) -> str:
        trial_id = sorted(self.due)[int(self.rng.integers(len(self.due)))]
        self.due.remove(trial_id)
        return trial_id


def no_build(config: dict) -> None:
    """The build of a simulated searcher: its trials are never built (the constructor needs
    a function)."""


def epoch_sums(metric: str, value: float) -> dict:
    """Train and eval sums whose means (``mean_metrics``) are ``{metric: value}`` exactly, with,
    for a metric that is not a loss, its split's loss too (0.0): the book always has one."""
    split, _, name = metric.partition("_")
    if split not in ("train", "val") or not name:
        raise ValueError(f"metric {metric!r} is none the book reports: train_* or val_*")
    sums = Sums(1, value, {}) if name == "loss" else Sums(1, 0.0, {name: value})
    none = Sums(0, 0.0, {})        # no rows: no metrics for the other split
    return {TRAIN: sums if split == "train" else none, EVAL: sums if split == "val" else none}


def simulate(searcher, objective: Callable[[dict, int, list[float]], float], *, seed: int = 0,
             timing_seed: int = 0, fail: Callable[[dict], bool] = lambda config: False) -> dict[str, SimTrial]:
    """Run ``searcher`` to the end. ``objective(config, epoch, values so far)`` is the metric a
    trial reports after ``epoch``; trials whose config ``fail`` marks end as failed at epoch 1."""
    recorder, scheduler = Recorder(), Timing(timing_seed)
    book = TrialBook(searcher, scheduler, RunSettings(seed=seed, num_partitions=1, evaluate=True), recorder)
    searcher.start(seed)
    book.add_trials()
    while book.live:                    # the driver's loop, one epoch a step
        book.check_not_stuck(running=False)
        trial = book.live[scheduler.next()]
        if fail(trial.config):
            book.end(trial, TrialStatus.FAILED, "failed as the test asked")
        else:
            # The trial's state is its values so far, so that an exploit copies the source's.
            before = () if trial.state is None else trial.state.get()
            values = (*before, objective(trial.config, trial.epoch, list(before)))
            for kind, sums in epoch_sums(searcher.metric, values[-1]).items():
                book.sub_epoch_done(Task(trial.trial_id, kind, trial.epoch, 0, 0), 0, sums, values)
        book.apply_decisions()
        book.add_trials()
    return recorder.trials


def outcome(trials: dict[str, SimTrial]) -> list[tuple]:
    """What a run decided, comparable across timings."""
    return [(t.trial_id, t.config, t.status, t.epoch, t.values, t.exploits) for t in trials.values()]


def expected_asha(penalties: list[float], rung_epochs: list[int], eta: float, max_epochs: int,
                  strict: bool = False) -> list[int]:
    """Reference ASHA with trials arriving in id order: the epoch each trial ends at. The top
    ``ceil(n / eta)`` at a rung go on; ``strict``: the top ``floor(n / eta)``, at least one."""
    ended_at, reached = [], [dict() for _ in rung_epochs]
    for index, value in enumerate(penalties):
        epoch = max_epochs
        for rung, rung_epoch in enumerate(rung_epochs):
            reached[rung][index] = value
            better = sorted(reached[rung].items(), key=lambda item: (item[1], item[0]))
            rank = [i for i, _ in better].index(index)
            if not rank < (max(1, math.floor(len(better) / eta)) if strict else len(better) / eta):
                epoch = rung_epoch
                break
        ended_at.append(epoch)
    return ended_at
