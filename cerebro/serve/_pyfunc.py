"""A trained trial as an MLflow pyfunc model: ``mlflow.pyfunc.load_model(path).predict(rows)``
gives :meth:`TrialResult.predict`'s outputs without the run directory.

The model directory holds the trial's weights (safetensors), its ``build`` (cloudpickled by
MLflow with the model object), its config and the run's feature layout, and Cerebro's own
source (``code_paths``), so loading it needs the frameworks but not a Cerebro install. The
signature is inferred from a batch of the run's feature shape (a table of its feature
columns where the features had names).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..data import FeatureSpec, prediction_rows
from ..worker import predict_rows

if TYPE_CHECKING:
    from ..results import TrialResult

# What MLflow says of predict's type hints, which are no input schema: the signature is.
_NO_SCHEMA_WARNINGS = ("Type hint used in the model's predict", "Failed to infer signature from type hint",
                       "Add type hints to the `predict` method")


def save_pyfunc(trial: TrialResult, path: str, epoch: int | str = "best") -> None:
    """Write ``trial`` (the weights of ``epoch``) as an MLflow pyfunc model in ``path``."""
    import mlflow.pyfunc
    from mlflow.models import infer_signature
    from safetensors.torch import save_file

    result = trial._require_result()
    info = result.store.read_run_info()
    spec = FeatureSpec.of_run(info["data"])
    with _quiet_mlflow():
        model = _model_class()(result.build, dict(trial.config), spec)
    example = _example(spec)
    with tempfile.TemporaryDirectory(prefix="cerebro-pyfunc-") as scratch:
        weights = os.path.join(scratch, "weights.safetensors")
        save_file({k: v.contiguous() for k, v in _weights(trial, epoch).items()}, weights)
        outputs = predict_rows(_loaded(model, weights), prediction_rows(example, spec)[0])
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with _quiet_mlflow():
            mlflow.pyfunc.save_model(
                path, python_model=model, artifacts={"weights": weights}, code_paths=[package],
                signature=infer_signature(example, outputs), input_example=example,
                metadata={"cerebro": json.dumps({"trial_id": trial.trial_id, "config": trial.config,
                                                 "epoch": trial.epoch_number(epoch), "run_dir": result.run_dir,
                                                 "metric": result.metric, "best_metrics": trial.best_metrics})})


@contextlib.contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """Without MLflow's progress bar for the weights it copies, its warning that a model
    object is cloudpickled (the build is code, pickled by design: the model directory is as
    trusted as the run it came from), and those that ``predict``'s type hints are no input
    schema (the signature, inferred from an example, is)."""
    logger = logging.getLogger("mlflow.pyfunc")
    level, bar = logger.level, os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    logger.setLevel(logging.ERROR)
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        with warnings.catch_warnings():
            # Not a filter: MLflow's own functions put "once" filters before any of ours.
            passed_on = warnings.showwarning

            def show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
                if not any(said in str(message) for said in _NO_SCHEMA_WARNINGS):
                    passed_on(message, *args, **kwargs)
            warnings.showwarning = show
            yield
    finally:
        logger.setLevel(level)
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar


def _example(spec: FeatureSpec) -> Any:
    """Two rows of the run's features: a DataFrame of its feature columns, else an array."""
    rows = np.zeros((2, *spec.shape), dtype=spec.dtype)
    if spec.columns is None or len(spec.columns) != int(np.prod(spec.shape)):
        return rows
    import pandas as pd
    return pd.DataFrame(rows.reshape(2, -1), columns=list(spec.columns))


def _weights(trial: TrialResult, epoch: int | str) -> dict[str, Any]:
    """What the served model loads: the trial's weights, and a torch trial's frozen layers'
    too (``0.*`` and ``1.*``, as :meth:`TrialResult.model` holds them), so it serves the
    weights it trained on wherever ``build`` finds other pretrained ones."""
    trainable = trial.trainable(epoch)
    if _composed(trainable):
        return trainable.trained_weights()
    return trial.state_dict(epoch)


def _composed(trainable: Any) -> bool:
    return isinstance(getattr(trainable, "frozen", None), torch.nn.Module)


def _loaded(model: Any, weights: str) -> Any:
    from safetensors.torch import load_file
    trainable = model.build(model.config)
    if _composed(trainable):
        trainable.trained_model().load_state_dict(load_file(weights))
    else:
        trainable.load_weights(load_file(weights))
    return trainable


def _model_class() -> type:
    """:class:`TrialModel`, made on first use: mlflow is an optional dependency."""
    from mlflow.pyfunc import PythonModel

    class TrialModel(PythonModel):
        """Rows in (as ``TrialResult.predict`` takes them), the model's outputs out."""

        def __init__(self, build: Any, config: dict[str, Any], spec: FeatureSpec) -> None:
            self.build, self.config, self.spec = build, config, spec

        def load_context(self, context: Any) -> None:
            self._trainable = _loaded(self, context.artifacts["weights"])

        def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
            return predict_rows(self._trainable, prediction_rows(model_input, self.spec)[0])

    return TrialModel
