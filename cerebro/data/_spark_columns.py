"""The features of a Spark DataFrame as one column: what ``Dataset.from_spark`` trains on and
what ``cb.predict(..., backend="spark")`` predicts from, made the same way for both."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SparkFeatures:
    """``column``: each row's features as one ``array<float>`` (or the binary column as it is);
    ``shape``: an N-D array column's row shape (its first row's), else None; ``names``: the
    columns the features come from, in order."""

    column: Any
    binary: bool
    shape: tuple[int, ...] | None
    names: list[str]


def column_type(df: Any, name: str) -> Any:
    """The Spark type of ``df``'s column ``name``; refuses a name it does not have."""
    fields = {f.name: f.dataType for f in df.schema.fields}
    if name not in fields:
        raise ValueError(f"column {name!r} is not in the DataFrame; columns are {list(fields)}")
    return fields[name]


def numeric_types() -> tuple[type, ...]:
    from pyspark.sql import types as T
    return (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType,
            T.BooleanType)


def spark_features(df: Any, features: str | Sequence[str]) -> SparkFeatures:
    """The features of ``df``: one column (an array of numbers of any depth, stored flat; a
    pyspark.ml Vector; binary, such as encoded images) or numeric columns made one array."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not isinstance(features, str):
        names = list(features)
        if not names:
            raise ValueError("features=[] must name at least one column")
        for name in names:
            if not isinstance(column_type(df, name), numeric_types()):
                raise TypeError(f"feature column {name!r} must be numeric; it is "
                                f"{column_type(df, name).simpleString()}")
        return SparkFeatures(F.array(*[F.col(n).cast("float") for n in names]), False, None, names)
    kind = column_type(df, features)
    depth, element = 0, kind
    while isinstance(element, T.ArrayType):
        depth, element = depth + 1, element.elementType
    if isinstance(kind, T.BinaryType):       # encoded images: the trainer's transform decodes them
        return SparkFeatures(F.col(features), True, None, [features])
    if depth and isinstance(element, numeric_types()):
        column = F.col(features)
        for _ in range(depth - 1):           # N-D arrays: stored flat, read back in their shape
            column = F.flatten(column)
        shape = None
        if depth > 1:
            first = df.select(features).first()
            shape = np.asarray(first[0]).shape if first is not None else None
        return SparkFeatures(column.cast("array<float>"), False, shape, [features])
    if type(kind).__name__ == "VectorUDT":
        from pyspark.ml.functions import vector_to_array
        return SparkFeatures(vector_to_array(F.col(features), "float32"), False, None, [features])
    raise TypeError(f"feature column {features!r} must be an array of numbers (of any depth), a "
                    f"pyspark.ml Vector or binary; it is {kind.simpleString()}")


def recorded_features(df: Any, names: Sequence[str]) -> str | list[str]:
    """The ``features`` argument that made a run's recorded feature columns ``names``: one
    array, Vector or binary column by its name, else the numeric columns."""
    if len(names) == 1 and not isinstance(column_type(df, names[0]), numeric_types()):
        return names[0]
    return list(names)
