"""A trained trial as a Spark pandas UDF: ``df.withColumn("prediction", udf("features"))``.

The trial's build, config and weights go to the executors once, in a broadcast; each Python
worker on an executor builds the model once (the first batch it sees) and keeps it for the
batches after. A batch is made into features as :meth:`TrialResult.predict` makes them, from
the columns the UDF is called on: one array column (of any depth), one pyspark.ml Vector
column (dense or sparse rows, such as ``VectorAssembler``'s), one binary column, or numeric
columns, one feature each in the training's order (``udf("x0", "x1", ...)``).

The UDF's function travels to the executors by value and imports Cerebro there only when it
runs (:func:`cerebro.data._spark_python.importer`), so an executor's Python without Cerebro
says which Python it is.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd  # at run time: Spark reads the UDF's type hints (pd.Series -> pd.Series)

from ..data import FeatureSpec, prediction_rows
from ..data._spark_python import importer, use_the_drivers_python_locally
from ..store import RunStore
from ..worker import inference_device, predict_rows

_BUILT: dict[str, Any] = {}      # in an executor's Python worker: UDF -> its built trainable and features
_VECTOR_FIELDS = {"type", "size", "indices", "values"}   # a Vector's struct, as Arrow hands it to pandas
_DENSE = 1


def spark_udf(spark: Any, store: RunStore, config: dict[str, Any], weights: dict[str, Any],
              batch_size: int | None = None) -> Any:
    """The pandas UDF of a trial of the run in ``store`` (its ``config`` and ``weights``, as
    :meth:`cerebro.TrialResult.spark_udf` hands them), returning each row's outputs as an
    array of floats."""
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType
    from safetensors.torch import save

    context = spark.sparkContext
    use_the_drivers_python_locally(context)
    info = store.read_run_info()["data"]
    payload = {"build": store.read_build(), "config": dict(config),
               "weights": save({k: v.contiguous() for k, v in weights.items()}),
               "spec": [info["feature_shape"], info["feature_dtype"], info.get("feature_columns")],
               "batch_size": batch_size}
    shared, token = context.broadcast(payload), uuid.uuid4().hex
    load = importer(context, __name__, "_predict")

    def predict(*columns: pd.Series) -> pd.Series:
        return load()(shared, token, columns)

    # pyspark's overloads want the functionType that the type hints give here (Series to Series).
    return pandas_udf(predict, ArrayType(FloatType()))  # type: ignore[call-overload]


def _predict(shared: Any, key: str, columns: Sequence[pd.Series | pd.DataFrame]) -> pd.Series:
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
    outputs = predict_rows(trainable, batch_rows(columns, spec), shared.value["batch_size"],
                           device=inference_device())
    flat = outputs.reshape(len(outputs), -1).astype(np.float32)
    return pd.Series(list(flat))


def batch_rows(columns: Sequence[pd.Series | pd.DataFrame], spec: FeatureSpec) -> np.ndarray:
    """A batch of the columns a UDF was called on as the rows ``predict`` takes, checked
    against the run's shape and dtype as :func:`cerebro.data.prediction_rows` does."""
    if not columns:
        raise TypeError("the UDF needs the feature columns: udf('features'), or udf('x0', 'x1', ...) for numeric "
                        "columns in the training's order")
    if len(columns) > 1:
        rows = np.column_stack([_numbers(column, index, len(columns)) for index, column in enumerate(columns)])
    elif isinstance(columns[0], pd.DataFrame):
        rows = _vector_rows(columns[0])
    elif spec.dtype == "bytes":
        return prediction_rows(columns[0].to_numpy(dtype=object), spec)[0]
    else:
        rows = np.stack([np.asarray(v) for v in columns[0]])
    rows = _as_dtype(rows.reshape(len(rows), -1), spec.dtype)
    if rows.shape[1] == int(np.prod(spec.shape)):
        rows = rows.reshape(len(rows), *spec.shape)
    return prediction_rows(rows, spec)[0]


def _numbers(column: pd.Series, index: int, count: int) -> np.ndarray:
    """One of several numeric columns: one feature a row."""
    try:
        return column.to_numpy(dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"the UDF called on {count} columns takes numeric columns, one feature each; column "
                        f"{index + 1} holds {column.dtype} values such as {column.iloc[0]!r}: call it on one array "
                        f"or Vector column alone") from None


def _vector_rows(vectors: pd.DataFrame) -> np.ndarray:
    """A batch of a pyspark.ml Vector column (Arrow gives pandas its struct: type 1 dense, 0
    sparse; size; indices; values) as dense rows."""
    if set(vectors.columns) != _VECTOR_FIELDS:
        raise TypeError(f"the UDF takes an array, Vector, binary or numeric column; it got a struct of "
                        f"{list(vectors.columns)}")
    if vectors["type"].isna().any():
        raise ValueError(f"the Vector column holds nulls in {int(vectors['type'].isna().sum())} of {len(vectors)} rows")
    dense = vectors["type"].to_numpy() == _DENSE
    sizes = [len(values) if is_dense else int(size)
             for is_dense, size, values in zip(dense, vectors["size"], vectors["values"])]
    if len(set(sizes)) > 1:
        raise ValueError(f"the Vector column holds vectors of sizes {sorted(set(sizes))}; every row needs the same "
                         f"size")
    rows = np.zeros((len(vectors), sizes[0]), dtype=np.float64)
    for row, (is_dense, indices, values) in enumerate(zip(dense, vectors["indices"], vectors["values"])):
        rows[row, slice(None) if is_dense else indices] = values
    return rows


def _as_dtype(rows: np.ndarray, dtype: str) -> np.ndarray:
    """Spark's doubles and ints as the dtype the run stored (float32, uint8, ...), where no
    value changes in the cast; else the rows as they are (and predict names the mismatch)."""
    if dtype == "bytes" or str(rows.dtype) == dtype:
        return rows
    cast = rows.astype(dtype)
    if np.issubdtype(cast.dtype, np.floating) or np.array_equal(cast.astype(rows.dtype), rows):
        return cast
    return rows
