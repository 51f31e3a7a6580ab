"""A driver stand-in for searcher tests: it runs a searcher's decisions without workers,
advancing live trials one epoch at a time in an order drawn from ``timing_seed`` (what
timing does to a real run), so tests can check that decisions never depend on that order."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cerebro.engine import Decision, Exploit


@dataclass
class SimTrial:
    trial_id: str
    config: dict
    max_epochs: int
    epoch: int = 0
    paused: bool = False
    status: str = "running"
    values: list[float] = field(default_factory=list)     # the objective after each epoch
    exploits: list[tuple[int, str, dict]] = field(default_factory=list)   # (epoch, source, new config)


def simulate(searcher, objective: Callable[[dict, int, list[float]], float], *, seed: int = 0,
             timing_seed: int = 0, fail: Callable[[dict], bool] = lambda config: False) -> dict[str, SimTrial]:
    """Run ``searcher`` to the end. ``objective(config, epoch, values so far)`` is the metric a
    trial reports after ``epoch``; trials whose config ``fail`` marks end as failed at epoch 1."""
    timing = np.random.default_rng(timing_seed)
    searcher.start(seed)
    trials: dict[str, SimTrial] = {}

    def end(trial: SimTrial, status: str) -> None:
        trial.status = status
        searcher.trial_ended(trial.trial_id, status)

    def go_on(trial: SimTrial, decision) -> None:
        if decision is Decision.STOP:
            end(trial, "stopped" if trial.epoch < trial.max_epochs else "completed")
        elif trial.epoch >= trial.max_epochs:
            end(trial, "completed")

    while True:
        for request in searcher.suggest():
            trial_id = f"t{len(trials):04d}"
            trials[trial_id] = SimTrial(trial_id, dict(request.config), request.max_epochs)
        decisions = searcher.decide()
        for trial_id, decision in sorted(decisions.items(), key=lambda item: not isinstance(item[1], Exploit)):
            trial = trials[trial_id]
            assert trial.paused and trial.status == "running", (trial_id, decision)
            if isinstance(decision, Exploit):
                source = trials[decision.source]
                assert source.paused and source.epoch == trial.epoch
                trial.config = dict(decision.config)
                trial.values = list(source.values)
                trial.exploits.append((trial.epoch, source.trial_id, dict(decision.config)))
                decision = Decision.CONTINUE
            trial.paused = False
            go_on(trial, decision)
        runnable = [t for t in trials.values() if t.status == "running" and not t.paused]
        if not runnable:
            if decisions:
                continue
            live = [t.trial_id for t in trials.values() if t.status == "running"]
            assert not live, f"stuck: {live} paused and never decided"
            return trials       # nothing changed since suggest() returned no trial
        trial = runnable[int(timing.integers(len(runnable)))]
        if fail(trial.config):
            end(trial, "failed")
            continue
        trial.epoch += 1
        trial.values.append(objective(trial.config, trial.epoch, trial.values))
        decision = searcher.report(trial.trial_id, trial.epoch, {searcher.metric: trial.values[-1]})
        if decision is Decision.PAUSE:
            trial.paused = True
        else:
            go_on(trial, decision)


def outcome(trials: dict[str, SimTrial]) -> list[tuple]:
    """What a run decided, comparable across timings."""
    return [(t.trial_id, t.config, t.status, t.epoch, t.values, t.exploits) for t in trials.values()]


def expected_asha(penalties: list[float], rung_epochs: list[int], eta: float, max_epochs: int) -> list[int]:
    """Reference ASHA with trials arriving in id order: the epoch each trial ends at."""
    ended_at, reached = [], [dict() for _ in rung_epochs]
    for index, value in enumerate(penalties):
        epoch = max_epochs
        for rung, rung_epoch in enumerate(rung_epochs):
            reached[rung][index] = value
            better = sorted(reached[rung].items(), key=lambda item: (item[1], item[0]))
            rank = [i for i, _ in better].index(index)
            if not rank < len(better) / eta:
                epoch = rung_epoch
                break
        ended_at.append(epoch)
    return ended_at
