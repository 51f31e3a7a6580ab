"""The rows a trained trial predicts for: a numpy array, a pandas DataFrame, a Parquet path
or a :class:`~cerebro.Dataset`, made into features as the run stored them (the same dtype,
the same shape per row) and checked against the run's before any batch runs."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._arrays import ArrayDataset, _as_features, _column_block
from ._partitions import BYTES

ID_COLUMN = "id"


@dataclass(frozen=True)
class FeatureSpec:
    """What a run's features were: each row's shape and dtype (``"bytes"``: encoded values),
    and the columns they came from, where they had names."""

    shape: tuple[int, ...]
    dtype: str
    columns: Sequence[str] | None = None

    @classmethod
    def of_run(cls, data_info: dict[str, Any]) -> FeatureSpec:
        """From run.json's ``data``."""
        return cls(tuple(data_info["feature_shape"]), data_info["feature_dtype"], data_info.get("feature_columns"))


def prediction_rows(data: Any, spec: FeatureSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """(features, ids) of ``data``: ids are a DataFrame's (or Parquet file's) ``id`` column,
    where it has one that is not a feature. Refuses rows of another shape or dtype than the
    run's, naming both."""
    ids = None
    if isinstance(data, (str, os.PathLike)):
        if not os.path.exists(data):
            raise FileNotFoundError(f"Parquet path {str(data)!r} does not exist")
        import pandas as pd
        import pyarrow
        try:
            data = pd.read_parquet(data)
        except pyarrow.ArrowInvalid as error:
            raise ValueError(f"{os.fspath(data)!r} is not a Parquet file or directory ({error}); predict reads "
                             f"Parquet, numpy or pandas (pandas.read_csv(path) reads a CSV file)") from None
    if isinstance(data, ArrayDataset):
        features = data.features
    elif _is_frame(data):
        features, ids = _frame_features(data, spec)
    elif hasattr(data, "num_train_rows"):
        raise TypeError(f"data is a {type(data).__name__}; predict takes a Dataset made from numpy, pandas or "
                        f"Parquet (cb.predict(..., backend='spark') takes Spark data)")
    else:
        features = _as_features(data)
    return _checked(features, spec), ids


def _is_frame(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and type(data).__name__ == "DataFrame"


def _frame_features(df: Any, spec: FeatureSpec) -> tuple[np.ndarray, np.ndarray | None]:
    columns = [str(c) for c in df.columns]
    if spec.columns is not None:
        missing = [c for c in spec.columns if c not in columns]
        if missing:
            raise ValueError(f"the DataFrame lacks the feature columns {missing} the run trained on "
                             f"({list(spec.columns)}); its columns are {columns}")
        names = list(spec.columns)
    else:
        names = [c for c in df.columns if str(c) != ID_COLUMN]
    blocks = [_column_block(df[c], str(c), keep_shape=len(names) == 1) for c in names]
    features = np.concatenate(blocks, axis=1) if len(blocks) > 1 else blocks[0]
    ids = df[ID_COLUMN].to_numpy() if ID_COLUMN in columns and ID_COLUMN not in names else None
    return _as_features(features), ids


def _checked(features: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    dtype = BYTES if features.dtype == object else str(features.dtype)
    if dtype != spec.dtype:
        raise TypeError(f"the features are {dtype}; the run trained on {spec.dtype} features: give them as "
                        f"{spec.dtype}, as training stored them")
    if dtype != BYTES and tuple(features.shape[1:]) != spec.shape:
        raise ValueError(f"the features have shape {tuple(features.shape)}, rows of {tuple(features.shape[1:])}; "
                         f"the run trained on rows of {spec.shape}")
    return features
