"""The MOP scheduler: pure, deterministic logic that says which sub-epoch runs where next.

It enforces invariant 1 of DESIGN.md: in every epoch a live trial trains on each partition
exactly once, in the order it was given (which comes from the seed, never from timing); a
worker runs one sub-epoch at a time; a trial trains on one worker at a time. After its
training sub-epochs, a trial is evaluated on every partition where that partition lies;
these eval visits may run on several workers at once, as the weights do not change.

Idle workers are filled greedily with the trial that is furthest behind and can use them,
so workers stay busy while trials progress evenly. It does no I/O and keeps no clocks.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TRAIN = "train"
EVAL = "eval"


@dataclass(frozen=True)
class Task:
    """One sub-epoch: ``trial_id`` trains on or evaluates ``partition`` on ``worker``."""

    trial_id: str
    kind: str
    epoch: int
    partition: int
    worker: int


@dataclass
class _Epoch:
    number: int
    order: list[int]
    trained: int = 0
    training: bool = False
    eval_todo: set[int] = field(default_factory=set)
    evaluating: set[int] = field(default_factory=set)

    def steps_done(self, evaluate: bool) -> int:
        """Train and eval visits started; evals count only once training is over."""
        if self.trained < len(self.order) or not evaluate:
            return self.trained
        return self.trained + len(self.order) - len(self.eval_todo) - len(self.evaluating)

    def finished(self) -> bool:
        return (self.trained == len(self.order) and not self.training
                and not self.eval_todo and not self.evaluating)


class MOPScheduler:
    """Plans sub-epochs for live trials over workers that each hold fixed partitions.

    Args:
        worker_partitions: worker -> the partitions it holds; each partition on one worker.
        evaluate: whether every epoch ends with an eval visit to each partition.
    """

    def __init__(self, worker_partitions: Mapping[int, Iterable[int]], evaluate: bool = True) -> None:
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
        self._epochs: dict[str, _Epoch] = {}

    def start_epoch(self, trial_id: str, epoch: int, order: list[int]) -> None:
        """Schedule ``trial_id``'s next epoch, training on partitions in ``order``."""
        if sorted(order) != list(range(self.num_partitions)):
            raise ValueError(f"order {order} must visit each of the {self.num_partitions} partitions once")
        current = self._epochs.get(trial_id)
        if current is not None and not current.finished():
            raise ValueError(f"{trial_id} is still in epoch {current.number}")
        self._epochs[trial_id] = _Epoch(epoch, list(order))

    def remove(self, trial_id: str) -> None:
        """Forget a trial (stopped, failed or done); its running sub-epochs are ignored."""
        self._epochs.pop(trial_id, None)

    def partitions_of(self, worker: int) -> list[int]:
        return sorted(p for p, owner in self._owner.items() if owner == worker)

    def move(self, partition: int, worker: int) -> None:
        """``worker`` now holds ``partition`` (its holder was lost, or workers restarted)."""
        if partition not in self._owner:
            raise ValueError(f"partition {partition} is not one of 0..{self.num_partitions - 1}")
        self._owner[partition] = worker

    def is_live(self, trial_id: str) -> bool:
        return trial_id in self._epochs

    def assign(self, idle_workers: Iterable[int]) -> list[Task]:
        """Sub-epochs to start now on ``idle_workers``, at most one per worker."""
        tasks = []
        for worker in sorted(idle_workers):
            task = self._pick(worker)
            if task is not None:
                self._mark_started(task)
                tasks.append(task)
        return tasks

    def complete(self, task: Task) -> bool:
        """Record that ``task`` finished; True when it was the last sub-epoch of its trial's epoch."""
        state = self._epochs.get(task.trial_id)
        if state is None or state.number != task.epoch:
            return False
        if task.kind == TRAIN:
            state.training = False
            state.trained += 1
            if state.trained == len(state.order) and self._evaluate:
                state.eval_todo = set(range(self.num_partitions))
        else:
            state.evaluating.discard(task.partition)
        return state.finished()

    def abort(self, task: Task) -> None:
        """``task`` will not finish (its worker was lost): it is to be assigned again."""
        state = self._epochs.get(task.trial_id)
        if state is None or state.number != task.epoch:
            return
        if task.kind == TRAIN:
            state.training = False
        elif task.partition in state.evaluating:
            state.evaluating.discard(task.partition)
            state.eval_todo.add(task.partition)

    def _pick(self, worker: int) -> Task | None:
        best: tuple[tuple[int, int, str], Task] | None = None
        for trial_id, state in self._epochs.items():
            task = self._next_for(trial_id, state, worker)
            if task is not None:
                key = (state.number, state.steps_done(self._evaluate), trial_id)
                if best is None or key < best[0]:
                    best = (key, task)
        return None if best is None else best[1]

    def _next_for(self, trial_id: str, state: _Epoch, worker: int) -> Task | None:
        if state.trained < len(state.order):
            partition = state.order[state.trained]
            if not state.training and self._owner[partition] == worker:
                return Task(trial_id, TRAIN, state.number, partition, worker)
            return None
        for partition in sorted(state.eval_todo):
            if self._owner[partition] == worker:
                return Task(trial_id, EVAL, state.number, partition, worker)
        return None

    def _mark_started(self, task: Task) -> None:
        state = self._epochs[task.trial_id]
        if task.kind == TRAIN:
            state.training = True
        else:
            state.eval_todo.discard(task.partition)
            state.evaluating.add(task.partition)
