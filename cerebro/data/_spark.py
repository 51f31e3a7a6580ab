"""``Dataset.from_spark``: partitions written by Spark's executors, never through the driver.

Rows go to splits and partitions by hashes of their content and the seed, so the result does
not depend on how the DataFrame happens to be partitioned. Each (split, partition) group is
written by the executor that holds it, as one Parquet file in the same format
:func:`cerebro.data.write_partitions` writes, so either backend can train on it.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._checks import quoted
from ._dataset import Dataset
from ._groups import RECORD_SCHEMA, CountedRows, GroupForm, assemble, write_rows
from ._partitions import BYTES, PartitionLayout
from ._spark_columns import column_type, numeric_types, spark_features
from ._spark_python import explained, use_the_drivers_python_locally

if TYPE_CHECKING:
    import pandas as pd

_VALIDATION_BUCKETS = 1_000_000


class SparkDataset(CountedRows, Dataset, constructors=("from_spark",)):
    """Training data that stays in Spark until ``fit`` writes its partitions; made by
    :meth:`cerebro.Dataset.from_spark`."""

    def __init__(self, df: Any, *, features: str | Sequence[str], label: str, validation: Any = 0.2,
                 partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                 cache_dir: str | os.PathLike | None = None) -> None:
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        if not isinstance(df, DataFrame):
            raise TypeError(f"from_spark needs a pyspark.sql.DataFrame; got {type(df).__name__}")
        use_the_drivers_python_locally(df.sparkSession.sparkContext)
        super().__init__(validation=validation, partitions=partitions, seed=seed, in_memory=in_memory,
                         cache_dir=cache_dir)
        label_type = column_type(df, label)
        if not isinstance(label_type, numeric_types()):
            raise TypeError(f"label column {label!r} must be numeric; it is {label_type.simpleString()}: encode "
                            f"the classes as indices first, e.g. pyspark.ml.feature.StringIndexer(inputCol={label!r}, "
                            f"outputCol='label_index')")
        integral = isinstance(label_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType))
        self._label_dtype = "int64" if integral else "float32"
        label_column = F.col(label).cast("long" if integral else "float")
        chosen = spark_features(df, features)
        feature_column, self._binary, self._feature_shape = chosen.column, chosen.binary, chosen.shape
        self.feature_columns = names = chosen.names

        marked, fraction = _validation_split(df, validation)

        # Rows are told apart by content and, among identical rows, by their ordinal, so
        # hashes spread duplicates too and nothing depends on the input's partitioning.
        from pyspark.sql import Window
        base = df.select(feature_column.alias("features"), label_column.alias("label"), marked.alias("marked"))
        self._rows = base.select("features", "label")     # as they are, before the split's window
        identical = Window.partitionBy(F.xxhash64("features", "label", "marked")).orderBy(F.lit(0))
        base = base.withColumn("copy", F.row_number().over(identical))
        if fraction is not None:
            draw = F.pmod(F.xxhash64(F.lit(self.seed), "features", "label", "copy"), F.lit(_VALIDATION_BUCKETS))
            is_validation = draw < F.lit(int(round(fraction * _VALIDATION_BUCKETS)))
        else:
            is_validation = F.col("marked")
        prepared = base.select("features", "label", "copy", is_validation.alias("is_validation"))
        stats = _statistics(prepared, self._binary)
        shown = names[0] if len(names) == 1 else names
        _check_statistics(stats, shown, label)
        self._prepared = prepared
        self._feature_length = int(stats["max_size"] or 0)    # bytes: their mean length
        if self._feature_shape is not None and int(np.prod(self._feature_shape)) != self._feature_length:
            raise ValueError(f"feature column {shown!r} holds arrays of shape {self._feature_shape} in its first row "
                             f"and of {self._feature_length} values in others; every row needs the same shape")
        self._label_range = (int(stats["min_label"]), int(stats["max_label"])) if integral else None
        self._val_rows = int(stats["validation_rows"] or 0)
        self._train_rows = int(stats["rows"]) - self._val_rows
        if self._train_rows == 0:
            raise ValueError(f"validation={validation!r} leaves no training rows out of {stats['rows']}")
        self._fingerprint: str | None = None
        if self.partitions is not None:
            self.check_partitions(self.partitions)

    @classmethod
    def from_spark(cls, df: Any, *, features: str | Sequence[str], label: str, validation: Any = 0.2,
                   partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                   cache_dir: str | os.PathLike | None = None) -> SparkDataset:
        """See :meth:`cerebro.Dataset.from_spark`."""
        return cls(df, features=features, label=label, validation=validation, partitions=partitions, seed=seed,
                   in_memory=in_memory, cache_dir=cache_dir)

    def __repr__(self) -> str:
        # An array column's length is known only once written.
        shape = "" if self._binary or self._feature_shape is None else f" {self._feature_shape}"
        return self._repr(self._val_rows, f"{self.feature_dtype}{shape}", self._label_dtype)

    @property
    def feature_dtype(self) -> str:
        """The features' dtype as stored: bytes, or float32 (Spark's numbers become float32)."""
        return BYTES if self._binary else "float32"

    def label_range(self) -> tuple[int, int] | None:
        """See :meth:`Dataset.label_range` (counted with the other statistics, in one job)."""
        return self._label_range

    def sample(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` rows of the data (training or validation: the checks need only their form),
        as the workers load them: one small job, without the shuffle that the split's window
        over all rows would take."""
        group: pd.DataFrame = self._rows.limit(rows).toPandas()
        label = group["label"].to_numpy().astype(self._label_dtype)
        if self._binary:
            return np.array([bytes(v) for v in group["features"]], dtype=object), label
        shape = self._feature_shape or (self._feature_length,)
        features = np.stack(group["features"].map(np.asarray).to_numpy()).astype(np.float32)
        return features.reshape(len(group), *shape), label

    def write(self, data_dir: str, num_partitions: int) -> PartitionLayout:
        """Write every (split, partition) from the executor that holds it; nothing is collected."""
        from pyspark.sql import functions as F

        self.check_partitions(num_partitions)
        keyed = self._prepared.select(
            "features", "label", F.when(F.col("is_validation"), "val").otherwise("train").alias("split"),
            F.pmod(F.xxhash64(F.lit(self.seed + 1), "features", "label", "copy"),
                   F.lit(num_partitions)).alias("partition"),
            F.xxhash64(F.lit(self.seed + 2), "features", "label", "copy").alias("order"))
        feature_length = None if self._binary else self._feature_length
        row_bytes = self._feature_length + 8 if self._binary else 4 * (self._feature_length + 1)
        shape = () if self._binary else self._feature_shape or (self._feature_length,)
        form = GroupForm(self.feature_dtype, shape, self._label_dtype, row_bytes)

        def write_group(group: pd.DataFrame) -> pd.DataFrame:
            return _write_group(data_dir, feature_length, form.group_rows, group)

        try:
            written = keyed.groupBy("split", "partition").applyInPandas(write_group, schema=RECORD_SCHEMA).collect()
        except Exception as error:
            raise explained(error, self._prepared.sparkSession.sparkContext) from None
        layout, self._fingerprint = assemble(data_dir, num_partitions, (r.asDict() for r in written), form,
                                             self._train_rows)
        return layout

    def fingerprint(self) -> str:
        """A hash of the partitions' rows, known once :meth:`write` has written them."""
        if self._fingerprint is None:
            raise RuntimeError("a Spark dataset's fingerprint is known once fit has written its partitions")
        return self._fingerprint


def _write_group(data_dir: str, feature_length: int | None, group_rows: int, group: pd.DataFrame) -> pd.DataFrame:
    """Runs on an executor: writes one (split, partition) group, rows in their seeded order
    (``feature_length`` None: the features are bytes)."""
    group = group.sort_values(["order", "label"], kind="stable")
    if feature_length is None:
        features = np.array([bytes(v) for v in group["features"]], dtype=object)
    else:
        features = np.stack(group["features"].to_numpy()).astype(np.float32, copy=False).reshape(len(group),
                                                                                                feature_length)
    record = write_rows(data_dir, str(group["split"].iloc[0]), int(group["partition"].iloc[0]), features,
                        group["label"].to_numpy(), group_rows)
    import pandas as pd  # on Spark's executors only: workers import this module too

    return pd.DataFrame({key: [value] for key, value in record.items()})


def _validation_split(df: Any, validation: Any) -> tuple[Any, float | None]:
    """(the column marking validation rows, the fraction to draw instead) for ``validation``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if validation is None or (isinstance(validation, (int, float)) and not isinstance(validation, bool)
                              and validation == 0):
        return F.lit(False), None
    if isinstance(validation, str):
        marker = column_type(df, validation)
        if not isinstance(marker, (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            raise TypeError(f"validation column {validation!r} must be boolean or integer (non-zero marks "
                            f"a validation row); it is {marker.simpleString()}")
        return F.coalesce(F.col(validation).cast("boolean"), F.lit(False)), None
    if isinstance(validation, float) and 0 < validation < 1:
        return F.lit(False), validation
    raise ValueError(f"validation={quoted(validation)} must be a fraction in [0, 1), the name of a boolean "
                     f"column marking validation rows, or None")


def _statistics(prepared: Any, binary: bool) -> Any:
    """One Spark job over the prepared rows: counts of rows, of bad values, sizes, validation rows."""
    from pyspark.sql import functions as F

    if binary:     # bytes of any length, none of them NaN
        null, nan = F.col("features").isNull(), F.lit(False)
        min_size = max_size = F.avg(F.length("features"))
    else:
        null = F.col("features").isNull() | F.exists("features", lambda x: x.isNull())
        nan = F.exists("features", lambda x: F.isnan(x) | (F.abs(x) == float("inf")))
        min_size, max_size = F.min(F.size("features")), F.max(F.size("features"))
    return prepared.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(null, 1).otherwise(0)).alias("null_features"),
        F.sum(F.when(nan, 1).otherwise(0)).alias("nan_features"),
        F.sum(F.when(F.col("label").isNull(), 1).otherwise(0)).alias("null_labels"),
        F.sum(F.when(F.isnan("label") | (F.abs("label") == float("inf")), 1).otherwise(0)).alias("nan_labels"),
        F.min("label").alias("min_label"), F.max("label").alias("max_label"),
        min_size.alias("min_size"), max_size.alias("max_size"),
        F.sum(F.col("is_validation").cast("long")).alias("validation_rows"),
    ).first()


def _check_statistics(stats: Any, shown: Any, label: str) -> None:
    """Refuses data that is empty, holds nulls, NaN or infinities, or arrays of unequal lengths."""
    if stats["rows"] == 0:
        raise ValueError("data is empty: the DataFrame has 0 rows")
    if stats["null_features"]:
        raise ValueError(f"feature column {shown!r}: {stats['null_features']} rows hold nulls")
    if stats["nan_features"]:
        raise ValueError(f"feature column {shown!r}: {stats['nan_features']} rows hold NaN or infinite values")
    if stats["null_labels"]:
        raise ValueError(f"label column {label!r}: {stats['null_labels']} rows hold nulls")
    if stats["nan_labels"]:
        raise ValueError(f"label column {label!r}: {stats['nan_labels']} rows hold NaN or infinite values")
    if stats["min_size"] != stats["max_size"]:
        raise ValueError(f"feature column {shown!r} holds arrays of different lengths "
                         f"({stats['min_size']} to {stats['max_size']}); every row needs the same length")
