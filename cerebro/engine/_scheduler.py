"""The MOP scheduler: pure, deterministic logic that says which sub-epoch runs where next.

It enforces invariant 1 of DESIGN.md: in every epoch a live trial trains on each partition
exactly once, in the order it was given (its visit order, from the seed, never from timing);
a worker runs one sub-epoch at a time; a trial trains on one worker at a time. After its
training sub-epochs, a trial is evaluated on every partition where that partition lies;
these eval visits may run on several workers at once, as the weights do not change.

A trial started with ``overlap_evals`` (its searcher goes on whatever the metrics) may begin
its next epoch as soon as its training ends, its eval visits running alongside on the state
that training left; they rank as the last steps of the next epoch. Without that, each epoch
ends with a flood of every trial's evals at once (trials paced by the slowest one end their
epochs together), and the slowest trials wait in it: 5-7 % of the makespan with two trials
per worker and 10x cost spread (``benchmarks/scale.py``). A trial has at most one earlier
epoch's evals running; the epoch after waits for them.

An idle worker takes, of the steps waiting on its partitions, the one of the trial furthest
behind (oldest epoch, then fewest steps, then creation order), so trials progress evenly.
A partition is also *held* for a trial of an older epoch that is training elsewhere and
visits it next, in this epoch or (``then``) as the first of the next: a trial of a later
epoch does not start there meanwhile, as the older one would then wait for it on arrival
(trials that finished their epoch early follow the next epoch's ring and would otherwise
cut across the slow ones still in theirs). An eval visit is never held: it changes no
state, and a worker that held it would idle for the older trial's arrival. Which waiting
trial goes first changes when things run, never what they compute. Each partition keeps its
waiting train steps and eval visits in a heap each, ordered so that where its first train
step is held all the rest are too, so a decision looks at two heap tops per partition of
the worker: O(log n) whatever the number of trials and workers (``benchmarks/scale.py``
measures both). It does no I/O and keeps no clocks.
"""
from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..store import SubEpochStarted, TaskKind

TRAIN = TaskKind.TRAIN
EVAL = TaskKind.EVAL


@dataclass(frozen=True)
class Task:
    """One sub-epoch: ``trial_id`` trains on or evaluates ``partition`` on ``worker``."""

    trial_id: str
    kind: TaskKind
    epoch: int
    partition: int
    worker: int

    def told(self, event: type[SubEpochStarted]) -> SubEpochStarted:
        """The observers' event that this sub-epoch started on its worker, or was aborted there."""
        return event(self.trial_id, self.epoch, self.partition, self.worker, self.kind)


@dataclass(eq=False)
class _Epoch:
    trial_id: str
    number: int
    order: list[int]
    trained: int = 0
    training: bool = False
    eval_todo: set[int] = field(default_factory=set)
    evaluating: set[int] = field(default_factory=set)
    overlap_evals: bool = False    # the next epoch may start while these evals run
    then: int | None = None        # the partition the next epoch starts on, if known
    dropped: bool = False          # the trial was removed

    def trained_all(self) -> bool:
        return self.trained == len(self.order) and not self.training

    def heading(self) -> int | None:
        """The partition the trial trains on after its current step, if known."""
        return self.order[self.trained + 1] if self.trained + 1 < len(self.order) else self.then

    def finished(self) -> bool:
        return self.trained_all() and not self.eval_todo and not self.evaluating

    def waits_on(self, partition: int) -> TaskKind | None:
        """The kind of step that could start on ``partition`` now, if any."""
        if self.trained < len(self.order):
            return TRAIN if not self.training and self.order[self.trained] == partition else None
        return EVAL if partition in self.eval_todo else None


# A waiting step in one of a partition's heaps: (epoch, steps trained, trial id, push count, kind,
# partition, state); the trial furthest behind comes first. Overlapping eval visits rank as
# the last steps of the next epoch. Entries are never removed in place: one whose trial
# moved on is dropped when it surfaces.
_Entry = tuple[int, int, str, int, TaskKind, int, _Epoch]


class MOPScheduler:
    """Plans sub-epochs for live trials over workers that each hold fixed partitions.

    Args:
        worker_partitions: worker -> the partitions it holds; each partition on one worker.
        evaluate: whether every epoch ends with an eval visit to each partition.

    Example:
        >>> scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=False)
        >>> scheduler.start_epoch("t0000", 1, [1, 0])
        >>> scheduler.assign([0, 1])
        [Task(trial_id='t0000', kind=<TaskKind.TRAIN: 'train'>, epoch=1, partition=1, worker=1)]
    """

    def __init__(self, worker_partitions: Mapping[int, Iterable[int]], evaluate: bool = True) -> None:
        """Raises unless each of the partitions 0..P-1 is held by exactly one worker."""
        self._owner: dict[int, int] = {}
        for worker, partitions in worker_partitions.items():
            for partition in partitions:
                if partition in self._owner:
                    raise ValueError(f"partition {partition} is held by workers "
                                     f"{self._owner[partition]} and {worker}; it must be held by one")
                self._owner[partition] = worker
        if not self._owner:
            raise ValueError("workers hold no partitions; at least one partition is needed")
        if sorted(self._owner) != list(range(len(self._owner))):
            raise ValueError(f"partitions {sorted(self._owner)} must be 0..{len(self._owner) - 1}")
        self.num_partitions = len(self._owner)
        self._evaluate = evaluate
        self._epochs: dict[str, _Epoch] = {}             # trial -> the epoch it trains in
        self._evaluating: dict[str, list[_Epoch]] = {}   # trial -> earlier epochs whose evals run
        self._partitions: dict[int, set[int]] = {}       # worker -> the partitions it holds
        for partition, worker in self._owner.items():
            self._partitions.setdefault(worker, set()).add(partition)
        self._waiting: dict[tuple[int, TaskKind], list[_Entry]] = {  # (partition, kind) -> heap
            (partition, kind): [] for partition in self._owner for kind in (TRAIN, EVAL)}
        self._queued: Counter[int] = Counter()           # worker -> entries in its partitions' heaps
        self._pushes = 0
        self._held_for: dict[int, dict[str, int]] = {}   # partition -> {training trial visiting it next: epoch}

    def start_epoch(self, trial_id: str, epoch: int, order: list[int], overlap_evals: bool = False,
                    then: int | None = None) -> None:
        """Schedule ``trial_id``'s next epoch, training on partitions in ``order``.

        With ``overlap_evals`` the epoch after this one may start once this one's training
        ends, while its eval visits still run (they read the state the training ended with).
        ``then``: the partition the trial's next epoch starts on, if it has one.
        """
        if sorted(order) != list(range(self.num_partitions)):
            raise ValueError(f"order {order} must visit each of the {self.num_partitions} partitions once")
        current = self._epochs.get(trial_id)
        if current is not None and not current.finished():
            if not (current.overlap_evals and current.trained_all()):
                raise ValueError(f"{trial_id} is still in epoch {current.number}")
            self._evaluating.setdefault(trial_id, []).append(current)
        state = _Epoch(trial_id, epoch, list(order), overlap_evals=overlap_evals, then=then)
        self._epochs[trial_id] = state
        self._push(state, TRAIN, state.order[0])

    def remove(self, trial_id: str) -> None:
        """Forget a trial (stopped, failed or done); its running sub-epochs are ignored."""
        self.stop_training(trial_id)
        for state in self._evaluating.pop(trial_id, ()):
            state.dropped = True

    def stop_training(self, trial_id: str) -> None:
        """``trial_id`` trains no further; the eval visits of its earlier epochs still run."""
        state = self._epochs.pop(trial_id, None)
        if state is not None:
            state.dropped = True
            if state.training:
                self._release(state)

    def unfinished(self) -> list[str]:
        """The trials whose epoch has sub-epochs left to run or running."""
        return sorted({trial_id for trial_id, state in self._epochs.items() if not state.finished()}
                      | set(self._evaluating))

    def may_start_next(self, trial_id: str) -> bool:
        """Whether ``trial_id``'s next epoch may start: its current one has finished, or has
        finished training with its evals overlapping and no earlier epoch's evals still running."""
        state = self._epochs.get(trial_id)
        if state is None or not state.trained_all():
            return False
        return state.finished() or (state.overlap_evals and trial_id not in self._evaluating)

    def partitions_of(self, worker: int) -> list[int]:
        return sorted(self._partitions.get(worker, ()))

    def move(self, partition: int, worker: int) -> None:
        """``worker`` now holds ``partition`` (its holder was lost, or workers restarted)."""
        if partition not in self._owner:
            raise ValueError(f"partition {partition} is not one of 0..{self.num_partitions - 1}")
        previous = self._owner[partition]
        if previous == worker:
            return
        self._owner[partition] = worker       # its waiting steps go with it
        n = len(self._waiting[partition, TRAIN]) + len(self._waiting[partition, EVAL])
        self._queued[previous] -= n
        self._queued[worker] += n
        self._partitions[previous].discard(partition)
        self._partitions.setdefault(worker, set()).add(partition)

    def assign(self, idle_workers: Iterable[int]) -> list[Task]:
        """Sub-epochs to start now on ``idle_workers``, at most one per worker."""
        tasks = []
        for worker in sorted(w for w in idle_workers if self._queued[w]):
            task = self._pop(worker)
            if task is not None:
                tasks.append(task)
        return tasks

    def complete(self, task: Task) -> bool:
        """Record that ``task`` finished; True when it was the last sub-epoch of its trial's epoch."""
        state = self._state_of(task)
        if state is None:
            return False
        if task.kind == TRAIN:
            self._release(state)
            state.training = False
            state.trained += 1
            if state.trained < len(state.order):
                self._push(state, TRAIN, state.order[state.trained])
            elif self._evaluate:
                state.eval_todo = set(range(self.num_partitions))
                for partition in range(self.num_partitions):
                    self._push(state, EVAL, partition)
        else:
            state.evaluating.discard(task.partition)
            if state.finished() and state is not self._epochs.get(task.trial_id):
                earlier = self._evaluating[task.trial_id]
                earlier.remove(state)
                if not earlier:
                    del self._evaluating[task.trial_id]
        return state.finished()

    def last_visit(self, task: Task) -> bool:
        """Whether ``task`` is the last train sub-epoch of its trial's epoch."""
        state = self._state_of(task)
        return task.kind == TRAIN and state is not None and state.order[-1] == task.partition

    def rewind(self, trial_id: str, trained: int) -> list[int]:
        """``trial_id``, not training now, goes back to having trained the first ``trained``
        partitions of its epoch (the state after the later ones was lost); returns those
        later partitions, which it trains again, in its order."""
        state = self._epochs[trial_id]
        if state.training or not 0 <= trained <= state.trained:
            raise ValueError(f"{trial_id} cannot go back to {trained} of its {state.trained} sub-epochs "
                             f"trained{' while training' if state.training else ''}")
        again = state.order[trained:state.trained]
        if again:       # the step waiting now is dropped when it surfaces (waits_on)
            state.trained = trained
            self._push(state, TRAIN, state.order[trained])
        return again

    def abort(self, task: Task) -> None:
        """``task`` will not finish (its worker was lost): it is to be assigned again."""
        state = self._state_of(task)
        if state is None:
            return
        if task.kind == TRAIN:
            if state.training:
                self._release(state)
                state.training = False
                self._push(state, TRAIN, task.partition)
        elif task.partition in state.evaluating:
            state.evaluating.discard(task.partition)
            state.eval_todo.add(task.partition)
            self._push(state, EVAL, task.partition)

    def _state_of(self, task: Task) -> _Epoch | None:
        """The epoch ``task`` belongs to, if its trial is still in it."""
        current = self._epochs.get(task.trial_id)
        if current is not None and current.number == task.epoch:
            return current
        return next((s for s in self._evaluating.get(task.trial_id, ()) if s.number == task.epoch), None)

    def _push(self, state: _Epoch, kind: TaskKind, partition: int) -> None:
        self._pushes += 1
        epoch = state.number + (kind == EVAL and state.overlap_evals)
        entry = (epoch, state.trained, state.trial_id, self._pushes, kind, partition, state)
        heapq.heappush(self._waiting[partition, kind], entry)
        self._queued[self._owner[partition]] += 1

    def _first(self, partition: int, kind: TaskKind) -> _Entry | None:
        """The first step of ``kind`` waiting on ``partition`` that may start now, if any."""
        heap = self._waiting[partition, kind]
        while heap:
            epoch, _, _, _, _, _, state = heap[0]
            if state.dropped or state.waits_on(partition) != kind:
                heapq.heappop(heap)                # the trial ended, or moved on meanwhile
                self._queued[self._owner[partition]] -= 1
                continue
            holders = self._held_for.get(partition)
            if kind == TRAIN and holders and min(holders.values()) < epoch:
                return None      # kept for an older trial on its way here; all behind it too
            return heap[0]
        return None

    def _pop(self, worker: int) -> Task | None:
        """The first waiting step of ``worker`` that may start now, marked started."""
        firsts = [entry for partition in self._partitions[worker] for kind in (TRAIN, EVAL)
                  if (entry := self._first(partition, kind))]
        if not firsts:
            return None
        epoch, _, trial_id, _, kind, partition, state = min(firsts)
        heapq.heappop(self._waiting[partition, kind])
        self._queued[worker] -= 1
        if kind == TRAIN:
            state.training = True
            heading = state.heading()
            if heading is not None:
                self._held_for.setdefault(heading, {})[trial_id] = epoch
        else:
            state.eval_todo.discard(partition)
            state.evaluating.add(partition)
        return Task(trial_id, kind, state.number, partition, worker)

    def _release(self, state: _Epoch) -> None:
        """``state``'s train sub-epoch ended: the partition it visits next is no longer held."""
        heading = state.heading()
        if heading is not None:
            holders = self._held_for[heading]
            del holders[state.trial_id]
            if not holders:
                del self._held_for[heading]
