"""``cb.predict(..., backend="spark")``: batch inference in Spark tasks, with the trial's pandas
UDF (:mod:`cerebro.serve._udf`: the weights broadcast once, the model built once per Python
worker on an executor).

Where the rows come from decides where they are cut and how their order is kept:

- a Spark DataFrame stays where it is, in its partitions: the answer is a Spark DataFrame, the
  input's rows projected (a projection keeps each partition's rows in order), computed when an
  action runs;
- a Parquet path is read by the executors; each row keeps its file and its index in that file
  (Spark's ``_metadata`` columns), and the answer comes back sorted by them, the order
  ``pandas.read_parquet`` gives;
- numpy, pandas or a ``cb.Dataset`` are checked in the driver, numbered and sent to Spark,
  and the answer comes back in their order.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from ..data import FeatureSpec, prediction_rows
from ..data._spark_columns import recorded_features, spark_features
from ..data._spark_python import importer, use_the_drivers_python_locally
from ..results import TrialResult
from ._outputs import top_k_classes
from ._udf import batch_rows

ID_COLUMN = "id"
_FILE, _ROW = "_cerebro_file", "_cerebro_row"   # the order a Parquet path or in-driver rows had


def spark_predict(spark: Any, trial: TrialResult, epoch: int | str, data: Any, spec: FeatureSpec, *,
                  workers: int | None, top_k: int | None, batch_size: int | None) -> tuple[Any, list[str]]:
    """(the answer as a Spark DataFrame, the columns to sort it by to get the input's order,
    none for a Spark DataFrame). The features are checked, and the output width found, on one
    row in the driver before any task runs."""
    use_the_drivers_python_locally(spark.sparkContext)
    source, order = _source(spark, data, spec, workers)
    features = _features(source, spec, order)
    first = source.select(features.alias("features")).limit(1).toPandas()
    if first.empty:
        raise ValueError("data has no rows to predict")
    outputs = trial.predict(batch_rows([first["features"]], spec), epoch=epoch, batch_size=batch_size)
    width = int(np.prod(outputs.shape[1:]))
    if top_k is not None:
        top_k_classes(outputs.reshape(len(outputs), -1), top_k)      # refuses a k beyond the classes first
    keep = [ID_COLUMN] if ID_COLUMN in source.columns and ID_COLUMN not in (spec.columns or ()) else []
    udf = trial.spark_udf(spark, epoch=epoch, batch_size=batch_size)
    scored = source.select(*keep, *order, udf(features).alias("_outputs"))
    columns = _top_k_columns(scored, top_k) if top_k is not None else _output_columns(width)
    return scored.select(*keep, *order, *columns), order


def _source(spark: Any, data: Any, spec: FeatureSpec, workers: int | None) -> tuple[Any, list[str]]:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if isinstance(data, DataFrame):
        if workers is not None:     # a shuffle would lose the order the answer keeps
            raise ValueError(f"workers={workers} with a Spark DataFrame: it is predicted in its own "
                             f"{data.rdd.getNumPartitions()} partitions, its rows in their order; "
                             f"repartition it first for more or fewer tasks")
        return data, []
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if "://" not in path and not os.path.exists(path):
            raise FileNotFoundError(f"Parquet path {path!r} does not exist")
        rows = spark.read.parquet(path).select("*", F.col("_metadata.file_path").alias(_FILE),
                                               F.col("_metadata.row_index").alias(_ROW))
        return (rows if workers is None else rows.repartitionByRange(workers, _FILE, _ROW)), [_FILE, _ROW]
    features, ids = prediction_rows(data, spec)         # refused here, before Spark sees a row
    frame = pd.DataFrame({_ROW: np.arange(len(features)),
                          "features": list(features if features.dtype == object
                                           else features.reshape(len(features), -1))})
    if ids is not None:
        frame.insert(0, ID_COLUMN, ids)
    slices = workers or spark.sparkContext.defaultParallelism
    return spark.createDataFrame(frame).repartitionByRange(slices, _ROW), [_ROW]


def _features(source: Any, spec: FeatureSpec, order: list[str]) -> Any:
    """The feature column of ``source`` as training made it: the run's recorded columns, else
    (features that had no names, such as ``from_numpy``'s) a column named ``features``."""
    if order == [_ROW]:
        return spark_features(source, "features").column
    if spec.columns is not None:
        missing = [c for c in spec.columns if c not in source.columns]
        if missing:
            raise ValueError(f"the data lacks the feature columns {missing} the run trained on "
                             f"({list(spec.columns)}); its columns are {source.columns}")
        return spark_features(source, recorded_features(source, spec.columns)).column
    if "features" not in source.columns:
        raise ValueError(f"the run's features had no column names (numpy arrays), so Spark data needs them in one "
                         f"column named 'features'; its columns are {source.columns}")
    return spark_features(source, "features").column


def _output_columns(width: int) -> list[Any]:
    """The outputs as ``predict``'s table has them: ``output`` for one value a row, else
    ``output_0``, ``output_1``, ..."""
    from pyspark.sql import functions as F

    if width == 1:
        return [F.col("_outputs")[0].alias("output")]
    return [F.col("_outputs")[i].alias(f"output_{i}") for i in range(width)]


def _top_k_columns(scored: Any, k: int) -> list[Any]:
    """``class_1, prob_1, ...``: the k likeliest classes of each row's outputs, as
    :func:`cerebro.serve.top_k_classes` ranks them (the decision whether outputs are
    probabilities or logits is taken row by row, so Spark's batching cannot change it)."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    names = [name for rank in range(1, k + 1) for name in (f"class_{rank}", f"prob_{rank}")]
    schema = ", ".join(f"{name} {'long' if name.startswith('class') else 'double'}" for name in names)
    load = importer(scored.sparkSession.sparkContext, top_k_classes.__module__, top_k_classes.__name__)

    def ranked(outputs: pd.Series) -> pd.DataFrame:
        return load()(np.stack(outputs.to_numpy()), k)

    # pyspark's overloads want the functionType that the type hints give here (Series to DataFrame).
    top = pandas_udf(ranked, schema)(F.col("_outputs"))  # type: ignore[call-overload]
    return [top[name].alias(name) for name in names]
