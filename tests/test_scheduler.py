"""Tests of the pure MOP scheduler (cerebro/engine/_scheduler.py), invariant 1 of DESIGN.md.

Plain unit tests pin the constructor/start_epoch errors and the simple walk-throughs. The
property-based tests drive the scheduler with a small discrete-event simulator that behaves
like the real driver (cerebro/engine/_driver.py): trials arrive, ``assign`` is called with the
idle workers, ``complete`` when a sub-epoch's simulated end time arrives, ``start_epoch`` with
``visit_order`` when an epoch ends and the trial has more epochs, ``remove`` when a trial ends
(completed, stopped by the searcher, failed in a sub-epoch, or killed at an arbitrary time).
Every ``assign`` answer is checked against an independent reference model of the trials, and
the whole schedule it produces is then checked against invariant 1.
"""
from __future__ import annotations

import functools
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cerebro.engine import visit_order
from cerebro.engine._scheduler import EVAL, TRAIN, MOPScheduler, Task, _Epoch

# --------------------------------------------------------------------------------------------
# plain unit tests
# --------------------------------------------------------------------------------------------


def test_partition_held_by_two_workers_is_rejected():
    msg = "partition 1 is held by workers 0 and 2; it must be held by one"
    with pytest.raises(ValueError, match=re.escape(msg)):
        MOPScheduler({0: [0, 1], 1: [2], 2: [1]})


def test_partition_listed_twice_by_one_worker_is_rejected():
    msg = "partition 0 is held by workers 0 and 0; it must be held by one"
    with pytest.raises(ValueError, match=re.escape(msg)):
        MOPScheduler({0: [0, 0], 1: [1]})


@pytest.mark.parametrize("layout, msg", [
    ({0: [0, 2]}, "partitions [0, 2] must be 0..1"),
    ({0: [1], 1: [2]}, "partitions [1, 2] must be 0..1"),
    ({0: [3, 0], 1: [1]}, "partitions [0, 1, 3] must be 0..2"),
    ({0: [-1, 0]}, "partitions [-1, 0] must be 0..1"),
])
def test_partitions_must_be_zero_to_p_minus_one(layout, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        MOPScheduler(layout)


@pytest.mark.parametrize("order", [[0, 0, 1], [0, 1], [0, 1, 2, 2], [0, 1, 3], [2, 1, 0, 3], []])
def test_order_must_be_a_permutation(order):
    scheduler = MOPScheduler({0: [0, 2], 1: [1]})
    msg = f"order {order} must visit each of the 3 partitions once"
    with pytest.raises(ValueError, match=re.escape(msg)):
        scheduler.start_epoch("t0000", 1, order)
    assert scheduler.assign([0, 1]) == []          # the trial was not added


def test_start_epoch_while_previous_epoch_unfinished_is_rejected():
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=True)
    scheduler.start_epoch("t0003", 1, [1, 0])
    msg = "t0003 is still in epoch 1"
    with pytest.raises(ValueError, match=re.escape(msg)):          # nothing run yet
        scheduler.start_epoch("t0003", 2, [0, 1])
    [task] = scheduler.assign([0, 1])
    assert task == Task("t0003", TRAIN, 1, 1, 1)
    with pytest.raises(ValueError, match=re.escape(msg)):          # a train sub-epoch running
        scheduler.start_epoch("t0003", 2, [0, 1])
    assert scheduler.complete(task) is False
    [task] = scheduler.assign([0, 1])
    assert scheduler.complete(task) is False                       # training done, evals to do
    with pytest.raises(ValueError, match=re.escape(msg)):
        scheduler.start_epoch("t0003", 2, [0, 1])
    evals = scheduler.assign([0, 1])
    assert sorted(evals, key=lambda t: t.partition) == [Task("t0003", EVAL, 1, 0, 0),
                                                        Task("t0003", EVAL, 1, 1, 1)]
    assert scheduler.complete(evals[0]) is False
    with pytest.raises(ValueError, match=re.escape(msg)):          # one eval still running
        scheduler.start_epoch("t0003", 2, [0, 1])
    assert scheduler.complete(evals[1]) is True
    scheduler.start_epoch("t0003", 2, [0, 1])                      # now allowed
    assert scheduler.assign([0, 1]) == [Task("t0003", TRAIN, 2, 0, 0)]


def test_removed_trial_late_complete_returns_false():
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=True)
    scheduler.start_epoch("t0000", 1, [0, 1])
    scheduler.start_epoch("t0001", 1, [0, 1])
    [task] = scheduler.assign([0])
    assert task.trial_id == "t0000" and task.kind == TRAIN
    scheduler.remove("t0000")
    assert scheduler.complete(task) is False
    # the removed trial never comes back, and the worker goes to the other trial
    assert scheduler.assign([0, 1]) == [Task("t0001", TRAIN, 1, 0, 0)]
    scheduler.remove("t0000")                                      # removing twice is harmless


def test_removed_trial_late_eval_completes_return_false():
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=True)
    scheduler.start_epoch("t0000", 1, [1, 0])
    for _ in range(2):
        [task] = scheduler.assign([0, 1])
        assert scheduler.complete(task) is False
    evals = scheduler.assign([0, 1])
    assert {(t.kind, t.partition, t.worker) for t in evals} == {(EVAL, 0, 0), (EVAL, 1, 1)}
    scheduler.remove("t0000")
    assert [scheduler.complete(t) for t in evals] == [False, False]
    assert scheduler.assign([0, 1]) == []


def test_single_worker_walk_through_with_eval():
    scheduler = MOPScheduler({0: [0, 1, 2]}, evaluate=True)
    scheduler.start_epoch("t0000", 1, [2, 0, 1])
    seen = []
    while True:
        tasks = scheduler.assign([0])
        if not tasks:
            break
        [task] = tasks
        seen.append((task.kind, task.partition))
        finished = scheduler.complete(task)
        assert finished == (len(seen) == 6)
    assert seen == [(TRAIN, 2), (TRAIN, 0), (TRAIN, 1), (EVAL, 0), (EVAL, 1), (EVAL, 2)]


def test_without_eval_the_last_train_ends_the_epoch():
    scheduler = MOPScheduler({0: [0, 2], 1: [1]}, evaluate=False)
    scheduler.start_epoch("t0000", 1, [1, 2, 0])
    results = []
    for expected in ([Task("t0000", TRAIN, 1, 1, 1)], [Task("t0000", TRAIN, 1, 2, 0)],
                     [Task("t0000", TRAIN, 1, 0, 0)]):
        assert scheduler.assign([0, 1]) == expected
        results.append(scheduler.complete(expected[0]))
    assert results == [False, False, True]
    assert scheduler.assign([0, 1]) == []


def test_assign_uses_only_idle_workers_that_hold_a_due_partition():
    scheduler = MOPScheduler({0: [0, 1], 1: [2, 3]}, evaluate=False)
    for i in range(4):
        scheduler.start_epoch(f"t{i:04d}", 1, [0, 1, 2, 3])
    assert scheduler.assign([]) == []
    assert scheduler.assign([1]) == []             # every trial starts on worker 0's partition 0
    assert scheduler.assign([0, 1]) == [Task("t0000", TRAIN, 1, 0, 0)]   # one task per worker
    assert scheduler.assign([1]) == []


def test_trial_trains_on_one_worker_at_a_time():
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=False)
    scheduler.start_epoch("t0000", 1, [0, 1])
    scheduler.start_epoch("t0001", 1, [1, 0])
    first = scheduler.assign([0, 1])
    assert sorted(first, key=lambda t: t.worker) == [Task("t0000", TRAIN, 1, 0, 0),
                                                     Task("t0001", TRAIN, 1, 1, 1)]
    # worker 0 finishes; t0000's next partition (1) is on the busy worker 1, and t0001 is
    # still training there: nothing can start on worker 0 yet
    assert scheduler.complete(first[0] if first[0].worker == 0 else first[1]) is False
    assert scheduler.assign([0]) == []


def test_oldest_epoch_goes_first():
    scheduler = MOPScheduler({0: [0]}, evaluate=False)
    scheduler.start_epoch("t0000", 1, [0])
    [task] = scheduler.assign([0])
    assert scheduler.complete(task) is True
    scheduler.start_epoch("t0000", 2, [0])
    scheduler.start_epoch("t0001", 1, [0])         # a later trial that is an epoch behind
    assert scheduler.assign([0]) == [Task("t0001", TRAIN, 1, 0, 0)]


# --------------------------------------------------------------------------------------------
# the discrete-event simulator
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    seed: int
    partitions: int
    workers: int
    evaluate: bool
    epochs: tuple[int, ...]                        # per trial
    arrivals: tuple[int, ...]                      # per trial: when the searcher suggests it
    train_time: tuple[tuple[int, ...], ...]        # [trial][partition]
    eval_time: tuple[tuple[int, ...], ...]         # [trial][partition]
    epoch_extra: tuple[tuple[int, ...], ...]       # [trial][epoch - 1]: added to every sub-epoch
    ends: tuple[tuple[str, int] | None, ...]       # per trial: early end, see _end_strategy

    @property
    def trials(self) -> int:
        return len(self.epochs)

    def owner(self, partition: int) -> int:
        return partition % self.workers

    def duration(self, task: Task) -> int:
        i = int(task.trial_id[1:])
        table = self.train_time if task.kind == TRAIN else self.eval_time
        return table[i][task.partition] + self.epoch_extra[i][task.epoch - 1]


@dataclass
class _Model:
    """The simulator's own idea of a live trial's epoch: used to check every assign()."""

    epoch: int
    order: list[int]
    trained: int = 0
    training: bool = False
    eval_todo: set[int] = field(default_factory=set)
    evaluating: set[int] = field(default_factory=set)

    def finished(self, partitions: int) -> bool:
        return (self.trained == partitions and not self.training
                and not self.eval_todo and not self.evaluating)

    def available(self, worker: int, case: Case) -> list[tuple[str, int]]:
        """(kind, partition) steps this trial could start on ``worker`` now."""
        if self.trained < case.partitions:
            partition = self.order[self.trained]
            if not self.training and case.owner(partition) == worker:
                return [(TRAIN, partition)]
            return []
        return [(EVAL, p) for p in sorted(self.eval_todo) if case.owner(p) == worker]


@dataclass
class Outcome:
    schedule: list[tuple[Task, int, int]]          # (task, start, end), in completion order
    removed_at: dict[str, int]                     # trial -> time it ended early (fail / kill)
    ended_at: dict[str, int]                       # trial -> time it left the scheduler
    epochs_done: dict[str, int]                    # trial -> epochs it finished
    assign_calls: int

    def canonical(self) -> list[tuple[int, int, int, str, str, int, int]]:
        return sorted((s, e, t.worker, t.trial_id, t.kind, t.epoch, t.partition)
                      for t, s, e in self.schedule)


@functools.cache
def _order(seed: int, trial_id: str, epoch: int, partitions: int) -> tuple[int, ...]:
    return tuple(visit_order(seed, trial_id, epoch, partitions))


def _trial_id(i: int) -> str:
    return f"t{i:04d}"


def simulate(case: Case, *, shuffle_seed: int | None = None, max_events: int = 20_000,
             scheduler_cls: type[MOPScheduler] = MOPScheduler) -> Outcome:
    """Run ``case`` to the end like the driver would, checking every scheduler answer.

    ``shuffle_seed`` shuffles the order in which simultaneous completions are handled and the
    order of the idle-worker list given to assign() (neither may change the schedule).
    """
    rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
    P, W = case.partitions, case.workers
    layout = {w: [p for p in range(P) if p % W == w] for w in range(W)}
    if rng is not None:                       # the mapping's order must not matter either
        items = list(layout.items())
        rng.shuffle(items)
        layout = {w: list(reversed(ps)) for w, ps in items}
    scheduler = scheduler_cls(layout, evaluate=case.evaluate)
    assert scheduler.num_partitions == P

    live: dict[str, _Model] = {}
    running: dict[int, tuple[Task, int, int]] = {}        # worker -> (task, start, end)
    completions: dict[str, int] = defaultdict(int)
    out = Outcome([], {}, {}, {}, 0)
    arrivals = {_trial_id(i): case.arrivals[i] for i in range(case.trials)}
    kills = {_trial_id(i): case.arrivals[i] + end[1]
             for i, end in enumerate(case.ends) if end is not None and end[0] == "kill"}
    now = 0

    def start_epoch(tid: str, epoch: int) -> None:
        order = list(_order(case.seed, tid, epoch, P))
        scheduler.start_epoch(tid, epoch, order)
        live[tid] = _Model(epoch, list(order))

    def end_trial(tid: str, early: bool) -> None:
        scheduler.remove(tid)
        del live[tid]
        out.ended_at[tid] = now
        if early:
            out.removed_at[tid] = now

    def on_complete(task: Task) -> None:
        tid = task.trial_id
        model = live.get(tid)
        if model is None:                         # the trial ended while this ran
            assert scheduler.complete(task) is False
            return
        assert task.epoch == model.epoch, "a task of an earlier epoch outlived its epoch"
        i = int(tid[1:])
        completions[tid] += 1
        end = case.ends[i]
        if end is not None and end[0] == "fail" and completions[tid] == end[1]:
            end_trial(tid, early=True)            # the driver removes without complete()
            return
        if task.kind == TRAIN:
            model.training = False
            model.trained += 1
            if model.trained == P and case.evaluate:
                model.eval_todo = set(range(P))
        else:
            model.evaluating.remove(task.partition)
        finished = model.finished(P)
        assert scheduler.complete(task) is finished
        if finished:
            out.epochs_done[tid] = out.epochs_done.get(tid, 0) + 1
            if model.epoch >= case.epochs[i]:
                end_trial(tid, early=False)
            elif end is not None and end[0] == "stop" and model.epoch >= end[1]:
                end_trial(tid, early=True)        # the searcher stopped it
            else:
                start_epoch(tid, model.epoch + 1)

    for _ in range(max_events):
        # 1. sub-epochs ending now
        done = sorted(w for w, (_, _, end) in running.items() if end == now)
        if rng is not None:
            rng.shuffle(done)
        for worker in done:
            task, start, end = running.pop(worker)
            out.schedule.append((task, start, end))
            on_complete(task)
        # 2. trials killed now (timeout, stop from outside): may have sub-epochs running
        for tid, when in sorted(kills.items()):
            if when == now and tid in live:
                end_trial(tid, early=True)
        # 3. trials the searcher suggests now
        for tid, when in sorted(arrivals.items()):
            if when == now:
                start_epoch(tid, 1)
        # 4. dispatch
        idle = [w for w in range(W) if w not in running]
        if rng is not None:
            rng.shuffle(idle)
        all_idle = not running
        tasks = scheduler.assign(idle)
        out.assign_calls += 1
        _check_assignment(case, live, idle, tasks)
        if all_idle and live:
            assert tasks, f"deadlock at t={now}: all workers idle, live trials {sorted(live)}"
        for task in tasks:
            running[task.worker] = (task, now, now + case.duration(task))
        # 5. next event
        future = [end for _, _, end in running.values()]
        future += [t for t in arrivals.values() if t > now]
        future += [t for tid, t in kills.items() if t > now and (tid in live or arrivals[tid] > now)]
        if not future:
            break
        now = min(future)
    else:
        pytest.fail(f"the simulation did not finish within {max_events} events")

    assert not live, f"trials {sorted(live)} never finished"
    assert not running
    assert scheduler.assign(range(W)) == []
    return out


def _check_assignment(case: Case, live: dict[str, _Model], idle: list[int], tasks: list[Task]) -> None:
    """assign() answers only with steps that are due, and leaves a worker idle only where
    every step it could run is a train step of a later epoch than a trial training elsewhere
    that visits that partition next (the partition is held for it; eval visits never are)."""
    assert len({t.worker for t in tasks}) == len(tasks), f"two tasks for one worker: {tasks}"
    assert {t.worker for t in tasks} <= set(idle), f"a task for a busy worker: {tasks} (idle {idle})"
    task_of = {t.worker: t for t in tasks}

    def allowed(tid: str, step: tuple[str, int]) -> bool:
        if step[0] == EVAL:
            return True
        held = [m.epoch for m in live.values()
                if m.training and m.trained + 1 < case.partitions and m.order[m.trained + 1] == step[1]]
        return not held or min(held) >= live[tid].epoch

    # replay the answer worker by worker, as the scheduler fills workers in ascending order
    for worker in sorted(idle):
        candidates = {tid: [s for s in m.available(worker, case) if allowed(tid, s)] for tid, m in live.items()}
        candidates = {tid: steps for tid, steps in candidates.items() if steps}
        task = task_of.get(worker)
        if task is None:
            # work conservation: no live trial has a step it could start on this idle worker
            assert not candidates, f"worker {worker} left idle while {candidates} could run on it"
            continue
        assert task.partition in range(case.partitions)
        assert task.worker == case.owner(task.partition), f"{task} is not on its partition's worker"
        model = live.get(task.trial_id)
        assert model is not None, f"{task} is for a trial that is not live"
        assert task.epoch == model.epoch, f"{task} is not for the trial's current epoch {model.epoch}"
        assert (task.kind, task.partition) in candidates.get(task.trial_id, []), \
            f"{task} is not due (trained {model.trained}, training {model.training}, " \
            f"eval_todo {sorted(model.eval_todo)}, order {model.order}), or its partition is held"
        # the furthest-behind epoch goes first
        assert model.epoch <= min(live[tid].epoch for tid in candidates), \
            f"{task} was chosen over a trial in an older epoch: {candidates}"
        if task.kind == TRAIN:
            model.training = True
        else:
            model.eval_todo.remove(task.partition)
            model.evaluating.add(task.partition)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def check_schedule(case: Case, out: Outcome) -> None:
    """Invariant 1 on the produced schedule, from the schedule alone."""
    P, W = case.partitions, case.workers
    by_worker: dict[int, list[tuple[int, int, Task]]] = defaultdict(list)
    by_trial: dict[str, list[tuple[int, int, Task]]] = defaultdict(list)
    for task, start, end in out.schedule:
        assert start < end
        assert task.worker == task.partition % W, f"{task} ran off its partition's worker"
        by_worker[task.worker].append((start, end, task))
        by_trial[task.trial_id].append((start, end, task))

    # no worker runs two sub-epochs at once
    for worker, runs in by_worker.items():
        runs.sort(key=lambda r: (r[0], r[1]))
        for (s1, e1, t1), (s2, e2, t2) in zip(runs, runs[1:]):
            assert e1 <= s2, f"worker {worker} ran {t1} [{s1},{e1}) and {t2} [{s2},{e2}) at once"

    for i in range(case.trials):
        tid = _trial_id(i)
        runs = sorted(by_trial.get(tid, []), key=lambda r: (r[0], r[1], r[2].partition))
        trains = [r for r in runs if r[2].kind == TRAIN]
        evals = [r for r in runs if r[2].kind == EVAL]

        # a trial trains on one worker at a time, and never trains while it is evaluated
        for (_, e1, t1), (s2, _, t2) in zip(trains, trains[1:]):
            assert e1 <= s2, f"{tid} trained {t1} and {t2} at once"
        for s1, e1, t1 in trains:
            for s2, e2, t2 in evals:
                assert not _overlap((s1, e1), (s2, e2)), f"{tid} trained {t1} while evaluated {t2}"
        if not case.evaluate:
            assert not evals, f"{tid} was evaluated with evaluate=False"
        if tid in out.removed_at:
            assert all(s < out.removed_at[tid] for s, _, _ in runs), f"{tid} ran after it ended"

        # epoch by epoch: training in exactly the seeded order, then one eval per partition
        epochs = sorted({r[2].epoch for r in runs})
        assert epochs == list(range(1, len(epochs) + 1)), f"{tid} ran epochs {epochs}"
        end = case.ends[i]
        if tid not in out.removed_at:
            expected = case.epochs[i]
        elif end is not None and end[0] == "stop":
            expected = end[1]
        else:
            expected = None                               # failed / killed: some prefix
        if expected is not None:
            assert len(epochs) == expected and out.epochs_done.get(tid, 0) == expected, \
                f"{tid} ran {len(epochs)} epochs, finished {out.epochs_done.get(tid, 0)}, expected {expected}"
        else:
            assert out.epochs_done.get(tid, 0) <= case.epochs[i]
            assert len(epochs) in (out.epochs_done.get(tid, 0), out.epochs_done.get(tid, 0) + 1)
        previous_end = None
        for epoch in epochs:
            e_trains = [r for r in trains if r[2].epoch == epoch]
            e_evals = [r for r in evals if r[2].epoch == epoch]
            order = list(_order(case.seed, tid, epoch, P))
            visited = [r[2].partition for r in e_trains]
            complete = epoch <= out.epochs_done.get(tid, 0)
            if complete:
                assert visited == order, f"{tid} epoch {epoch} trained on {visited}, not {order}"
                eval_parts = sorted(r[2].partition for r in e_evals)
                assert eval_parts == (list(range(P)) if case.evaluate else []), \
                    f"{tid} epoch {epoch} evaluated on {eval_parts}"
            else:                                       # the epoch in which it failed / was killed
                assert visited == order[:len(visited)], f"{tid} epoch {epoch}: {visited} vs {order}"
                eval_parts = [r[2].partition for r in e_evals]
                assert len(set(eval_parts)) == len(eval_parts)
            if e_evals:
                assert len(visited) == P, f"{tid} evaluated before training all of epoch {epoch}"
                last_train_end = max(e for _, e, _ in e_trains)
                assert all(s >= last_train_end for s, _, _ in e_evals), \
                    f"{tid} epoch {epoch} was evaluated before its training ended"
            # an epoch starts only after the previous one has completely ended
            if previous_end is not None:
                assert min(s for s, _, _ in e_trains + e_evals) >= previous_end
            previous_end = max(e for _, e, _ in e_trains + e_evals)


# --------------------------------------------------------------------------------------------
# strategies and properties
# --------------------------------------------------------------------------------------------


_ENDS = (None, "fail", "stop", "kill")   # how a trial may end early, with its parameter k:
_END_RANGE = {"fail": 24,                # fails in its k-th finished sub-epoch (no complete())
              "stop": 3,                 # the searcher stops it after epoch k
              "kill": 40}                # ends k time units after it arrived, wherever it is


@st.composite
def cases(draw) -> Case:
    P = draw(st.sampled_from(range(1, 9)))            # (sampled_from: uniform, unlike integers)
    W = draw(st.sampled_from(range(1, min(P, 6) + 1)))
    n = draw(st.sampled_from(range(1, 13)))

    # The per-trial values come from a few byte strings (one draw each, which keeps
    # generation fast); every byte shrinks towards 0, i.e. towards the simplest value:
    # one epoch, arrival at 0, no early end, the shortest durations.
    def table(low, high, size):
        raw = draw(st.binary(min_size=n * size, max_size=n * size))
        values = [low + b % (high - low + 1) for b in raw]
        return tuple(tuple(values[i * size:(i + 1) * size]) for i in range(n))

    epochs, arrival, end_kind, end_k = zip(*table(0, 255, 4))
    ends = []
    for kind, k in zip(end_kind, end_k):
        kind = _ENDS[kind % len(_ENDS)]
        ends.append(None if kind is None else (kind, 1 + k % _END_RANGE[kind]))
    return Case(
        seed=draw(st.integers(0, 2**32 - 1)),
        partitions=P,
        workers=W,
        evaluate=draw(st.booleans()),
        epochs=tuple(1 + e % 4 for e in epochs),
        arrivals=tuple(0 if a < 128 else a % 31 for a in arrival),   # half arrive at the start
        train_time=table(1, 6, P),
        eval_time=table(1, 3, P),
        epoch_extra=table(0, 2, 4),
        ends=tuple(ends),
    )


PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@PROPERTY
@given(cases())
def test_simulated_schedule_satisfies_invariant_1(case):
    out = simulate(case)
    check_schedule(case, out)


def _trained(out: Outcome) -> dict[tuple[str, int], list[int]]:
    """(trial, epoch) -> the partitions it trained on, in time order."""
    seq: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for task, start, _ in out.schedule:
        if task.kind == TRAIN:
            seq[task.trial_id, task.epoch].append((start, task.partition))
    return {k: [p for _, p in sorted(v)] for k, v in seq.items()}


@PROPERTY
@given(cases(), st.integers(0, 2**32 - 1))
def test_schedule_is_deterministic_and_what_runs_does_not_depend_on_timing(case, shuffle_seed):
    first = simulate(case)
    again = simulate(case)
    assert again.schedule == first.schedule
    assert again.ended_at == first.ended_at
    # neither the order of simultaneous completions, nor the order of the idle-worker list,
    # nor the order of the worker -> partitions mapping changes the schedule
    shuffled = simulate(case, shuffle_seed=shuffle_seed)
    assert shuffled.canonical() == first.canonical()
    assert shuffled.ended_at == first.ended_at
    # slow trial 0's training down 5x: when and where sub-epochs run changes, but not what
    # each trial trains on, epoch by epoch, nor how many epochs it finishes (trials killed at
    # a fixed time are left out: how far they got does depend on timing)
    slow = Case(**{**case.__dict__,
                   "train_time": (tuple(5 * t for t in case.train_time[0]),) + case.train_time[1:]})
    slowed = simulate(slow)
    check_schedule(slow, slowed)
    killed = {_trial_id(i) for i, end in enumerate(case.ends) if end is not None and end[0] == "kill"}
    assert ({k: v for k, v in _trained(slowed).items() if k[0] not in killed}
            == {k: v for k, v in _trained(first).items() if k[0] not in killed})
    assert ({t: n for t, n in slowed.epochs_done.items() if t not in killed}
            == {t: n for t, n in first.epochs_done.items() if t not in killed})


class _IgnoresOrder(MOPScheduler):                 # trains in partition order, not the seeded one
    def start_epoch(self, trial_id, epoch, order):
        super().start_epoch(trial_id, epoch, sorted(order))


class _Lazy(MOPScheduler):                         # starts at most one sub-epoch per call
    def assign(self, idle_workers):
        return super().assign(idle_workers)[:1]


class _NeverEvaluates(MOPScheduler):               # forgets the eval visits
    def _push(self, state, kind, partition):
        if kind != EVAL:
            super()._push(state, kind, partition)


class _EvalsEarly(MOPScheduler):                   # evaluates while the last train sub-epoch runs
    def assign(self, idle_workers):
        idle = sorted(idle_workers)
        tasks = super().assign(idle)
        busy = {t.worker for t in tasks}
        for state in self._epochs.values():
            if state.training and state.trained == len(state.order) - 1:
                for worker in [w for w in idle if w not in busy]:
                    partition = self.partitions_of(worker)[0]
                    if partition not in state.evaluating:
                        state.evaluating.add(partition)
                        busy.add(worker)
                        tasks.append(Task(state.trial_id, EVAL, state.number, partition, worker))
        return tasks


_HARNESS_CASE = Case(seed=0, partitions=4, workers=2, evaluate=True, epochs=(2, 2, 1), arrivals=(0, 0, 3),
                     train_time=((1, 2, 3, 4), (2, 2, 2, 2), (1, 1, 1, 1)),
                     eval_time=((1, 1, 1, 1), (1, 2, 1, 2), (1, 1, 1, 1)),
                     epoch_extra=((0, 0, 0, 0), (0, 1, 0, 0), (0, 0, 0, 0)), ends=(None, None, None))


_SOLO_CASE = Case(seed=0, partitions=4, workers=2, evaluate=True, epochs=(2,), arrivals=(0,),
                  train_time=((1, 2, 3, 4),), eval_time=((1, 1, 1, 1),), epoch_extra=((0, 0, 0, 0),),
                  ends=(None,))


@pytest.mark.parametrize("broken, complaint, case", [
    (_IgnoresOrder, "is not due", _SOLO_CASE),
    (_IgnoresOrder, "is not due", _HARNESS_CASE),
    (_Lazy, "left idle while", _SOLO_CASE),
    (_Lazy, "left idle while", _HARNESS_CASE),
    (_NeverEvaluates, "left idle while", _SOLO_CASE),
    (_NeverEvaluates, "left idle while", _HARNESS_CASE),
    (_EvalsEarly, "is not due", _SOLO_CASE),
])
def test_simulator_catches_a_broken_scheduler(case, broken, complaint):
    """The harness itself: schedulers with one flaw each are caught, by the right check."""
    check_schedule(case, simulate(case))
    with pytest.raises(AssertionError, match=re.escape(complaint)):
        simulate(case, scheduler_cls=broken)


def _one_epoch(evaluate: bool = True) -> tuple[Case, int, int]:
    case = Case(seed=0, partitions=2, workers=2, evaluate=evaluate, epochs=(1,), arrivals=(0,),
                train_time=((1, 1),), eval_time=((1, 1),), epoch_extra=((0, 0, 0, 0),), ends=(None,))
    first, second = visit_order(0, "t0000", 1, 2)
    return case, first, second


def _run(kind: str, partition: int, start: int, end: int, worker: int | None = None):
    return (Task("t0000", kind, 1, partition, partition if worker is None else worker), start, end)


def test_schedule_check_accepts_a_correct_schedule():
    case, a, b = _one_epoch()
    schedule = [_run(TRAIN, a, 0, 1), _run(TRAIN, b, 1, 2), _run(EVAL, 0, 2, 3), _run(EVAL, 1, 2, 4)]
    check_schedule(case, Outcome(schedule, {}, {}, {"t0000": 1}, 0))
    check_schedule(case, simulate(case))


@pytest.mark.parametrize("broken, complaint", [
    (lambda a, b: [_run(TRAIN, b, 0, 1), _run(TRAIN, a, 1, 2), _run(EVAL, 0, 2, 3), _run(EVAL, 1, 2, 3)],
     "trained on"),
    (lambda a, b: [_run(TRAIN, a, 0, 2), _run(TRAIN, b, 1, 3), _run(EVAL, 0, 3, 4), _run(EVAL, 1, 3, 4)],
     "t0000 trained"),
    (lambda a, b: [_run(TRAIN, a, 0, 1), _run(TRAIN, b, 1, 2), _run(EVAL, a, 1, 2), _run(EVAL, b, 2, 3)],
     "while evaluated"),
    (lambda a, b: [_run(TRAIN, a, 0, 1), _run(TRAIN, b, 1, 2), _run(EVAL, 0, 2, 3)], "evaluated on"),
    (lambda a, b: [_run(TRAIN, a, 0, 1), _run(TRAIN, b, 1, 2), _run(EVAL, 0, 2, 3), _run(EVAL, 0, 3, 4),
                   _run(EVAL, 1, 2, 3)], "evaluated on"),
    (lambda a, b: [_run(TRAIN, a, 0, 1), _run(TRAIN, b, 1, 2, worker=a), _run(EVAL, 0, 2, 3),
                   _run(EVAL, 1, 2, 3)], "ran off its partition's worker"),
    (lambda a, b: [_run(TRAIN, a, 0, 1), _run(TRAIN, b, 1, 2), _run(EVAL, a, 2, 3), _run(EVAL, a, 2, 3),
                   _run(EVAL, b, 2, 3)], "worker"),
])
def test_schedule_check_catches_a_broken_schedule(broken, complaint):
    case, a, b = _one_epoch()
    with pytest.raises(AssertionError, match=re.escape(complaint)):
        check_schedule(case, Outcome(broken(a, b), {}, {}, {"t0000": 1}, 0))


def test_schedule_check_catches_eval_without_evaluate():
    case, a, b = _one_epoch(evaluate=False)
    schedule = [_run(TRAIN, a, 0, 1), _run(TRAIN, b, 1, 2), _run(EVAL, 0, 2, 3), _run(EVAL, 1, 2, 3)]
    with pytest.raises(AssertionError, match=re.escape("was evaluated with evaluate=False")):
        check_schedule(case, Outcome(schedule, {}, {}, {"t0000": 1}, 0))


def test_a_trial_still_training_goes_before_one_that_finished_training():
    """Furthest behind first: eval visits count as progress only once training is over."""
    scheduler = MOPScheduler({0: [0, 1]}, evaluate=True)
    scheduler.start_epoch("t0000", 1, [0, 1])
    scheduler.start_epoch("t0001", 1, [0, 1])
    for _ in range(3):                       # t0000 p0, t0001 p0, t0000 p1
        [task] = scheduler.assign([0])
        scheduler.complete(task)
    assert scheduler.assign([0]) == [Task("t0001", TRAIN, 1, 1, 0)]


def test_workers_without_partitions_are_rejected():
    with pytest.raises(ValueError, match=re.escape("workers hold no partitions; at least one partition is needed")):
        MOPScheduler({0: []})


def test_an_aborted_sub_epoch_is_assigned_again_and_nothing_is_lost():
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=True)
    scheduler.start_epoch("t0000", 1, [0, 1])
    [train] = scheduler.assign([0, 1])
    scheduler.abort(train)
    assert scheduler.assign([0, 1]) == [train]
    scheduler.complete(train)
    [second] = scheduler.assign([0, 1])
    scheduler.complete(second)
    evals = scheduler.assign([0, 1])
    assert sorted(t.partition for t in evals) == [0, 1]
    scheduler.abort(evals[1])
    assert scheduler.complete(evals[0]) is False          # one eval is still to do
    assert scheduler.assign([0, 1]) == [evals[1]]
    assert scheduler.complete(evals[1]) is True


def test_steps_waiting_on_a_moved_partition_run_on_its_new_holder():
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=True)
    scheduler.start_epoch("t0000", 1, [1, 0])
    scheduler.move(1, 0)                              # worker 1 lost before anything ran
    assert scheduler.partitions_of(0) == [0, 1] and scheduler.partitions_of(1) == []
    assert scheduler.assign([1]) == []
    [first] = scheduler.assign([0, 1])
    assert first == Task("t0000", TRAIN, 1, 1, 0)
    scheduler.complete(first)
    [second] = scheduler.assign([0, 1])
    assert second == Task("t0000", TRAIN, 1, 0, 0)
    scheduler.complete(second)
    scheduler.move(1, 1)                              # worker 1 is back before the evals
    evals = scheduler.assign([0, 1])
    assert sorted(evals, key=lambda t: t.worker) == [Task("t0000", EVAL, 1, 0, 0), Task("t0000", EVAL, 1, 1, 1)]
    assert [scheduler.complete(t) for t in evals] == [False, True]


def test_decisions_do_not_scan_every_trial(monkeypatch):
    """A thousand trials waiting on one worker's partition: each assign looks at a heap top."""
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=False)
    for i in range(1000):
        scheduler.start_epoch(f"t{i:04d}", 1, [0, 1])
    visited = []
    original = _Epoch.waits_on

    def counting(state, partition):
        visited.append(state.trial_id)
        return original(state, partition)
    monkeypatch.setattr(_Epoch, "waits_on", counting)
    [task] = scheduler.assign([0, 1])
    assert task == Task("t0000", TRAIN, 1, 0, 0) and visited == ["t0000"]


@pytest.mark.parametrize("ending", ["complete", "abort", "remove"])
def test_a_partition_is_held_for_an_older_trial_training_its_way(ending):
    """A trial an epoch ahead does not start on the partition a slower trial, training
    elsewhere, visits next; the hold ends when that sub-epoch ends, however it ends."""
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=False)
    scheduler.start_epoch("t0000", 1, [0, 1])
    [slow] = scheduler.assign([0, 1])
    assert slow == Task("t0000", TRAIN, 1, 0, 0)
    scheduler.start_epoch("t0001", 2, [1, 0])
    assert scheduler.assign([1]) == []
    if ending == "complete":
        scheduler.complete(slow)
        assert scheduler.assign([0, 1]) == [Task("t0000", TRAIN, 1, 1, 1)]
    else:
        getattr(scheduler, ending)(slow if ending == "abort" else "t0000")
        assert scheduler.assign([1]) == [Task("t0001", TRAIN, 2, 1, 1)]


@pytest.mark.parametrize("then", [1, None])
def test_a_partition_is_held_for_a_trial_that_starts_its_next_epoch_there(then):
    """A trial of a later epoch does not cut in where an older one starts its next epoch."""
    scheduler = MOPScheduler({0: [0], 1: [1]}, evaluate=False)
    scheduler.start_epoch("t0000", 1, [1, 0], then=then)
    [first] = scheduler.assign([0, 1])
    scheduler.complete(first)
    [last] = scheduler.assign([0, 1])                   # its last step, on partition 0
    assert last == Task("t0000", TRAIN, 1, 0, 0)
    scheduler.start_epoch("t0001", 2, [1, 0])
    cut_in = scheduler.assign([1])
    assert cut_in == ([] if then == 1 else [Task("t0001", TRAIN, 2, 1, 1)])
    assert scheduler.complete(last) is True
    scheduler.start_epoch("t0000", 2, [1, 0])
    if then == 1:                                      # worker 1 is still free: it goes first
        assert scheduler.assign([1]) == [Task("t0000", TRAIN, 2, 1, 1)]
