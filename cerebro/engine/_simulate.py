"""A run on simulated workers (``cb.simulate``): the driver's trial book and MOP scheduler,
with an objective function in place of training and a clock in place of time.

Everything that decides is the engine's own: :class:`~._trials.TrialBook` asks the searcher
(narrow waist 1) at every epoch end and carries out its decisions, and the
:class:`~._scheduler.MOPScheduler` plans each epoch's sub-epochs over ``workers`` workers
holding one partition each, in the visit order of a real run. Only two things are
simulated: an epoch's metrics are ``objective(config, epoch)`` (:class:`ObjectiveBook`), and
a train sub-epoch takes ``epoch_seconds(config) / workers`` simulated seconds, the
sub-epochs running one per worker at a time, the earliest to end first (ties: the lower
worker). The events go to a real journal, so the run directory reads as any run's
(``cb.load``, ``cerebro status``, ``cerebro report``).
"""
from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

from .._objectives import objectives
from .._version import __version__
from ..results import Result
from ..store import Event, RunFinished, RunStarted, RunStore, SubEpoch, TrialStatus
from ..worker import Sums
from ._interface import SearchPolicy
from ._recorder import Recorder
from ._scheduler import MOPScheduler, Task
from ._settings import RunSettings
from ._trial import Trial
from ._trials import TrialBook

Objective = Callable[[dict[str, Any], int], Mapping[str, Any]]
_FLUSH_EVERY = 4096          # journal lines buffered before a write


@dataclass(frozen=True)
class Simulation:
    """What stands in for the workers: the ``objective`` an epoch's metrics come from, the
    number of ``workers``, and how many simulated seconds an epoch of a config takes."""

    objective: Objective
    workers: int
    epoch_seconds: Callable[[dict[str, Any]], float]

    def seconds(self, config: dict[str, Any]) -> float:
        """One epoch of ``config``, in simulated seconds: a positive finite number, or an error naming it."""
        value = self.epoch_seconds(dict(config))
        if isinstance(value, bool) or not isinstance(value, Real) or not 0 < value < math.inf:
            raise ValueError(f"epoch_seconds({config!r}) returned {value!r}; it must return a positive, finite "
                             f"number of seconds")
        return float(value)


class ObjectiveBook(TrialBook):
    """The trial book of a simulated run: an epoch's metrics are the objective's."""

    def __init__(self, policy: SearchPolicy, scheduler: MOPScheduler, settings: RunSettings, recorder: Recorder,
                 objective: Objective, others: Sequence[str] = ()) -> None:
        super().__init__(policy, scheduler, settings, recorder)
        self.objective = objective
        self.required = (settings.metric, *others)     # the search's objectives: each epoch must give each

    def epoch_metrics(self, trial: Trial, epoch: int, train_sums: dict[int, Sums],
                      eval_sums: dict[int, Sums]) -> dict[str, float] | None:
        """``objective(config, epoch)``, checked. As in a real run, the trial's own fault ends it
        and the search goes on: an objective that raises, or returns something other than a
        mapping of names to numbers, or without the searcher's metric, fails the trial; a
        metric that is not finite ends it diverged."""
        try:
            metrics = _checked_metrics(self.objective(dict(trial.config), epoch), self.required, epoch)
        except Exception:
            self.end(trial, TrialStatus.FAILED, traceback.format_exc(), epoch)
            return None
        value = metrics[self.settings.metric]
        if not math.isfinite(value):
            self.end(trial, TrialStatus.DIVERGED, f"{self.settings.metric} is {value} after epoch {epoch}", epoch)
            return None
        return metrics


def _checked_metrics(metrics: Any, required: Sequence[str], epoch: int) -> dict[str, float]:
    """The objective's answer as the epoch's metrics, with each of the ``required`` ones (the
    search's objectives, the first ranking); a TypeError or KeyError naming what is wrong."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"the objective returned {type(metrics).__name__} {metrics!r} for epoch {epoch}; it must "
                        f"return a dict of metric names to numbers, e.g. {{{required[0]!r}: 0.25}}")
    checked = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"the objective returned {name!r}: {value!r} for epoch {epoch}; metrics must be "
                            f"named by strings and be numbers")
        checked[name] = float(value)
    for metric in required:
        if metric not in checked:
            raise KeyError(f"the objective returned no {metric!r} for epoch {epoch} (it returned "
                           f"{sorted(checked)}); the searcher ranks trials by it")
    return checked


class JournalRecorder:
    """The book's recorder: events go to the run's journal in batches, on the simulated clock;
    there are no states, so no checkpoints."""

    def __init__(self, store: RunStore) -> None:
        self.store, self.path = store, store.path
        self.clock = 0.0
        self._events: list[Event] = []

    def emit(self, event: Event) -> None:
        if event.journaled:
            self._events.append(event)
            if len(self._events) >= _FLUSH_EVERY:
                self.flush()

    def flush(self) -> None:
        if self._events:
            self.store.emit_many(self._events)
            self._events = []

    def write_checkpoint(self, trial_id: str, state: Any, epoch: int, exploit: bool = False,
                         best: bool = False) -> None:
        """Nothing is trained, so there is no state to keep."""

    def remove_checkpoints(self, trial_id: str, keep: tuple[str, ...] = ()) -> None:
        """No checkpoints were written."""

    def write_config(self, trial_id: str, config: dict[str, Any]) -> None:
        """The journal holds every config (``trial_created``, ``exploit``): no file per trial."""

    def write_error(self, trial_id: str, error: str) -> None:
        self.store.write_error(trial_id, error)

    def now(self) -> float:
        return self.clock


def run_simulation(policy: SearchPolicy, simulation: Simulation, store: RunStore, settings: RunSettings,
                   searcher_settings: dict[str, Any]) -> Result:
    """Write ``store``'s run.json, run ``policy`` on the simulated workers to its end and
    return the run's :class:`Result`."""
    store.write_run_info({
        "seed": settings.seed, **settings.run_info(), "searcher": searcher_settings,
        "backend": "simulated", "workers": simulation.workers, "threads_per_worker": 1,
        "simulated": True, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "reproducible": {"across_worker_counts_and_backends": True, "why_not": None},
        "versions": {"cerebro": __version__}})
    recorder = JournalRecorder(store)
    scheduler = MOPScheduler({w: [w] for w in range(simulation.workers)}, evaluate=False)
    others = [o.metric for o in objectives(searcher_settings["metric"], searcher_settings["mode"])[1:]]
    book = ObjectiveBook(policy, scheduler, settings, recorder, simulation.objective, others)
    policy.start(settings.seed)
    recorder.emit(RunStarted({w: {"host": "simulated", "pid": None, "partitions": [w]}
                              for w in range(simulation.workers)}, 0.0, 0.0))
    _drive(book, scheduler, simulation, recorder)
    book.write_search_state(now=True)
    recorder.emit(RunFinished(recorder.clock, 0, 0, 0))
    recorder.flush()
    return Result(store)


def _drive(book: ObjectiveBook, scheduler: MOPScheduler, simulation: Simulation, recorder: JournalRecorder) -> None:
    """The driver's loop on the simulated clock: start what the scheduler assigns to idle
    workers, then end the sub-epoch that ends first and let the book and the searcher act."""
    running: dict[int, tuple[float, float, Task]] = {}      # worker -> (start, end, task)
    book.add_trials()
    while book.live or running:
        idle = [w for w in range(simulation.workers) if w not in running]
        for task in scheduler.assign(idle):
            seconds = simulation.seconds(book.live[task.trial_id].config) / simulation.workers
            running[task.worker] = (recorder.clock, recorder.clock + seconds, task)
        if not running:
            book.check_not_stuck(running=False)
            raise RuntimeError(f"the sub-epochs of {scheduler.unfinished()} can start on no worker: the scheduler "
                               f"lost track of them (a bug)")
        worker = min(running, key=lambda w: (running[w][1], w))
        start, end, task = running.pop(worker)
        recorder.clock = end
        recorder.emit(SubEpoch(task.trial_id, task.epoch, task.partition, worker, task.kind, start, end, end - start))
        book.sub_epoch_done(task, worker, Sums(1, 0.0, {}), None)
        book.apply_decisions()
        book.add_trials()
