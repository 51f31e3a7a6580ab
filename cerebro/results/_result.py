"""``Result``: what a run produced, rebuilt from its run directory at any time."""
from __future__ import annotations

import math
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

from .._objectives import Objective, objectives
from ..store import (
    EpochEnd,
    Exploited,
    Ledger,
    RunExtended,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStore,
    StateLost,
    SubEpoch,
    TrialFacts,
    WorkerReplaced,
    WorkersRestarted,
    parse_event,
)
from ..store import _files as files
from ..store._bulk import collector_paused
from ._pareto import non_dominated
from ._run_state import RunLine, RunState
from ._trial_result import TrialResult, flat_config
from ._trial_run import TrialRun

if TYPE_CHECKING:      # imported where a table is made: cerebro status reads a run without pandas
    import pandas as pd

_ERROR_LINES = 8     # of a failed trial's traceback, in Result.failure


class NoBestTrialError(RuntimeError):
    """:attr:`Result.best` of a run in which no trial (failures aside) has an epoch with a finite objective."""


class Result:
    """The outcome of a run: every trial, the best one, the history and the schedule.

    ``cb.load(run_dir)`` builds the same object from a run directory, finished or not.
    """

    def __init__(self, store: RunStore, build: Callable[[dict], Any] | None = None) -> None:
        self.store = store
        info = store.read_run_info()
        self.run_dir = store.path
        self.seed: int = info["seed"]
        # What the search optimised: (metric, mode) pairs; with several, pareto() gives their front.
        # The first is the primary one, ``metric`` and ``mode``: what best and ranked() rank by.
        self.objectives: tuple[Objective, ...] = objectives(info["searcher"]["metric"], info["searcher"]["mode"],
                                                            recorded=True)
        self.metric: str = self.objectives[0].metric
        self.mode: str = self.objectives[0].mode
        self.keep_checkpoints: int | None = info.get("limits", {}).get("keep_checkpoints")
        # What its trials refer to (not the Result itself: see _trial_run).
        self._trial_run = TrialRun(store, self.run_dir, self.metric, self.keep_checkpoints, build)
        self._history: list[dict[str, Any]] = []
        self._ended_at: list[float] = []       # each history row's time, in the order the epochs ended
        self._schedule: list[dict[str, Any]] = []
        self._exploits: list[dict[str, Any]] = []
        self._sources: dict[tuple[str, int], str] = {}   # (trial, epoch) -> the first trial PBT copied into it then
        self._redone: set[tuple[str, int]] = set()
        self.finished = False
        self.bytes_communicated = 0   # driver <-> workers, both ways, and worker -> worker, once finished
        # index -> pid, host, launched_by, device, partitions of the latest launch
        self.workers: dict[int, dict[str, Any]] = {}
        self._ledger = Ledger(self.metric, self.mode)
        self._run = RunLine()
        with collector_paused():     # a dict, an event and a row or two per line, none in a cycle: see store._bulk
            events, self.damage = store.readable_events()
            for message in self.damage:
                warnings.warn(message, stacklevel=3)
            for event in events:
                self._apply(event)
            self._run.settle(store.file(".lock"))
            self._trials: dict[str, TrialResult] = {trial_id: self._trial_result(facts)
                                                    for trial_id, facts in self._ledger.trials.items()}
            # What happened to the run, by journal event name (workers lost, states lost, ...).
            self.incidents: Counter[str] = Counter(name for event in events
                                                   if isinstance(name := event.get("event"), str))
            del events       # freed now: the collector, once on again, walks only what the Result keeps

    def _apply(self, record: dict[str, Any]) -> None:
        """Take one journal line in: the trials' facts through the :class:`Ledger` every reader
        of a run uses, then the rows only a Result keeps (history, schedule, workers)."""
        event = parse_event(record)
        trial = self._ledger.apply(event)
        self._run.apply(event)
        if trial is None and getattr(event, "trial_id", None) is not None:
            return                             # its trial's creation is on a damaged line
        match event:
            case EpochEnd() as event if trial is not None:     # not None: returned above
                # The config this epoch trained with: PBT may have changed it since the trial began.
                self._history.append({"trial_id": trial.trial_id, "epoch": event.epoch, **event.metrics,
                                      "exploited_from": self._sources.get((trial.trial_id, event.epoch - 1)),
                                      "warm_started_from": trial.warm_started_from, **flat_config(trial.config)})
                self._ended_at.append(event.time)
            case Exploited() as event:
                self._exploits.append({k: v for k, v in event.record().items() if k != "time"})
                self._sources.setdefault((event.trial_id, event.epoch), event.source)
            case SubEpoch() as event:
                if (event.trial_id, event.epoch) in self._redone:
                    return                     # re-run after a resume to rebuild a damaged checkpoint
                worker = self.workers.get(event.worker, {})   # the process it ran in at that time
                self._schedule.append({**event.record(), "host": worker.get("host"), "pid": worker.get("pid")})
            case StateLost() as event:         # those train sub-epochs ran again: the first runs count no more
                self._schedule = [row for row in self._schedule if not (
                    row["trial_id"] == event.trial_id and row["epoch"] == event.epoch and row["kind"] == "train"
                    and row["partition"] in event.partitions)]
            case RunExtended():                # resume(..., epochs=N): the completed trials go on
                self.finished = False
            case RunStarted() | WorkersRestarted() | WorkerReplaced() as event:
                self.finished = self.finished and not isinstance(event, RunResumed)
                # (a line with its CRC may lack them: anyone who can write the run directory can add one)
                self.workers = {int(index): info for index, info in (event.workers or {}).items()}
                if isinstance(event, RunResumed):   # sub-epochs of epochs the crash cut short ran again after it
                    self._redone = {(row["trial_id"], row["epoch"]) for row in self._history}
                    self._schedule = [row for row in self._schedule
                                      if (row["trial_id"], row["epoch"]) in self._redone]
            case RunFinished() as event:
                self.finished = True
                self.bytes_communicated = ((event.bytes_sent or 0) + (event.bytes_received or 0)
                                           + (event.bytes_between_workers or 0))

    def _trial_result(self, facts: TrialFacts) -> TrialResult:
        status = facts.status or self._run.live_status(facts.trial_id)
        return TrialResult(facts.trial_id, facts.config, status=status, epochs=facts.epoch, metrics=facts.metrics,
                           error=facts.reason if status.is_failure else None, reason=facts.reason,
                           best_epoch=None if facts.best is None else facts.best[0], best_metrics=facts.best_metrics,
                           warm_started_from=facts.warm_started_from, _result=self._trial_run)

    @property
    def state(self) -> RunState:
        """Where the run stands: ``running``, ``finished``, or stopped before its end, resumable:
        ``stopped`` (``cb.stop``), ``budget`` (its ``time_budget`` passed), ``interrupted``
        (Ctrl-C, SIGTERM), ``failed`` (its driver raised: :attr:`run_error` says what) or
        ``died`` (its driver ended without a word: killed, out of memory). The trials that had
        not ended then are ``parked``."""
        return self._run.state

    @property
    def run_error(self) -> str | None:
        """Why the driver stopped the run, where it raised (its workers lost, a store that could
        not be written, ...), also before the first trial began; else None."""
        return self._run.error

    @property
    def provided_build(self) -> Callable[[dict], Any] | None:
        """The ``build`` given to ``load`` or ``fit``; None where the stored one is used."""
        return self._trial_run.given_build

    @property
    def build(self) -> Callable[[dict], Any]:
        """The run's ``build(config)``: the one given to ``load``, or the stored one (unpickled
        on first use: it is code, so only :meth:`TrialResult.model` and resume need it)."""
        return self._trial_run.build

    @property
    def trials(self) -> list[TrialResult]:
        """Every trial, in creation order."""
        return list(self._trials.values())

    @property
    def best(self) -> TrialResult:
        """The best so far: the trial whose best epoch has the best ``metric`` under ``mode``
        (the first of several objectives: :meth:`pareto` gives their front), at its
        :attr:`TrialResult.best_epoch` (whose weights are kept), whatever its status but
        a failure (failed, diverged, timeout): completed, stopped, or still live, running,
        paused or parked in a run that stopped (``ranked(scope="last")`` ranks by the last
        epoch instead). :class:`NoBestTrialError` where no such trial has an epoch yet."""
        ranked = self.ranked()
        if not ranked or not self._scored(ranked[0], "best"):
            statuses = ", ".join(f"{t.trial_id} {t.status}" for t in self._trials.values()) or "none"
            raise NoBestTrialError(f"no trial of run {self.run_dir!r} finished with a finite {self.metric!r}; "
                                   f"its trials: {statuses}")
        return ranked[0]

    def ranked(self, scope: str = "best") -> list[TrialResult]:
        """Every trial, best first (by the first metric, with several objectives): those with a
        finite ``metric`` at their best epoch (``scope="best"``) or at their last (``"last"``),
        whatever their status but a failure
        (a trial stopped early and one parked by a stopped run are ranked alike); then the
        others (failed, diverged, timeout, or without an epoch yet), in creation order. Ties
        keep creation order."""
        if scope not in ("best", "last"):
            raise ValueError(f"scope={scope!r} must be 'best' or 'last'")
        sign = 1 if self.mode == "min" else -1
        scored = sorted((t for t in self.trials if self._scored(t, scope)),
                        key=lambda t: sign * self._value(t, scope))
        return scored + [t for t in self.trials if not self._scored(t, scope)]

    def pareto(self) -> list[TrialResult]:
        """The Pareto front of a run with several objectives (``metric=["val_accuracy",
        "params"]``): the trials that no other trial dominates, i.e. beats on one objective
        while no worse on any other; equal trials are all on it. Each trial is judged at its
        best epoch BY THE FIRST METRIC (its :attr:`TrialResult.best_metrics`: the weights
        kept), whatever its status but a failure, as :attr:`best`; a trial without a finite
        value of every objective there is left out. In :meth:`ranked` order: by the first
        metric, best first, ties in creation order. On a run with one objective, a
        ``ValueError``: ``best`` and ``ranked()`` are its answer.

        Example:
            >>> import cerebro as cb
            >>> def objective(config, epoch):       # wider: more accurate, and larger
            ...     return {"val_accuracy": 1 - 1 / config["width"], "params": 10.0 * config["width"]}
            >>> search = cb.GridSearch(lambda config: None, {"width": cb.choice([8, 32, 128])}, epochs=1,
            ...                        metric=["val_accuracy", "params"], mode=["max", "min"])
            >>> [(t.config["width"], t.best_metrics["params"]) for t in cb.simulate(search, objective).pareto()]
            [(128, 1280.0), (32, 320.0), (8, 80.0)]
        """
        if len(self.objectives) == 1:
            raise ValueError(f"the run {self.run_dir!r} has one objective ({self.metric!r}, mode={self.mode!r}), so "
                             f"no Pareto front: result.best and result.ranked() give its best trials; pass "
                             f"metric=[...] and mode=[...] to a searcher to search on several")
        scored = [t for t in self.ranked() if self._scored(t, "best")
                  and all(_finite(t.best_metrics.get(o.metric)) for o in self.objectives)]
        points = [[t.best_metrics[o.metric] for o in self.objectives] for t in scored]
        return [scored[index] for index in non_dominated(points, self.objectives)]

    def _value(self, trial: TrialResult, scope: str) -> float:
        metrics = trial.best_metrics if scope == "best" else trial.metrics
        value = metrics.get(self.metric)
        return value if isinstance(value, (int, float)) and math.isfinite(value) else math.nan

    def _scored(self, trial: TrialResult, scope: str) -> bool:
        return not trial.status.is_failure and not math.isnan(self._value(trial, scope))

    @property
    def failure(self) -> str | None:
        """Why the run failed, when every trial ended failed, diverged or timed out: the most
        common cause and one such trial's error (its traceback's last lines); else None."""
        trials = self.trials
        if not trials or not all(t.status.is_failure for t in trials):
            return None
        # Causes alike but for their numbers (an epoch, a partition, a shape) count as one.
        kinds = Counter(_kind(t.cause) for t in trials)
        kind, count = kinds.most_common(1)[0]
        example = next(t for t in trials if _kind(t.cause) == kind)
        cause = example.cause
        statuses = Counter(str(t.status) for t in trials)
        lines = (example.reason or "").strip().splitlines()[-_ERROR_LINES:]
        return (f"every trial of the run failed ({', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))}); "
                f"the most common cause, in {count} of {len(trials)}: {cause}\n{example.trial_id}'s error:\n"
                + "\n".join(f"  {line}" for line in lines))

    def history(self) -> pd.DataFrame:
        """One row per (trial_id, epoch), in that order: losses, metrics, ``exploited_from``
        (the trial whose state this epoch started from, after a PBT exploit, else None) and
        the config the epoch trained with."""
        import pandas as pd
        rows = sorted(self._history, key=lambda row: (row["trial_id"], row["epoch"]))
        return pd.DataFrame(rows, columns=None if rows else ["trial_id", "epoch"])

    def anytime(self) -> pd.DataFrame:
        """The anytime curve: after each epoch end, in the order they ended, ``time`` (seconds
        since the run started: simulated ones for ``cb.simulate``), ``trial_epochs`` (epochs
        trained by all trials so far: the compute spent), the ``trial_id`` and ``epoch`` that
        ended, its ``value`` of ``metric``, and ``best``: the best finite value of any epoch so
        far under ``mode`` (NaN before the first)."""
        import pandas as pd
        better = min if self.mode == "min" else max
        rows, best = [], math.nan
        for count, (row, time) in enumerate(zip(self._history, self._ended_at), start=1):
            value = row.get(self.metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                best = value if math.isnan(best) else better(best, value)
            rows.append({"time": time, "trial_epochs": count, "trial_id": row["trial_id"], "epoch": row["epoch"],
                         "value": value, "best": best})
        return pd.DataFrame(rows, columns=["time", "trial_epochs", "trial_id", "epoch", "value", "best"])

    def lineage(self) -> pd.DataFrame:
        """PBT's exploits, in the order they happened: after ``epoch``, ``trial_id`` took the
        state of ``source`` and went on with ``config`` instead of ``previous_config``."""
        import pandas as pd
        return pd.DataFrame(self._exploits, columns=["trial_id", "epoch", "source", "previous_config", "config"])

    def schedule(self) -> pd.DataFrame:
        """One row per sub-epoch: trial_id, epoch, partition, worker, kind, start, end
        (seconds since the run started), compute (seconds in the training loop), and the
        worker's host and pid."""
        import pandas as pd
        columns = ["trial_id", "epoch", "partition", "worker", "kind", "start", "end", "compute", "host", "pid"]
        return pd.DataFrame(self._schedule, columns=columns)

    def summary_rows(self, top: int | None = None) -> list[dict[str, Any]]:
        """:meth:`summary`'s rows as dicts (a trial without a best epoch: ``best_epoch`` None)."""
        return [{"trial_id": t.trial_id, "status": t.status, "epochs": t.epochs, "best_epoch": t.best_epoch,
                 f"best_{self.metric}": t.best_metrics.get(self.metric, math.nan),
                 self.metric: t.metrics.get(self.metric, math.nan), "reason": t.reason, **flat_config(t.config)}
                for t in self.ranked()[:top]]

    def summary(self, top: int | None = None) -> pd.DataFrame:
        """One row per trial, in :meth:`ranked` order: status, epochs, ``best_epoch``, the
        metric there (``best_<metric>``) and at the last epoch (``<metric>``), why it ended,
        and its config; ``top``: the first ``top`` rows alone (None: every trial's)."""
        import pandas as pd
        table = pd.DataFrame(self.summary_rows(top))
        if not table.empty:
            table["best_epoch"] = table["best_epoch"].astype("Int64")     # a trial without one: <NA>
        return table

    def __repr__(self) -> str:
        return f"Result({self.run_dir!r}, trials={len(self._trials)}, state={str(self.state)!r})"


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _kind(cause: str | None) -> str:
    return re.sub(r"\d+", "#", cause or "no reason recorded")


def load(run_dir: str | os.PathLike, build: Callable[[dict], Any] | None = None, *,
         trust: bool = False) -> Result:
    """The :class:`Result` of the run in ``run_dir``, finished or not.

    Loading reads data only; the stored, cloudpickled ``build`` is code and is unpickled
    only by :meth:`TrialResult.model`. ``build`` replaces it (e.g. when its module moved).
    ``trust=True`` also reads the pickled weights of runs written by older versions, which
    could run code: only for run directories you trust.
    """
    files.check_location("run_dir", run_dir)
    return Result(RunStore.open(run_dir, trust), build)
