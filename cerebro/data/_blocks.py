"""Rows held in a cluster's blocks (a Ray Dataset's blocks, a Dask DataFrame's partitions),
checked, split and written into a run's partitions by the cluster's own workers, never
through the driver: the base of ``Dataset.from_ray`` and ``Dataset.from_dask``.

Every row gets three 64-bit keys from a BLAKE2b hash of its content as stored (features,
then label), keyed by the seed: one draws the validation split, one the partition, one the
row's place in it. So the partitions depend on the rows and the seed only, not on how the
rows happen to be cut into blocks, and the same rows given to ``from_ray`` and to
``from_dask`` give the same partitions, bit for bit. Identical rows get identical keys:
they land in the same split and partition, so no copy of a row is both trained and
validated on.

A subclass says how its engine lists columns, maps a function over every block, and
groups keyed rows by (split, partition) to write each group where it lands.
"""
from __future__ import annotations

import abc
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .._checks import quoted
from ._arrays import _as_features, _as_label, _check_finite
from ._dataset import Dataset
from ._groups import CountedRows, GroupForm, assemble, write_rows
from ._partitions import BYTES, PartitionLayout

Columns = Mapping[str, Any]     # a block: column name -> its values (a numpy array or a pandas Series)
_VALIDATION_BUCKETS = 1_000_000


@dataclass(frozen=True)
class RowSpec:
    """Which columns make a row, and how the split is drawn: ``marker`` names a column
    marking validation rows, else ``fraction`` of the rows are drawn (0: none)."""

    features: tuple[str, ...]
    label: str
    marker: str | None
    fraction: float
    seed: int


class BlockDataset(CountedRows, Dataset):
    """Training data that stays in a cluster's blocks until ``fit`` has the cluster write its
    partitions into the store, which the cluster's workers must reach (a shared file system,
    or an fsspec URL such as ``s3://``)."""

    engine = ""      # the constructor's engine, for messages: "Ray", "Dask"

    def __init__(self, data: Any, *, features: str | Sequence[str], label: str, validation: Any = 0.2,
                 partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                 cache_dir: str | os.PathLike | None = None) -> None:
        columns = self._column_names(data)
        super().__init__(validation=validation, partitions=partitions, seed=seed, in_memory=in_memory,
                         cache_dir=cache_dir)
        self._data = data
        self._spec = _row_spec(columns, features, label, validation, self.seed)
        self.feature_columns = list(self._spec.features)
        stats = _merged([s for s in self._map_blocks(partial(block_statistics, self._spec)) if s["rows"]])
        self._form = GroupForm(stats["feature_dtype"], tuple(json.loads(stats["feature_shape"])),
                               stats["label_dtype"], stats["row_bytes"])
        self._label_range = (stats["label_min"], stats["label_max"]) if self._form.label_dtype == "int64" else None
        self._val_rows = stats["validation_rows"]
        self._train_rows = stats["rows"] - self._val_rows
        if self._train_rows == 0:
            raise ValueError(f"validation={validation!r} leaves no training rows out of {stats['rows']}")
        self._fingerprint: str | None = None
        if self.partitions is not None:
            self.check_partitions(self.partitions)

    # --- what an engine provides --------------------------------------------------------
    @abc.abstractmethod
    def _column_names(self, data: Any) -> list[str]:
        """``data``'s column names; raises TypeError where ``data`` is not the engine's."""

    @abc.abstractmethod
    def _map_blocks(self, fn: Callable[[Columns], dict[str, Any]]) -> list[dict[str, Any]]:
        """``fn`` of every block, run where the block is."""

    @abc.abstractmethod
    def _write_groups(self, key: Callable[[Columns], dict[str, np.ndarray]],
                      write: Callable[[Columns], dict[str, Any]], groups: int) -> list[dict[str, Any]]:
        """``key`` each block (rows with ``split`` and ``partition`` columns), then ``write``
        each (split, partition) group of the keyed rows where it lands (there are at most
        ``groups``: the engine's shuffle needs no more outputs); the records."""

    @abc.abstractmethod
    def _head(self, rows: int) -> Columns:
        """The first ``rows`` rows, on the driver."""

    # --- what a run uses ----------------------------------------------------------------
    def __repr__(self) -> str:
        shape = "" if self._form.feature_dtype == BYTES else f" {self._form.feature_shape}"
        return self._repr(self._val_rows, f"{self._form.feature_dtype}{shape}", self._form.label_dtype)

    @property
    def feature_dtype(self) -> str:
        """The features' dtype as stored (float64 becomes float32), or ``"bytes"``."""
        return self._form.feature_dtype

    def label_range(self) -> tuple[int, int] | None:
        """See :meth:`Dataset.label_range` (counted with the other statistics)."""
        return self._label_range

    def sample(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``rows`` rows (training or validation: the checks need only their form)."""
        features, label, _ = block_rows(self._spec, self._head(rows))
        # Copies: the engine's arrays may be read-only views of Arrow buffers, which torch warns of.
        return np.array(features), label.astype(self._form.label_dtype)

    def write(self, data_dir: str, num_partitions: int) -> PartitionLayout:
        """Have the cluster key every block and write every (split, partition) group."""
        self.check_partitions(num_partitions)
        records = self._write_groups(partial(keyed_block, self._spec, num_partitions),
                                     partial(write_group, data_dir, self._form), 2 * num_partitions)
        layout, self._fingerprint = assemble(data_dir, num_partitions, records, self._form, self._train_rows)
        return layout

    def fingerprint(self) -> str:
        """A hash of the partitions' rows, known once :meth:`write` has written them."""
        if self._fingerprint is None:
            raise RuntimeError(f"a {self.engine} dataset's fingerprint is known once fit has written its partitions")
        return self._fingerprint


def _row_spec(columns: list[str], features: Any, label: Any, validation: Any, seed: int) -> RowSpec:
    """The checked column names and split of a constructor's arguments."""
    names = [features] if isinstance(features, str) else features
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"features={features!r} must name a column or a non-empty list of columns")
    if not isinstance(label, str):
        raise TypeError(f"label={label!r} must name a column")
    missing = [n for n in [*names, label] if n not in columns]
    if missing:
        raise ValueError(f"columns {missing} are not in the data; its columns are {columns}")
    if label in names:
        raise ValueError(f"label column {label!r} is also among features={list(names)}; a model must not "
                         f"see its label")
    if isinstance(validation, str):
        if validation not in columns:
            raise ValueError(f"validation column {validation!r} is not in the data; its columns are {columns}")
        return RowSpec(tuple(names), label, validation, 0.0, seed)
    if validation is None or (isinstance(validation, (int, float)) and not isinstance(validation, bool)
                              and validation == 0):
        return RowSpec(tuple(names), label, None, 0.0, seed)
    if isinstance(validation, float) and 0 < validation < 1:
        return RowSpec(tuple(names), label, None, validation, seed)
    raise ValueError(f"validation={quoted(validation)} must be a fraction in [0, 1), the name of a boolean "
                     f"column marking validation rows, or None")


def block_rows(spec: RowSpec, columns: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A block's (features, label, keys): features as stored, label as int64 class indices
    or float32 targets, and each row's three keys (see the module's docstring)."""
    blocks = [_values(columns[name], name, keep_shape=len(spec.features) == 1) for name in spec.features]
    if len(blocks) > 1 and any(b.dtype == object for b in blocks):
        raise TypeError(f"a bytes column must be the only feature column; features={list(spec.features)}")
    features = _as_features(np.concatenate(blocks, axis=1) if len(blocks) > 1 else blocks[0])
    label = np.asarray(columns[spec.label])
    missing = sum(map(_is_missing, label)) if label.dtype == object else 0
    if missing:
        raise ValueError(f"label column {spec.label!r}: {missing} rows hold missing values (null, NA, None)")
    if label.dtype == object and label.ndim == 1 and len(label) and all(isinstance(v, (bool, int, float))
                                                                         for v in label):
        label = np.array(label.tolist())          # a nullable column without nulls
    if label.ndim != 1 or not (label.dtype == bool or np.issubdtype(label.dtype, np.number)):
        held = type(label[0]).__name__ if label.ndim == 1 and len(label) else f"arrays of shape {label.shape[1:]}"
        raise TypeError(f"label column {spec.label!r} must hold one number per row (class indices 0..K-1 or "
                        f"float targets); it holds {held}")
    label = _as_label(label)
    _check_finite(f"label column {spec.label!r}", label)
    return features, label, row_keys(features, label, spec.seed)


def _values(values: Any, name: str, keep_shape: bool) -> np.ndarray:
    """A column as an array of shape (rows, ...): scalars one feature each, arrays stacked
    (flattened unless ``keep_shape``), bytes kept as bytes."""
    array = np.asarray(values)
    if array.dtype == object and len(array):
        missing = sum(map(_is_missing, array))
        if missing:
            raise ValueError(f"column {name!r}: {missing} rows hold missing values (null, NA, None)")
        if isinstance(array[0], bytes):
            if not all(isinstance(v, bytes) for v in array):
                raise TypeError(f"column {name!r} mixes bytes with other values; every row must hold bytes")
            return array
        if not isinstance(array[0], (list, tuple, np.ndarray)):
            raise TypeError(f"column {name!r} must be numeric, hold numeric arrays or hold bytes; "
                            f"it holds {type(array[0]).__name__}")
        try:
            array = np.stack([np.asarray(v) for v in array])
        except ValueError:
            raise ValueError(f"column {name!r} holds arrays of different shapes; every row needs the same "
                             f"shape") from None
    if array.ndim == 1:            # one number a row: one feature
        return array.reshape(-1, 1)
    return array if keep_shape else array.reshape(len(array), -1)


def _is_missing(value: Any) -> bool:
    """None, pandas' NA or NaT, or a float NaN: what a nullable column holds for a null."""
    return value is None or type(value).__name__ in ("NAType", "NaTType") or \
        (isinstance(value, float) and value != value)


def row_keys(features: np.ndarray, label: np.ndarray, seed: int) -> np.ndarray:
    """Each row's three keys (validation draw, partition, place), of shape (rows, 3)."""
    key = str(seed).encode()
    rows = features if features.dtype == object else np.ascontiguousarray(features).reshape(len(features), -1)
    keys = np.empty((len(rows), 3), np.uint64)
    for i, (row, target) in enumerate(zip(rows, label)):
        content = row if features.dtype == object else row.tobytes()
        digest = hashlib.blake2b(content + target.tobytes(), digest_size=24, key=key).digest()
        keys[i] = np.frombuffer(digest, np.uint64)
    return keys


def _is_validation(spec: RowSpec, columns: Columns, keys: np.ndarray) -> np.ndarray:
    if spec.marker is not None:
        marker = np.asarray(columns[spec.marker])
        if marker.dtype == object:       # a nullable column: a null marks no validation row, as in Spark
            marker = np.array([False if _is_missing(v) else v for v in marker])
        if not (marker.dtype == bool or np.issubdtype(marker.dtype, np.integer)):
            raise TypeError(f"validation column {spec.marker!r} must be boolean or integer (non-zero marks a "
                            f"validation row); it is {marker.dtype}")
        return marker != 0
    threshold = int(round(spec.fraction * _VALIDATION_BUCKETS))
    return keys[:, 0] % np.uint64(_VALIDATION_BUCKETS) < np.uint64(threshold)


def block_statistics(spec: RowSpec, columns: Columns) -> dict[str, Any]:
    """Runs on a worker: a block's counts and form, or the error its rows raise (sent back
    as text, so the driver raises it as itself rather than as the engine's wrapper)."""
    rows = len(np.asarray(columns[spec.label]))
    none = {"rows": 0, "validation_rows": 0, "feature_dtype": "", "feature_shape": "[]", "row_bytes": 0,
            "label_dtype": "", "label_min": 0, "label_max": 0, "error": ""}
    if rows == 0:
        return none
    try:
        features, label, keys = block_rows(spec, columns)
        validation = _is_validation(spec, columns, keys)
    except (TypeError, ValueError) as error:
        return {**none, "rows": rows, "error": f"{type(error).__name__}: {error}"}
    binary = features.dtype == object
    row_bytes = (sum(map(len, features)) // rows + 8) if binary else features[0].nbytes + label.itemsize
    integral = label.dtype == np.int64
    return {"rows": rows, "validation_rows": int(validation.sum()),
            "feature_dtype": BYTES if binary else str(features.dtype),
            "feature_shape": json.dumps([] if binary else list(features.shape[1:])), "row_bytes": int(row_bytes),
            "label_dtype": str(label.dtype), "label_min": int(label.min()) if integral else 0,
            "label_max": int(label.max()) if integral else 0, "error": ""}


def _merged(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The statistics of every block as one; raises the first block's error, and refuses
    blocks whose rows differ in form."""
    if not blocks:
        raise ValueError("data is empty: it has 0 rows")
    for block in blocks:
        if block["error"]:
            kind, message = block["error"].split(": ", 1)
            raise (TypeError if kind == "TypeError" else ValueError)(message)
    first = blocks[0]
    for name in ("feature_dtype", "feature_shape", "label_dtype"):
        differing = sorted({str(b[name]) for b in blocks})
        if len(differing) > 1:
            raise ValueError(f"blocks of the data differ in {name.replace('_', ' ')}: {differing}; every row "
                             f"needs the same form")
    rows = sum(int(b["rows"]) for b in blocks)
    return {**first, "rows": rows, "validation_rows": sum(int(b["validation_rows"]) for b in blocks),
            "row_bytes": max(1, sum(int(b["row_bytes"]) * int(b["rows"]) for b in blocks) // rows),
            "label_min": min(int(b["label_min"]) for b in blocks),
            "label_max": max(int(b["label_max"]) for b in blocks)}


def keyed_block(spec: RowSpec, num_partitions: int, columns: Columns) -> dict[str, np.ndarray]:
    """Runs on a worker: a block's rows as the write shuffles them, each row's features as
    its stored bytes, with its split, partition and keys."""
    if len(np.asarray(columns[spec.label])) == 0:
        return {"features": np.zeros(0, object), "label": np.zeros(0), "split": np.zeros(0, object),
                "partition": np.zeros(0, np.int64), "order": np.zeros(0, np.int64), "tie": np.zeros(0, np.int64)}
    features, label, keys = block_rows(spec, columns)
    if features.dtype != object:
        features = np.array([row.tobytes() for row in features.reshape(len(features), -1)], object)
    validation = _is_validation(spec, columns, keys)
    return {"features": features, "label": label, "split": np.where(validation, "val", "train").astype(object),
            "partition": (keys[:, 1] % np.uint64(num_partitions)).astype(np.int64),
            "order": keys[:, 2].view(np.int64), "tie": keys[:, 0].view(np.int64)}


def write_group(data_dir: str, form: GroupForm, columns: Columns) -> dict[str, Any]:
    """Runs on a worker: one (split, partition) group of keyed rows, written in the order of
    their keys; its record."""
    order = np.lexsort((np.asarray(columns["tie"]), np.asarray(columns["order"])))
    values = np.asarray(columns["features"], dtype=object)[order]
    if form.feature_dtype == BYTES:
        features = values
    else:
        features = np.frombuffer(b"".join(values), form.feature_dtype).reshape(len(values), *form.feature_shape)
    label = np.asarray(columns["label"])[order].astype(form.label_dtype)
    split, partition = str(np.asarray(columns["split"])[0]), int(np.asarray(columns["partition"])[0])
    return write_rows(data_dir, split, partition, features, label, form.group_rows)
