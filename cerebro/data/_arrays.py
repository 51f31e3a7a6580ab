"""``ArrayDataset``: numpy / pandas / Parquet data in memory, checked once, split into train and
validation rows; and :func:`write_partitions`, which writes it as a run's partitions."""
from __future__ import annotations

import hashlib
import numbers
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .._checks import quoted
from ._dataset import Dataset, Validation
from ._partitions import (
    BYTES,
    SPLITS,
    WINDOW_ROW_GROUPS,
    PartitionLayout,
    bytes_per_row,
    column,
    row_group_rows,
    write_layout,
    write_table,
)
from ._sample_order import SampleScheme

if TYPE_CHECKING:
    import pandas as pd


def _as_features(features: Any) -> np.ndarray:
    """Features as they will be stored: numeric arrays keep their dtype (uint8 images stay
    uint8; float64 becomes float32), encoded values (PNG, JPEG, ...) are a 1-D object array
    of bytes."""
    if isinstance(features, (list, tuple)) and features and isinstance(features[0], bytes):
        features = np.array(features, dtype=object)
    array = np.asarray(features)
    if array.dtype == object and array.ndim == 1 and all(isinstance(v, bytes) for v in array):
        return array
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise TypeError(f"features must be numeric, or bytes values (encoded images); got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.complexfloating):
        raise TypeError(f"features must be real numbers; got dtype {array.dtype} (split a complex value into its "
                        f"real and imaginary parts)")
    if array.ndim < 2:
        raise ValueError(f"features must have shape (rows, ...) with at least 2 dimensions; "
                         f"got shape {array.shape}")
    _check_finite("features", array)
    if np.issubdtype(array.dtype, np.floating) and array.size and np.abs(array).max() > np.finfo(np.float32).max:
        # the workers hand the model float32 unless a transform says otherwise
        raise ValueError(f"features hold values beyond float32's range (max |x| = {np.abs(array).max():.3g})")
    # float64 is stored as the float32 the model gets: half the disk and memory, the same bits.
    return np.ascontiguousarray(array, dtype=np.float32 if array.dtype == np.float64 else None)


def _as_label(label: Any) -> np.ndarray:
    if label is None:
        raise TypeError("label=None: a Dataset needs a label for every row (class indices 0..K-1 or float targets)")
    array = np.asarray(label)
    _refuse_names("label", array, "y = sklearn.preprocessing.LabelEncoder().fit_transform(y) (its classes_ map "
                                  "them back)")
    if np.issubdtype(array.dtype, np.unsignedinteger) and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"label holds {array.max()}, beyond int64's range; class indices must be 0..K-1")
    if array.dtype == bool or np.issubdtype(array.dtype, np.integer):
        return np.ascontiguousarray(array, dtype=np.int64)
    if np.issubdtype(array.dtype, np.floating):
        return np.ascontiguousarray(array, dtype=np.float32)
    raise TypeError(f"label must be numeric (class indices 0..K-1 or float targets); "
                    f"got dtype {array.dtype}")


def _refuse_names(what: str, values: np.ndarray, fix: str) -> None:
    """Labels that are class names (strings), where a Dataset takes class indices 0..K-1."""
    if values.dtype.kind not in "USO" or not values.size:
        return
    sample = values.ravel()[:10_000]
    if not all(isinstance(v, (str, bytes, np.str_, np.bytes_)) for v in sample):
        return
    names = sorted({v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in sample})
    shown = ", ".join(map(repr, names[:3])) + (", ..." if len(names) > 3 else "")
    raise TypeError(f"{what} holds strings ({shown}); a Dataset takes class indices 0..K-1 (or float targets): "
                    f"encode them, e.g. {fix}")


def in_content_order(features: Any, label: Any) -> tuple[np.ndarray, np.ndarray]:
    """A table's rows, which come in no particular order, as a dataset stores them, in an
    order fixed by their content as stored (so real and double precision columns of the
    same values agree): the same rows give the same run however they were read."""
    from ._sql import canonical_order

    features, label = _as_features(features), _as_label(label)
    order = canonical_order(features, label)
    return features[order], label[order]


def _check_finite(name: str, array: np.ndarray) -> None:
    if np.issubdtype(array.dtype, np.floating) and array.size:
        bad = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
        if bad.any():
            raise ValueError(f"{name}: {int(bad.sum())} rows hold NaN or infinite values "
                             f"(first at row {int(np.argmax(bad))})")


class ArrayDataset(Dataset, constructors=("from_numpy", "from_pandas", "from_parquet", "from_sql")):
    """Features and a label held in memory as checked arrays (features in their own dtype, or
    bytes; int64 class indices or float32 targets), split by ``seed`` into training and
    validation rows; made by :meth:`cerebro.Dataset.from_numpy`,
    :meth:`~cerebro.Dataset.from_pandas`, :meth:`~cerebro.Dataset.from_parquet` and
    :meth:`~cerebro.Dataset.from_sql`.

    Attributes:
        features: every row's features, of shape (rows, ...), or a 1-D object array of bytes.
        label: every row's label, int64 class indices or float32 targets, of shape (rows, ...).
    """

    def __init__(self, features: Any, label: Any, *, validation: Validation = 0.2,
                 partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                 cache_dir: str | os.PathLike | None = None) -> None:
        self.features = _as_features(features)
        self.label = _as_label(label)
        if len(self.features) != len(self.label):
            raise ValueError(f"features have {len(self.features)} rows but label has "
                             f"{len(self.label)}; they must have the same number of rows")
        if len(self.features) == 0:
            raise ValueError("data is empty: features and label have 0 rows")
        _check_finite("label", self.label)
        super().__init__(validation=validation, partitions=partitions, seed=seed, in_memory=in_memory,
                         cache_dir=cache_dir)
        self._train_rows, self._val_rows, self._val = self._split(validation)
        if self.partitions is not None:
            self.check_partitions(self.partitions)

    # --- constructors (documented on Dataset) --------------------------------------------
    @classmethod
    def from_numpy(cls, features: Any, label: Any, *, validation: Validation = 0.2,
                   partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                   cache_dir: str | os.PathLike | None = None) -> ArrayDataset:
        """See :meth:`cerebro.Dataset.from_numpy`."""
        return cls(features, label, validation=validation, partitions=partitions, seed=seed,
                   in_memory=in_memory, cache_dir=cache_dir)

    @classmethod
    def from_pandas(cls, df: pd.DataFrame, *, features: Sequence[str] | None = None,
                    label: str, validation: Validation = 0.2, partitions: int | None = None,
                    seed: int = 0, in_memory: bool | str = "auto",
                    cache_dir: str | os.PathLike | None = None) -> ArrayDataset:
        """See :meth:`cerebro.Dataset.from_pandas`."""
        dataset = cls(*_frame_arrays(df, features, label), validation=validation, partitions=partitions, seed=seed,
                      in_memory=in_memory, cache_dir=cache_dir)
        named = [c for c in df.columns if c != label] if features is None else \
            [features] if isinstance(features, str) else list(features)
        dataset.feature_columns = [str(c) for c in named]
        return dataset

    @classmethod
    def from_parquet(cls, path: str | os.PathLike, *, features: Sequence[str] | None = None,
                     label: str, validation: Validation = 0.2, partitions: int | None = None,
                     seed: int = 0, in_memory: bool | str = "auto",
                     cache_dir: str | os.PathLike | None = None) -> ArrayDataset:
        """See :meth:`cerebro.Dataset.from_parquet`."""
        if not os.path.exists(path):
            raise FileNotFoundError(f"Parquet path {str(path)!r} does not exist")
        import pandas as pd

        columns = None if features is None else [*([features] if isinstance(features, str) else features), label]
        return cls.from_pandas(pd.read_parquet(path, columns=columns), features=features,
                               label=label, validation=validation, partitions=partitions, seed=seed,
                               in_memory=in_memory, cache_dir=cache_dir)

    @classmethod
    def from_sql(cls, dsn: str, table_or_query: str, *, features: Sequence[str] | None = None, label: str,
                 validation: Validation = 0.2, partitions: int | None = None, seed: int = 0,
                 in_memory: bool | str = "auto", cache_dir: str | os.PathLike | None = None) -> ArrayDataset:
        """See :meth:`cerebro.Dataset.from_sql`."""
        from ._sql import read_sql

        feature_array, label_array = in_content_order(*read_sql(dsn, table_or_query, features, label))
        return cls(feature_array, label_array, validation=validation, partitions=partitions,
                   seed=seed, in_memory=in_memory, cache_dir=cache_dir)

    # --- the split ----------------------------------------------------------------------
    def _split(self, validation: Validation) -> tuple[np.ndarray, np.ndarray, ArrayDataset | None]:
        rows = np.random.default_rng(self.seed).permutation(len(self.features))
        number = validation if isinstance(validation, numbers.Real) and not isinstance(validation, (bool, np.bool_)) \
            else None
        if validation is None or (number is not None and number == 0):
            return rows, rows[:0], None
        if number is not None:
            if not 0 < number < 1:
                raise ValueError(f"validation={quoted(validation)} must be a fraction in [0, 1), "
                                 f"a Dataset or a (features, label) pair")
            held_out = int(round(len(rows) * number))
            if held_out >= len(rows):
                raise ValueError(f"validation={validation!r} leaves no training rows out of {len(rows)}")
            return rows[held_out:], rows[:held_out], None
        if isinstance(validation, tuple) and len(validation) == 2:
            validation = ArrayDataset(*validation, validation=None, seed=self.seed)
        if not isinstance(validation, ArrayDataset):
            raise ValueError(f"validation={quoted(validation)} must be a fraction in [0, 1), "
                             f"a Dataset or a (features, label) pair")
        if validation.features.shape[1:] != self.features.shape[1:]:
            raise ValueError(f"validation features have shape {validation.features.shape[1:]} per row; "
                             f"training features have {self.features.shape[1:]}")
        if validation.label.shape[1:] != self.label.shape[1:] or validation.label.dtype != self.label.dtype:
            raise ValueError(f"validation label ({validation.label.dtype}, {validation.label.shape[1:]}) "
                             f"differs from the training label ({self.label.dtype}, {self.label.shape[1:]})")
        return rows, rows[:0], validation

    def __repr__(self) -> str:
        validation = len(self._val_rows) if self._val is None else len(self._val.label)
        shape = "" if self.features.dtype == object else f" {self.features.shape[1:]}"
        return self._repr(validation, f"{self.feature_dtype}{shape}", str(self.label.dtype))

    # --- what a run uses ----------------------------------------------------------------
    @property
    def num_train_rows(self) -> int:
        """The number of training rows."""
        return len(self._train_rows)

    @property
    def has_validation(self) -> bool:
        """Whether rows are held out or a separate validation set was given."""
        return len(self._val_rows) > 0 or self._val is not None

    @property
    def feature_dtype(self) -> str:
        """The features' dtype as stored: a numpy dtype's name, or ``"bytes"``."""
        return BYTES if self.features.dtype == object else str(self.features.dtype)

    def train_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Training rows in their seeded, shuffled order."""
        return self.features[self._train_rows], self.label[self._train_rows]

    def sample(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``rows`` training rows, as the workers load them."""
        features, label = self.features[self._train_rows[:rows]], self.label[self._train_rows[:rows]]
        return np.ascontiguousarray(features), np.ascontiguousarray(label)

    def label_range(self) -> tuple[int, int] | None:
        """See :meth:`Dataset.label_range`."""
        labels = [self.label] + ([] if self._val is None else [self._val.label])
        if self.label.dtype != np.int64 or not self.label.size:
            return None
        return min(int(a.min()) for a in labels if a.size), max(int(a.max()) for a in labels if a.size)

    def validation_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Validation rows in their seeded, shuffled order (empty without validation)."""
        if self._val is not None:
            rows = np.random.default_rng(self.seed).permutation(len(self._val.features))
            return self._val.features[rows], self._val.label[rows]
        return self.features[self._val_rows], self.label[self._val_rows]

    def write(self, data_dir: str, num_partitions: int) -> PartitionLayout:
        """Write the partitions into a run's ``data/`` folder (see :mod:`cerebro.data._partitions`)."""
        return write_partitions(self, data_dir, num_partitions)

    def fingerprint(self) -> str:
        """A hash of the rows and the split: two runs on equal fingerprints saw equal data."""
        digest = hashlib.sha256()
        for array in (*self.train_arrays(), *self.validation_arrays()):
            digest.update(f"{array.dtype}{array.shape}".encode())
            if array.dtype == object:       # bytes values: their contents, not their addresses
                for value in array:
                    digest.update(len(value).to_bytes(8, "little") + value)
            else:
                digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()[:16]


def _frame_arrays(df: pd.DataFrame, features: Sequence[str] | str | None,
                  label: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, label) of ``df``: ``features`` names numeric columns or array/list columns
    (concatenated in order; default every column but the label), or one column of N-D
    arrays (kept in their shape) or of ``bytes``."""
    import pandas as pd  # here, not at the top: workers import this package, and pandas costs them 44 MB

    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"from_pandas needs a pandas DataFrame; got {type(df).__name__}")
    columns = [str(c) for c in df.columns]
    if label not in df.columns:
        raise ValueError(f"label column {label!r} is not in the DataFrame; columns are {columns}")
    if features is None:
        features = [c for c in df.columns if c != label]
    if isinstance(features, str):
        features = [features]
    if len(features) == 0:
        raise ValueError("features=[] must name at least one column")
    missing = [c for c in features if c not in df.columns]
    if missing:
        raise ValueError(f"feature columns {missing} are not in the DataFrame; columns are {columns}")
    if label in features:
        raise ValueError(f"label column {label!r} is also among features={list(features)}; a model must not "
                         f"see its label")
    _refuse_names(f"label column {label!r}", np.asarray(df[label].to_numpy()),
                  f"df[{label!r}] = df[{label!r}].astype('category').cat.codes")
    blocks = [_column_block(df[c], c, keep_shape=len(features) == 1) for c in features]
    if len(blocks) > 1 and any(b.dtype == object for b in blocks):
        raise TypeError(f"a bytes column must be the only feature column; features={list(features)}")
    return (np.concatenate(blocks, axis=1) if len(blocks) > 1 else blocks[0],
            _column_block(df[label], label, flatten_scalar=True))


def _column_block(column: pd.Series, name: str, flatten_scalar: bool = False,
                  keep_shape: bool = False) -> np.ndarray:
    """A column as an array of shape (rows, ...): scalars become one feature, arrays stack
    (flattened to one row of features unless ``keep_shape``), bytes stay bytes."""
    if len(column) and isinstance(column.iloc[0], bytes):
        if not all(isinstance(v, bytes) for v in column):
            raise TypeError(f"column {name!r} mixes bytes with other values; every row must hold bytes")
        return column.to_numpy(dtype=object)
    if len(column) and isinstance(column.iloc[0], (list, tuple, np.ndarray)):
        try:
            block = np.stack([np.asarray(v) for v in column])
        except ValueError as error:
            raise ValueError(f"column {name!r} holds arrays of different shapes: {error}") from None
        return block.reshape(len(block), -1) if not (flatten_scalar or keep_shape) else block
    if column.dtype == object:
        raise TypeError(f"column {name!r} must be numeric, hold numeric arrays or hold bytes; got dtype object")
    values = column.to_numpy()
    return values if flatten_scalar else values.reshape(-1, 1)


def write_partitions(dataset: ArrayDataset, data_dir: str, num_partitions: int) -> PartitionLayout:
    """Split ``dataset``'s shuffled rows into ``num_partitions`` contiguous slices, per split,
    each written in row groups."""
    dataset.check_partitions(num_partitions)
    per_row = bytes_per_row(dataset.features, dataset.label)
    group = row_group_rows(per_row)
    rows: dict[str, list[int]] = {}
    checks: dict[str, list[list[int]]] = {}
    for split, (features, label) in zip(SPLITS, (dataset.train_arrays(), dataset.validation_arrays())):
        rows[split], checks[split] = [], []
        for partition, chunk in enumerate(np.array_split(np.arange(len(features)), num_partitions)):
            table = pa.table({"features": column(features[chunk]), "label": column(label[chunk])})
            checks[split].append(write_table(table, data_dir, split, partition, group))
            rows[split].append(len(chunk))
    is_bytes = dataset.features.dtype == object
    layout = PartitionLayout(num_partitions, () if is_bytes else tuple(dataset.features.shape[1:]),
                             tuple(dataset.label.shape[1:]), str(dataset.label.dtype), rows,
                             BYTES if is_bytes else str(dataset.features.dtype), group, WINDOW_ROW_GROUPS,
                             SampleScheme.WINDOWED, per_row, checks)
    write_layout(data_dir, layout)
    return layout
