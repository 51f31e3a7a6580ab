"""Telling a sub-epoch that hangs from one that is slow.

A trial whose ``forward`` never returns (a deadlock, a sleep, a stuck collective) would hold
its worker, and with it a partition every other trial needs, for ever. Workers send with each
heartbeat how many batches of the sub-epoch they run they have begun; the driver keeps, per
trial, the longest it has waited for one batch. The rule: a sub-epoch in which no batch began
for ``hang_after`` seconds, and for ``HANG_FACTOR`` times the longest wait its trial has had,
hangs. Its trial ends ``timeout`` with that reason, and its worker, which cannot be
interrupted inside a batch, is given up and replaced; the others train on. ``hang_after``
(default 300 s) covers a first batch that builds, loads or compiles a model; ``trial_timeout``
remains a hard limit on a whole sub-epoch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ._scheduler import Task

HANG_FACTOR = 10.0


@dataclass
class Running:
    """The sub-epoch a worker runs: the id its answer will carry, the task, when it was
    sent, the batches it has begun in it as its heartbeats last said (since when), and the
    peer it was told to fetch its state from (direct hops)."""

    task_id: int
    task: Task
    started: float
    batches: int = 0
    progressed: float | None = None      # when ``batches`` last changed (None: since started)
    fetch_from: int | None = None        # the worker whose outbox it fetches the state from


class HangWatch:
    """Per-trial waits for a batch, and which running sub-epochs hang (see the module)."""

    def __init__(self, hang_after: float | None) -> None:
        self.hang_after = hang_after
        self._longest: dict[str, float] = {}      # trial -> its longest wait for a batch, seconds

    def heard(self, running: Running, batches: int, now: float) -> None:
        """A heartbeat says ``running`` has begun ``batches`` batches."""
        if batches != running.batches:
            since = running.started if running.progressed is None else running.progressed
            trial = running.task.trial_id
            self._longest[trial] = max(self._longest.get(trial, 0.0), now - since)
            running.batches, running.progressed = batches, now

    def hangs(self, running: Running, now: float) -> str | None:
        """Why ``running`` hangs, or None while it may just be slow."""
        if self.hang_after is None:
            return None
        waited = now - (running.started if running.progressed is None else running.progressed)
        longest = self._longest.get(running.task.trial_id, 0.0)
        if waited <= max(self.hang_after, HANG_FACTOR * longest):
            return None
        task = running.task
        return (f"no batch of its {task.kind} sub-epoch of epoch {task.epoch} on partition {task.partition} began "
                f"for {waited:.0f} s (it had begun {running.batches}; hang_after={self.hang_after:g} s, and its "
                f"longest wait for a batch before was {longest:.1f} s): it hangs, and its worker was given up")
