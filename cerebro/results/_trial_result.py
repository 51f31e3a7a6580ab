"""``TrialResult``: one trial of a run, its metrics and its trained weights, as a user
applies them (``state_dict``, ``model``, ``predict``, ``spark_udf``, ``save_weights``)."""
from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._checks import quoted
from ..store import BEST, RunStore, TrialStatus, UntrustedCodeError, unpack_tensors
from ..store import _files as files

# The worker package (and torch, the data package) are imported where a trial's weights or
# model are used: cb.load and cerebro status read the journal alone, and importing them
# takes a second or more.
if TYPE_CHECKING:
    import torch

    from ..worker import Trainable

_RAISED = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*:")     # "ValueError: ..."


class Run(Protocol):
    """What a trial needs of the run it is one of (a :class:`~cerebro.results.Result` is
    one, and the :class:`~cerebro.results._trial_run.TrialRun` its trials hold): its
    directory and its ``build``. A protocol, as the Result imports this module."""

    store: RunStore
    run_dir: str
    metric: str
    keep_checkpoints: int | None

    @property
    def build(self) -> Callable[[dict], Any]: ...


@dataclass
class TrialResult:
    """One trial: its configuration, status, last epoch's metrics and trained weights.

    ``status`` is ``running`` (``paused`` while the searcher holds it for others, e.g. at a
    rung) until the trial ends as completed, stopped (by the searcher or the user: ``reason``
    says why, e.g. the rung), failed (its build or training raised: see ``error``), diverged
    (non-finite loss) or timeout; a trial that had not ended when its run stopped (``cb.stop``,
    ``time_budget``, Ctrl-C, a failure: :attr:`Result.state`) is ``parked``, and a resume goes
    on with it. ``config`` is the latest one: PBT changes it (see :meth:`Result.lineage`).
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
    _result: Run | None = field(default=None, repr=False, compare=False)

    @property
    def cause(self) -> str | None:
        """``reason`` in one line: the exception a traceback ends in (``Type: message``),
        else its last line; None while the trial has no reason."""
        lines = [line.strip() for line in (self.reason or "").strip().splitlines() if line.strip()]
        found = [line for line in lines if _RAISED.match(line)] or lines
        return found[-1] if found else None

    def state_dict(self, epoch: int | str = "best") -> dict[str, torch.Tensor]:
        """The model's weights on the CPU after ``epoch``: ``"best"`` (the default: the epoch
        with the best metric, kept apart as it happened), ``"last"`` (the last finished one;
        where its checkpoint is damaged, the newest sound one's, with a warning naming the
        file and the epoch the weights are really from) or an epoch number whose weights were
        kept (a finished trial's best and last; a live one's last two too). A checkpoint
        whose weights are not all tensors raises :class:`StateMismatchError`, naming it."""
        return self._weights(epoch)[0]

    def _weights(self, epoch: int | str) -> tuple[dict[str, torch.Tensor], str, str | None]:
        """:meth:`state_dict` of ``epoch``, the checkpoint file it is from, and the digest of
        the frozen layers it was trained on (None: it has none)."""
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
                              f"weights are from epoch {sound['epoch']}", stacklevel=3)
            return _unpacked_weights(self.trial_id, sound)
        wanted = self.best_epoch if epoch == "best" else epoch
        if isinstance(wanted, bool) or not isinstance(wanted, int):
            raise ValueError(f"epoch={quoted(epoch)} must be 'best', 'last' or an epoch number")
        checkpoints = store.checkpoints(self.trial_id, kept)
        # An exploit's checkpoint holds the weights PBT copied in, not those the epoch trained.
        trained = [c for c in checkpoints if "state" in c and not c.get("exploit")]
        match = next((c for c in trained if c["epoch"] == wanted), None)
        if match is None and epoch == "best":     # a run from before best epochs were kept, or damaged
            warnings.warn(f"{self.trial_id} kept no sound weights of its best epoch {wanted}; these are its last "
                          f"epoch's", stacklevel=3)
            return self._weights("last")
        if match is None:
            raise ValueError(f"{self.trial_id} kept no weights of epoch {wanted}; it kept epochs "
                             f"{sorted({c['epoch'] for c in trained})}")
        return _unpacked_weights(self.trial_id, match)

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
        it back. A trial with frozen layers (``TorchTrainable(frozen=...)``) writes the weights
        of :meth:`model` (``torch.nn.Sequential(frozen, model)``: ``0.*`` the frozen layers',
        ``1.*`` the trained ones'), so the file alone serves it."""
        from safetensors.torch import save_file

        from ..worker._frozen_weights import restore_frozen
        path = files.check_output(path, "path")
        number = self.epoch_number(epoch)
        weights, source, frozen = self._weights(epoch)
        try:
            built = self._build()
        except UntrustedCodeError:      # a run not signed by you: its weights are data, written as they are
            built = None
        if built is not None:
            _check_fit(built, weights, source, self.trial_id)
            if built.frozen_part() is not None:
                built.load_weights(weights)
                restore_frozen(built, frozen, self._require_result().store, self.trial_id)
                weights = built.trained_weights()
        save_file(weights, path,
                  metadata={"trial_id": self.trial_id, "epoch": str(number), "config": json.dumps(self.config)})

    def model(self, epoch: int | str = "best") -> Any:
        """The model that ``build(config)`` makes (a ``torch.nn.Module`` in eval mode, or a
        ``keras.Model``), with the weights of ``epoch`` (see :meth:`state_dict`) loaded."""
        return self.trainable(epoch).trained_model()

    def trainable(self, epoch: int | str = "best") -> Trainable:
        """What ``build(config)`` returns, with the weights of ``epoch`` loaded; weights that
        are not that model's (a key missing or unknown, another shape or dtype) raise
        :class:`StateMismatchError`, naming the checkpoint file and the first difference."""
        from ..worker._frozen_weights import restore_frozen
        trainable = self._build()
        weights, source, frozen = self._weights(epoch)
        _check_fit(trainable, weights, source, self.trial_id)
        trainable.load_weights(weights)
        restore_frozen(trainable, frozen, self._require_result().store, self.trial_id)
        return trainable

    def _build(self) -> Trainable:
        from ..worker import Trainable
        from ..worker._trainable import not_a_trainable
        trainable = self._require_result().build(self.config)
        if not isinstance(trainable, Trainable):
            raise not_a_trainable(trainable)
        return trainable

    def predict(self, data: Any, *, epoch: int | str = "best", batch_size: int | None = None) -> np.ndarray:
        """The model's outputs for ``data`` (a numpy array, a pandas DataFrame with the
        training's feature columns, a Parquet path or a :class:`cerebro.Dataset`), one row per
        input row, in order: the weights of ``epoch`` (see :meth:`state_dict`), the rows made
        as evaluation made them in training (the ``eval_transform``, not ``transform``), in
        batches of ``batch_size`` (default: the trainable's), on the GPU where there is one.
        Rows of another shape or dtype than the run's are refused before any batch runs.

        Example (a fragment: ``result`` is a finished run's):
            >>> outputs = result.best.predict(X_test)          # (rows, outputs), e.g. logits  # doctest: +SKIP
        """
        from ..data import FeatureSpec, prediction_rows
        from ..worker import predict_rows
        from ..worker._trainable import positive_batch_size
        if batch_size is not None:      # before the model is built and the rows read
            positive_batch_size(batch_size)
        spec = FeatureSpec.of_run(self._require_result().store.read_run_info()["data"])
        features, _ = prediction_rows(data, spec)
        return predict_rows(self.trainable(epoch), features, batch_size)

    def spark_udf(self, spark: Any, *, epoch: int | str = "best", batch_size: int | None = None) -> Any:
        """A Spark pandas UDF that runs this trial's model (the weights of ``epoch``, in batches
        of ``batch_size`` rows, default the trial's) on the
        executors: weights broadcast once, the model built once per Python worker; it takes
        the feature column (an array column; numeric columns as ``F.array(*columns)``, in the
        training's order) and returns each row's outputs as an array of floats. The build is
        the run's (see :mod:`cerebro.serve._udf`).

        Example (a fragment: it needs a Spark session and a finished run):
            >>> udf = result.best.spark_udf(spark)  # doctest: +SKIP
            >>> spark_df.withColumn("prediction", udf("features"))  # doctest: +SKIP
        """
        from ..serve._udf import spark_udf  # the serving adapter: see pyproject's layer contract
        return spark_udf(spark, self._require_result().store, self.config, self.state_dict(epoch), batch_size)

    def epoch_number(self, epoch: int | str) -> int:
        """The epoch number ``epoch`` (as :meth:`state_dict` takes it) names."""
        if epoch == "best" and self.best_epoch is not None:
            return self.best_epoch
        if epoch in ("best", "last"):
            return self.epochs
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise ValueError(f"epoch={quoted(epoch)} must be 'best', 'last' or an epoch number")
        return epoch

    def _require_result(self) -> Run:
        if self._result is None:
            raise RuntimeError(f"trial {self.trial_id} is not attached to a run directory")
        return self._result


def _unpacked_weights(trial_id: str, checkpoint: dict[str, Any]) -> tuple[dict[str, torch.Tensor], str, str | None]:
    """The weights of a checkpoint read by :meth:`RunStore.checkpoints`, its file, and the
    digest of the frozen layers its state names. Its CRC says its bytes are those written,
    not that they are weights: they are checked to be."""
    from ..worker import StateMismatchError
    from ..worker._state_check import check_tensors, model_part
    try:
        weights = unpack_tensors(model_part(checkpoint["state"]))
        check_tensors(weights)
    except StateMismatchError as error:
        raise StateMismatchError(f"the checkpoint {checkpoint['path']} does not hold {trial_id}'s weights: "
                                 f"{error}") from None
    frozen = checkpoint["state"].get("frozen")
    return weights, checkpoint["path"], frozen if isinstance(frozen, str) else None


def _check_fit(trainable: Trainable, weights: dict[str, torch.Tensor], source: str, trial_id: str) -> None:
    """Raise :class:`StateMismatchError` naming ``source`` where ``weights`` are not the
    model ``build(config)`` makes: loaded, they would fail in the framework, or not fail
    (another dtype is cast) and an export would write a tensor that is no model's."""
    from ..worker import StateMismatchError
    try:
        trainable.check_weights(weights)
    except StateMismatchError as error:
        raise StateMismatchError(f"the checkpoint {source} does not fit {trial_id}'s model as build(config) "
                                 f"makes it: {error}") from None


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


def rounded(config: dict[str, Any]) -> str:
    """``lr=0.003162 hidden=64``: a config's (dotted) keys with floats to 4 significant digits.

    >>> rounded({"lr": 0.0031622776601683794, "model": {"kind": "mlp", "hidden": 64}})
    'lr=0.003162 model.kind=mlp model.hidden=64'
    """
    return " ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
                    for key, value in flat_config(config).items())
