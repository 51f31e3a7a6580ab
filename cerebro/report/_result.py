"""``Result``: what a run produced, rebuilt from its run directory at any time."""
from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd
import torch

from ..data import FeatureSpec, prediction_rows
from ..store import (
    BEST,
    EpochEnd,
    Exploited,
    RunExtended,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStore,
    StateLost,
    SubEpoch,
    TrialCreated,
    TrialEnded,
    TrialRetried,
    TrialStatus,
    WorkerReplaced,
    WorkersRestarted,
    improved,
    parse_event,
    unpack_tensors,
)
from ..worker import Trainable, predict_rows

_ERROR_LINES = 8     # of a failed trial's traceback, in Result.failure
_RAISED = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*:")     # "ValueError: ..."


@dataclass
class TrialResult:
    """One trial: its configuration, status, last epoch's metrics and trained weights.

    ``status`` is ``running`` until the trial ends as completed, stopped (by the searcher:
    ``reason`` says why, e.g. the rung), failed (its build or training raised: see
    ``error``), diverged (non-finite loss) or timeout. ``config`` is the latest one: PBT
    changes it (see :meth:`Result.lineage`).
    """

    trial_id: str
    config: dict[str, Any]
    status: TrialStatus = TrialStatus.RUNNING
    epochs: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    reason: str | None = None
    best_epoch: int | None = None        # the epoch with the best ``metric`` under ``mode``
    best_metrics: dict[str, float] = field(default_factory=dict)     # that epoch's metrics
    warm_started_from: str | None = None     # RUN_DIR:TRIAL@EPOCH whose state it started from (warm_start)
    _result: Result | None = field(default=None, repr=False, compare=False)

    @property
    def cause(self) -> str | None:
        """``reason`` in one line: the exception a traceback ends in (``Type: message``),
        else its last line; None while the trial has no reason."""
        lines = [line.strip() for line in (self.reason or "").strip().splitlines() if line.strip()]
        raised = [line for line in lines if _RAISED.match(line)]
        return (raised or lines or [None])[-1]

    def state_dict(self, epoch: int | str = "best") -> dict[str, torch.Tensor]:
        """The model's weights on the CPU after ``epoch``: ``"best"`` (the default: the epoch
        with the best metric, kept apart as it happened), ``"last"`` (the last finished one;
        where its checkpoint is damaged, the newest sound one's, with a warning naming the
        file and the epoch the weights are really from) or an epoch number whose weights were
        kept (a finished trial's best and last; a live one's last two too)."""
        store = self._require_result().store
        limit = self._require_result().keep_checkpoints
        kept = (BEST, "checkpoint.state", "checkpoint.prev.state")     # checked by name: reading them is later
        if self.status.is_finished and self.epochs and not any(store.has("trials", self.trial_id, n) for n in kept):
            raise FileNotFoundError(f"{self.trial_id} kept no weights: the run kept only the best "
                                    f"{limit} finished trials' (keep_checkpoints={limit})" if limit else
                                    f"{self.trial_id} has no checkpoint in {store.path!r}")
        if epoch == "last" or (epoch == "best" and self.best_epoch is None):
            sound, found = self._newest_sound(store)
            if sound["epoch"] < self.epochs:
                damaged = "; ".join(f"{c['path']}: {c['problem']}" for c in found if "problem" in c)
                warnings.warn(f"{self.trial_id}'s checkpoint of epoch {self.epochs} is damaged ({damaged}); these "
                              f"weights are from epoch {sound['epoch']}", stacklevel=2)
            return unpack_tensors(sound["state"]["model"])
        wanted = self.best_epoch if epoch == "best" else epoch
        if isinstance(wanted, bool) or not isinstance(wanted, int):
            raise ValueError(f"epoch={epoch!r} must be 'best', 'last' or an epoch number")
        kept = store.checkpoints(self.trial_id, (BEST, "checkpoint.state", "checkpoint.prev.state"))
        # An exploit's checkpoint holds the weights PBT copied in, not those the epoch trained.
        sound = [c for c in kept if "state" in c and not c.get("exploit")]
        match = next((c for c in sound if c["epoch"] == wanted), None)
        if match is None and epoch == "best":     # a run from before best epochs were kept, or damaged
            warnings.warn(f"{self.trial_id} kept no sound weights of its best epoch {wanted}; these are its last "
                          f"epoch's", stacklevel=2)
            return self.state_dict("last")
        if match is None:
            raise ValueError(f"{self.trial_id} kept no weights of epoch {wanted}; it kept epochs "
                             f"{sorted({c['epoch'] for c in sound})}")
        return unpack_tensors(match["state"]["model"])

    def _newest_sound(self, store: RunStore) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The kept checkpoint of the latest epoch that passes its check (a finished trial's
        best epoch's, where its last is damaged), and every one found; raises if none does."""
        found = store.checkpoints(self.trial_id, ("checkpoint.state", "checkpoint.prev.state", BEST))
        sound = [c for c in found if "state" in c]
        if sound:       # the latest epoch; of equal ones, the first: the checkpoint itself
            return max(sound, key=lambda c: c["epoch"]), found
        return store.sound_checkpoint(self.trial_id)      # raises, naming each file's problem

    def save_weights(self, path: str | os.PathLike, epoch: int | str = "best") -> None:
        """Write :meth:`state_dict` of ``epoch`` to ``path`` as safetensors, data only, with the
        trial id, epoch and config (JSON) as metadata; ``safetensors.torch.load_file`` reads
        it back."""
        from safetensors.torch import save_file
        number = self.epoch_number(epoch)
        save_file(self.state_dict(epoch), os.fspath(path),
                  metadata={"trial_id": self.trial_id, "epoch": str(number), "config": json.dumps(self.config)})

    def model(self, epoch: int | str = "best") -> Any:
        """The model that ``build(config)`` makes (a ``torch.nn.Module`` in eval mode, or a
        ``keras.Model``), with the weights of ``epoch`` (see :meth:`state_dict`) loaded."""
        return self.trainable(epoch).trained_model()

    def trainable(self, epoch: int | str = "best") -> Trainable:
        """What ``build(config)`` returns, with the weights of ``epoch`` loaded."""
        trainable = self._require_result().build(self.config)
        if not isinstance(trainable, Trainable):
            raise TypeError(f"build(config) must return a cerebro.TorchTrainable or cerebro.KerasTrainable; "
                            f"got {type(trainable).__name__}")
        trainable.load_weights(self.state_dict(epoch))
        return trainable

    def predict(self, data: Any, *, epoch: int | str = "best", batch_size: int | None = None) -> np.ndarray:
        """The model's outputs for ``data`` (a numpy array, a pandas DataFrame with the
        training's feature columns, a Parquet path or a :class:`cerebro.Dataset`), one row per
        input row, in order: the weights of ``epoch`` (see :meth:`state_dict`), the rows made
        as evaluation made them in training (the ``eval_transform``, not ``transform``), in
        batches of ``batch_size`` (default: the trainable's), on the GPU where there is one.
        Rows of another shape or dtype than the run's are refused before any batch runs.

        Example (a fragment: ``result`` is a finished run's):
            >>> outputs = result.best.predict(X_test)          # (rows, outputs), e.g. logits
        """
        spec = FeatureSpec.of_run(self._require_result().store.read_run_info()["data"])
        features, _ = prediction_rows(data, spec)
        return predict_rows(self.trainable(epoch), features, batch_size)

    def spark_udf(self, spark: Any, *, epoch: int | str = "best", batch_size: int | None = None) -> Any:
        """A Spark pandas UDF that runs this trial's model (the weights of ``epoch``, in batches
        of ``batch_size`` rows, default the trial's) on the
        executors: weights broadcast once, the model built once per Python worker; it takes
        the feature column (an array column; numeric columns as ``F.array(*columns)``, in the
        training's order) and returns each row's outputs as an array of floats. The build is
        the run's (see :mod:`._udf`).

        Example (a fragment: it needs a Spark session and a finished run):
            >>> udf = result.best.spark_udf(spark)
            >>> spark_df.withColumn("prediction", udf("features"))
        """
        from ._udf import spark_udf
        return spark_udf(self, spark, epoch, batch_size)

    def epoch_number(self, epoch: int | str) -> int:
        """The epoch number ``epoch`` (as :meth:`state_dict` takes it) names."""
        if epoch == "last" or (epoch == "best" and self.best_epoch is None):
            return self.epochs
        return self.best_epoch if epoch == "best" else epoch

    def _require_result(self) -> Result:
        if self._result is None:
            raise RuntimeError(f"trial {self.trial_id} is not attached to a run directory")
        return self._result


class Result:
    """The outcome of a run: every trial, the best one, the history and the schedule.

    ``cb.load(run_dir)`` builds the same object from a run directory, finished or not.
    """

    def __init__(self, store: RunStore, build: Callable[[dict], Any] | None = None) -> None:
        self.store = store
        self._build = self._given_build = build
        info = store.read_run_info()
        self.run_dir = store.path
        self.seed: int = info["seed"]
        self.metric: str = info["searcher"]["metric"]
        self.mode: str = info["searcher"]["mode"]
        self.keep_checkpoints: int | None = info.get("limits", {}).get("keep_checkpoints")
        self._trials: dict[str, TrialResult] = {}
        self._history: list[dict[str, Any]] = []
        self._schedule: list[dict[str, Any]] = []
        self._exploits: list[dict[str, Any]] = []
        self._redone: set[tuple[str, int]] = set()
        self.finished = False
        self.bytes_communicated = 0   # driver <-> workers, both ways, and worker -> worker, once finished
        # index -> pid, host, launched_by, device, partitions of the latest launch
        self.workers: dict[int, dict[str, Any]] = {}
        events, self.damage = store.readable_events()
        for message in self.damage:
            warnings.warn(message, stacklevel=3)
        for event in events:
            self._apply(event)
        # What happened to the run, by journal event name (workers lost, states lost, ...).
        self.incidents: Counter[str] = Counter(event.get("event") for event in events)

    def _apply(self, record: dict[str, Any]) -> None:
        event = parse_event(record)
        if getattr(event, "trial_id", None) not in (None, *self._trials) and not isinstance(event, TrialCreated):
            return                             # its trial's creation is on a damaged line
        match event:
            case TrialCreated() as event:
                self._trials[event.trial_id] = TrialResult(event.trial_id, event.config,
                                                           warm_started_from=event.warm_started_from, _result=self)
            case EpochEnd() as event:
                trial = self._trials[event.trial_id]
                trial.epochs, trial.metrics = event.epoch, event.metrics
                best = None if trial.best_epoch is None else (trial.best_epoch, trial.best_metrics[self.metric])
                if improved(best, event.epoch, event.metrics, self.metric, self.mode):
                    trial.best_epoch, trial.best_metrics = event.epoch, event.metrics
                exploited = [e["source"] for e in self._exploits
                             if e["trial_id"] == trial.trial_id and e["epoch"] == event.epoch - 1]
                # The config this epoch trained with: PBT may have changed it since the trial began.
                self._history.append({"trial_id": trial.trial_id, "epoch": event.epoch, **event.metrics,
                                      "exploited_from": exploited[0] if exploited else None,
                                      "warm_started_from": trial.warm_started_from, **flat_config(trial.config)})
            case Exploited() as event:
                self._trials[event.trial_id].config = event.config
                self._exploits.append({k: v for k, v in event.record().items() if k != "time"})
            case SubEpoch() as event:
                if (event.trial_id, event.epoch) in self._redone:
                    return                     # re-run after a resume to rebuild a damaged checkpoint
                worker = self.workers.get(event.worker, {})   # the process it ran in at that time
                self._schedule.append({**event.record(), "host": worker.get("host"), "pid": worker.get("pid")})
            case StateLost() as event:         # those train sub-epochs ran again: the first runs count no more
                self._schedule = [row for row in self._schedule if not (
                    row["trial_id"] == event.trial_id and row["epoch"] == event.epoch and row["kind"] == "train"
                    and row["partition"] in event.partitions)]
            case TrialEnded() as event:
                trial = self._trials[event.trial_id]
                trial.status, trial.reason = event.status, event.reason
                trial.error = trial.reason if event.status.is_failure else None
            case TrialRetried() as event:
                trial = self._trials[event.trial_id]
                trial.status, trial.reason, trial.error = TrialStatus.RUNNING, None, None
            case RunExtended() as event:        # resume(..., epochs=N): the completed trials go on
                self.finished = False
                for trial_id in set(event.trials) & set(self._trials):
                    self._trials[trial_id].status, self._trials[trial_id].reason = TrialStatus.RUNNING, None
            case RunStarted() | WorkersRestarted() | WorkerReplaced() as event:
                self.finished = self.finished and not isinstance(event, RunResumed)
                self.workers = {int(index): info for index, info in event.workers.items()}
                if isinstance(event, RunResumed):   # sub-epochs of epochs the crash cut short ran again after it
                    self._redone = {(row["trial_id"], row["epoch"]) for row in self._history}
                    self._schedule = [row for row in self._schedule
                                      if (row["trial_id"], row["epoch"]) in self._redone]
            case RunFinished() as event:
                self.finished = True
                self.bytes_communicated = ((event.bytes_sent or 0) + (event.bytes_received or 0)
                                           + (event.bytes_between_workers or 0))

    @property
    def provided_build(self) -> Callable[[dict], Any] | None:
        """The ``build`` given to ``load`` or ``fit``; None where the stored one is used."""
        return self._given_build

    @property
    def build(self) -> Callable[[dict], Any]:
        """The run's ``build(config)``: the one given to ``load``, or the stored one (unpickled
        on first use: it is code, so only :meth:`TrialResult.model` and resume need it)."""
        if self._build is None:
            self._build = cloudpickle.loads(self.store.read_build())
        return self._build

    @property
    def trials(self) -> list[TrialResult]:
        """Every trial, in creation order."""
        return list(self._trials.values())

    @property
    def best(self) -> TrialResult:
        """The completed or stopped trial whose best epoch has the best ``metric`` under
        ``mode`` (its :attr:`TrialResult.best_epoch`; ``ranked(scope="last")`` ranks by the
        last epoch instead)."""
        ranked = self.ranked()
        if not ranked or not self._scored(ranked[0], "best"):
            statuses = {t.trial_id: t.status for t in self._trials.values()}
            raise RuntimeError(f"no trial of run {self.run_dir!r} finished with a finite "
                               f"{self.metric!r}; trial statuses: {statuses}")
        return ranked[0]

    def ranked(self, scope: str = "best") -> list[TrialResult]:
        """Every trial, best first: the completed and stopped ones by ``metric`` at their best
        epoch (``scope="best"``) or at their last (``"last"``); then the others (failed, still
        running, without a finite metric), in creation order. Ties keep creation order."""
        if scope not in ("best", "last"):
            raise ValueError(f"scope={scope!r} must be 'best' or 'last'")
        sign = 1 if self.mode == "min" else -1
        scored = sorted((t for t in self.trials if self._scored(t, scope)),
                        key=lambda t: sign * self._value(t, scope))
        return scored + [t for t in self.trials if not self._scored(t, scope)]

    def _value(self, trial: TrialResult, scope: str) -> float:
        metrics = trial.best_metrics if scope == "best" else trial.metrics
        value = metrics.get(self.metric)
        return value if isinstance(value, (int, float)) and math.isfinite(value) else math.nan

    def _scored(self, trial: TrialResult, scope: str) -> bool:
        return trial.status in (TrialStatus.COMPLETED, TrialStatus.STOPPED) and \
            not math.isnan(self._value(trial, scope))

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
        rows = sorted(self._history, key=lambda row: (row["trial_id"], row["epoch"]))
        return pd.DataFrame(rows, columns=None if rows else ["trial_id", "epoch"])

    def lineage(self) -> pd.DataFrame:
        """PBT's exploits, in the order they happened: after ``epoch``, ``trial_id`` took the
        state of ``source`` and went on with ``config`` instead of ``previous_config``."""
        return pd.DataFrame(self._exploits, columns=["trial_id", "epoch", "source", "previous_config", "config"])

    def schedule(self) -> pd.DataFrame:
        """One row per sub-epoch: trial_id, epoch, partition, worker, kind, start, end
        (seconds since the run started), compute (seconds in the training loop), and the
        worker's host and pid."""
        columns = ["trial_id", "epoch", "partition", "worker", "kind", "start", "end", "compute", "host", "pid"]
        return pd.DataFrame(self._schedule, columns=columns)

    def summary(self) -> pd.DataFrame:
        """One row per trial, in :meth:`ranked` order: status, epochs, ``best_epoch``, the
        metric there (``best_<metric>``) and at the last epoch (``<metric>``), why it ended,
        and its config."""
        rows = [{"trial_id": t.trial_id, "status": t.status, "epochs": t.epochs, "best_epoch": t.best_epoch,
                 f"best_{self.metric}": t.best_metrics.get(self.metric, math.nan),
                 self.metric: t.metrics.get(self.metric, math.nan), "reason": t.reason, **flat_config(t.config)}
                for t in self.ranked()]
        table = pd.DataFrame(rows)
        if not table.empty:
            table["best_epoch"] = table["best_epoch"].astype("Int64")     # a trial without one: <NA>
        return table

    def __repr__(self) -> str:
        return f"Result({self.run_dir!r}, trials={len(self._trials)}, finished={self.finished})"


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
    return Result(RunStore.open(run_dir, trust), build)


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``config`` with its nested dicts flattened to dotted names (``model.kind``), as the
    columns of ``history()`` and ``summary()``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
