"""A model of the network for ``scale.py``: where each trial's state is, and when each link
is free, with hops through the driver (hub) or from worker to worker (direct).

Time is the simulation's: one unit is a cost-1 trial's train sub-epoch. Every link is full
duplex and moves one state at a time, first come first served (a FIFO is what a shared link
gives in throughput; it ignores TCP's fairness between flows), at its own rate; a transfer
between two links goes at the slower one's.

- **hub** (the engine today): a train sub-epoch sends its new state to the driver (worker out,
  driver in), and the worker is free once it is sent; the driver sends it to the worker that
  trains or evaluates it next (driver out, worker in), unless that worker holds it already,
  and writes each epoch's checkpoint to the store (driver out).
- **direct** (issue 34): the state stays on the worker that trained it; the next worker gets
  it from there (that worker out, this one in) while the first trains on; each epoch's
  checkpoint is written by the worker that holds it (worker out). The driver moves no state.

A trial's first sub-epoch builds its model where it runs: nothing moves.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from cerebro.engine import TRAIN, Task


@dataclass
class Hops:
    """Links and state places of one simulated run (``worker_s``/``driver_s``: time units to
    move one state over a worker's link / the driver's link)."""

    direct: bool
    worker_s: float
    driver_s: float
    partitions: int
    holder: dict[str, int] = field(default_factory=dict)             # trial -> worker with its latest state
    at_driver: dict[str, float] = field(default_factory=dict)        # hub: trial -> when the driver has it
    # (trial, epoch) -> the worker holding the epoch's state, and when the driver has it (hub)
    epoch_holder: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    trained: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    out_free: dict[int, float] = field(default_factory=lambda: defaultdict(float))   # worker -> its out link
    in_free: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    copies: dict[tuple[str, int], dict[int, float]] = field(default_factory=dict)   # direct: who has an epoch's
    driver_out: float = 0.0
    driver_in: float = 0.0
    moved: int = 0                   # states moved between machines (checkpoints not counted)

    def ready(self, task: Task, now: float) -> float:
        """When the state ``task`` needs is on its worker, the transfer booked."""
        if task.kind == TRAIN:
            holder = self.holder.get(task.trial_id)
            since = self.at_driver.get(task.trial_id, 0.0)
        else:
            holder, since = self.epoch_holder[(task.trial_id, task.epoch)]
        if holder is None or holder == task.worker:
            return now
        self.moved += 1
        if self.direct and task.kind == TRAIN:    # the latest version: on its trainer only
            start = max(now, self.out_free[holder], self.in_free[task.worker])
            self.out_free[holder] = self.in_free[task.worker] = start + self.worker_s
            return start + self.worker_s
        if self.direct:
            return self._pull(task, holder, now)
        start = max(now, since, self.driver_out, self.in_free[task.worker])
        self.driver_out = self.in_free[task.worker] = start + max(self.driver_s, self.worker_s)
        return self.driver_out

    def _pull(self, task: Task, holder: int, now: float) -> float:
        """Direct, an eval visit: from whichever worker holding the epoch's state can send it
        first (the evals fan it out as a tree: each worker that has it can pass it on)."""
        copies = self.copies.setdefault((task.trial_id, task.epoch), {holder: now})
        source = min(copies, key=lambda w: (max(copies[w], self.out_free[w]), w))
        start = max(now, copies[source], self.out_free[source], self.in_free[task.worker])
        self.out_free[source] = self.in_free[task.worker] = arrived = start + self.worker_s
        copies[task.worker] = arrived
        return arrived

    def done(self, task: Task, end: float) -> float:
        """``task`` computed until ``end``: when its worker is free again (hub: its state sent)."""
        if task.kind != TRAIN:
            return end
        trial, worker = task.trial_id, task.worker
        self.holder[trial] = worker
        self.trained[(trial, task.epoch)] += 1
        epoch_ends = self.trained[(trial, task.epoch)] == self.partitions
        if self.direct:
            self.epoch_holder[(trial, task.epoch)] = (worker, end)
            if epoch_ends:       # the checkpoint, written from here while the worker trains on
                self.out_free[worker] = max(self.out_free[worker], end) + self.worker_s
            return end
        start = max(end, self.out_free[worker], self.driver_in)
        self.out_free[worker] = self.driver_in = sent = start + max(self.driver_s, self.worker_s)
        self.at_driver[trial] = sent
        self.epoch_holder[(trial, task.epoch)] = (worker, sent)     # others get it from the driver
        if epoch_ends:
            self.driver_out = max(self.driver_out, sent) + self.driver_s
        return sent
