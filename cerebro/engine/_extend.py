"""Extending a run: ``resume(run_dir, epochs=N)`` trains a grid, random or PBT run on to
``N`` epochs, and the result is bitwise the run that had ``epochs=N`` from the start.

That holds because such a searcher decides nothing by its epoch budget except at a trial's
last epoch, where the trial completed (``Searcher.extend`` refuses the others). So resume
reads the journal as the longer run would have written it (:func:`as_extended`): every
trial created for ``N`` epochs, and each trial the ``run_extended`` line reopens without
its decision and end at its old last epoch. Replay then asks the extended searcher there
afresh, and the trial goes on from its checkpoint of that epoch.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..store import Decided, EpochEnd, Event, Ledger, RunExtended, TrialCreated, TrialEnded, TrialStatus
from ._interface import SearchPolicy


def extension(policy: SearchPolicy, events: list[Event], epochs: int) -> RunExtended | None:
    """The line that extends the run of ``events`` (parsed) to ``epochs``: it reopens the
    trials that completed. Checks first that ``policy`` can be extended to ``epochs`` (it
    raises, saying why, where not); None where ``epochs`` is the run's budget already."""
    extend = getattr(policy, "extend", None)
    if extend is None:
        raise ValueError(f"{type(policy).__name__} has no extend(epochs): only searchers that say how to "
                         f"train longer can be extended")
    before = getattr(policy, "epochs", None)
    for event in events:
        if isinstance(event, RunExtended):
            extend(event.epochs)
            before = event.epochs
    extend(epochs)
    if epochs == before:
        return None
    # Completed trials, and live ones at the old last epoch (the driver died between that
    # epoch's decision and the trial's end): the longer run decides anew there.
    facts = Ledger().fold(as_extended(events)).trials
    return RunExtended(epochs, [t for t, trial in facts.items() if trial.status is TrialStatus.COMPLETED
                                or (trial.status is None and trial.epoch == before)], 0.0)


def as_extended(events: list[Any]) -> list[Any]:
    """``events`` (parsed) as the run with the latest ``run_extended`` budget would have
    journaled them up to where this one is: each ``trial_created`` with that budget, and
    without the last ``decision`` and the ``trial_ended`` of each trial a ``run_extended``
    reopened. ``events`` without such a line are returned as they are. One pass: journals
    of thousands of trials are read this way at every resume."""
    budget = next((e.epochs for e in reversed(events) if isinstance(e, RunExtended)), None)
    if budget is None:
        return events
    dropped: set[int] = set()
    epoch: dict[str, int] = {}
    decided: dict[tuple[str, int], int] = {}
    ends: dict[str, tuple[int, int | None]] = {}     # trial -> its latest end, and its decision there
    for index, event in enumerate(events):
        match event:
            case EpochEnd():
                epoch[event.trial_id] = event.epoch
            case Decided():
                decided[event.trial_id, event.epoch] = index
            case TrialEnded():
                ends[event.trial_id] = (index, decided.get((event.trial_id, epoch.get(event.trial_id, 0))))
            case RunExtended():
                for trial_id in event.trials:       # ended: its end and last decision; live: that decision
                    end = ends.pop(trial_id, None) or (None, decided.get((trial_id, epoch.get(trial_id, 0))))
                    dropped.update(i for i in end if i is not None)
    return [dataclasses.replace(e, max_epochs=budget) if isinstance(e, TrialCreated) else e
            for i, e in enumerate(events) if i not in dropped]
