"""A trained trial as a Spark pandas UDF: ``df.withColumn("prediction", udf("features"))``.

The trial's build, config and weights go to the executors once, in a broadcast; each Python
worker on an executor builds the model once (the first batch it sees) and keeps it for the
batches after. A batch is made into features as :meth:`TrialResult.predict` makes them, so
a model trained on ``Dataset.from_spark(df, features="features", ...)`` takes that column as
it is: one array (or binary) column; numeric columns go in as one array,
``udf(F.array(*columns))``, in the training's order.
"""
from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd  # at run time: Spark reads the UDF's type hints (pd.Series -> pd.Series)

from ..data import FeatureSpec, prediction_rows
from ..worker import inference_device, predict_rows

if TYPE_CHECKING:
    from ._trial_result import TrialResult

_BUILT: dict[str, Any] = {}      # in an executor's Python worker: UDF -> its built trainable and features


def spark_udf(trial: TrialResult, spark: Any, epoch: int | str = "best", batch_size: int | None = None) -> Any:
    """The pandas UDF of ``trial`` (the weights of ``epoch``), returning each row's outputs as
    an array of floats."""
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType
    from safetensors.torch import save

    result = trial._require_result()
    info = result.store.read_run_info()["data"]
    payload = {"build": result.store.read_build(), "config": dict(trial.config),
               "weights": save({k: v.contiguous() for k, v in trial.state_dict(epoch).items()}),
               "spec": [info["feature_shape"], info["feature_dtype"], info.get("feature_columns")],
               "batch_size": batch_size}
    shared, token = spark.sparkContext.broadcast(payload), uuid.uuid4().hex

    def predict(features: pd.Series) -> pd.Series:
        return _predict(shared, token, features)

    return pandas_udf(predict, ArrayType(FloatType()))


def _predict(shared: Any, key: str, features: pd.Series) -> pd.Series:
    """One batch of rows on an executor: the model's outputs, one array per row (``key``
    names the UDF: its model is built once per Python worker)."""
    if key not in _BUILT:
        import cloudpickle
        from safetensors.torch import load

        payload = shared.value
        trainable = cloudpickle.loads(payload["build"])(payload["config"])
        trainable.load_weights(load(payload["weights"]))
        _BUILT[key] = (trainable, FeatureSpec(tuple(payload["spec"][0]), *payload["spec"][1:]))
    trainable, spec = _BUILT[key]
    outputs = predict_rows(trainable, series_rows(features, spec), shared.value["batch_size"],
                           device=inference_device())
    flat = outputs.reshape(len(outputs), -1).astype(np.float32)
    return pd.Series(list(flat))


def series_rows(features: pd.Series, spec: FeatureSpec) -> np.ndarray:
    """A batch of a Spark feature column (arrays, or bytes) as the rows ``predict`` takes,
    checked against the run's shape and dtype as :func:`cerebro.data.prediction_rows` does."""
    if spec.dtype == "bytes":
        rows = features.to_numpy(dtype=object)
    else:
        rows = _as_dtype(np.stack([np.asarray(v) for v in features]).reshape(len(features), -1), spec.dtype)
        if rows.shape[1] == int(np.prod(spec.shape)):
            rows = rows.reshape(len(rows), *spec.shape)
    return prediction_rows(rows, spec)[0]


def _as_dtype(rows: np.ndarray, dtype: str) -> np.ndarray:
    """Spark's doubles and ints as the dtype the run stored (float32, uint8, ...), where no
    value changes in the cast; else the rows as they are (and predict names the mismatch)."""
    if dtype == "bytes" or str(rows.dtype) == dtype:
        return rows
    cast = rows.astype(dtype)
    if np.issubdtype(cast.dtype, np.floating) or np.array_equal(cast.astype(rows.dtype), rows):
        return cast
    return rows

