"""Partitions written group by group where the rows live: by Spark's executors
(``from_spark``), Ray's workers (``from_ray``) or Dask's (``from_dask``).

Each (split, partition) group becomes one Parquet file in the form
:func:`cerebro.data.write_partitions` writes, so any backend trains on it; the worker that
wrote it sends the driver a small record (rows, size, CRC-32, a digest of the content), and
the driver assembles ``meta.json`` from the records without touching a row.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..store import _files as files
from ._partitions import (
    BYTES,
    SPLITS,
    WINDOW_ROW_GROUPS,
    PartitionLayout,
    column,
    partition_file,
    row_group_rows,
    write_layout,
    write_table,
)
from ._sample_order import SampleScheme

# The fields of a group's record, as Spark's schema (other engines send dicts of the same keys).
RECORD_SCHEMA = "split string, partition int, rows long, digest string, size long, crc long"


class CountedRows:
    """What a dataset whose engine counted its rows (``_train_rows``, ``_val_rows``) says
    of them without another job."""

    _train_rows: int
    _val_rows: int

    @property
    def num_train_rows(self) -> int:
        """The number of training rows (counted once, by the engine)."""
        return self._train_rows

    @property
    def has_validation(self) -> bool:
        """Whether any rows are for validation."""
        return self._val_rows > 0


@dataclass(frozen=True)
class GroupForm:
    """What every group's rows are: the features' dtype (or ``"bytes"``) and each row's shape,
    the label's dtype, and a row's mean size in memory (which sets the row groups)."""

    feature_dtype: str
    feature_shape: tuple[int, ...]
    label_dtype: str
    row_bytes: int

    @property
    def group_rows(self) -> int:
        return row_group_rows(self.row_bytes)

    def empty(self) -> tuple[np.ndarray, np.ndarray]:
        """(features, label) of no rows, for a partition no row went to."""
        label = np.zeros(0, self.label_dtype)
        if self.feature_dtype == BYTES:
            return np.zeros(0, object), label
        return np.zeros((0, *self.feature_shape), self.feature_dtype), label


def write_rows(data_dir: str, split: str, partition: int, features: np.ndarray, label: np.ndarray,
               group_rows: int) -> dict[str, Any]:
    """Runs where the group is: writes its rows, in the order given, as the partition's file
    of ``split``; returns the group's record."""
    if features.dtype == object:
        content = b"".join(len(v).to_bytes(8, "little") + v for v in features)
    else:
        content = np.ascontiguousarray(features).tobytes()
    table = pa.table({"features": column(features), "label": column(label)})
    size, crc = write_table(table, data_dir, split, partition, group_rows)
    return {"split": split, "partition": int(partition), "rows": len(label),
            "digest": hashlib.sha256(content + np.ascontiguousarray(label).tobytes()).hexdigest(),
            "size": size, "crc": crc}


def assemble(data_dir: str, num_partitions: int, records: Iterable[Mapping[str, Any]], form: GroupForm,
             train_rows: int) -> tuple[PartitionLayout, str]:
    """The run's layout, written to ``meta.json``, and the data's fingerprint, from the
    groups' records; writes the (empty) files of partitions no row went to and refuses a
    store the driver does not see as the workers did."""
    rows = {split: [0] * num_partitions for split in SPLITS}
    checks: dict[str, list[list[int]]] = {split: [[0, 0]] * num_partitions for split in SPLITS}
    digests = {}
    for record in records:
        split, partition = record["split"], int(record["partition"])
        rows[split][partition] = int(record["rows"])
        checks[split][partition] = [int(record["size"]), int(record["crc"])]
        digests[(split, partition)] = record["digest"]
    empty = [p for p in range(num_partitions) if rows["train"][p] == 0]
    if empty:
        raise ValueError(f"training partitions {empty} got no rows: {train_rows} rows hashed into "
                         f"{num_partitions} partitions; use fewer partitions")
    for split in SPLITS:
        for partition in range(num_partitions):
            if (split, partition) not in digests:
                record = write_rows(data_dir, split, partition, *form.empty(), form.group_rows)
                checks[split][partition] = [record["size"], record["crc"]]
                digests[(split, partition)] = ""
    missing = [f for f in (partition_file(data_dir, s, p) for s in SPLITS for p in range(num_partitions))
               if not files.exists(f)]
    if missing:
        raise OSError(f"the cluster's workers wrote partitions the driver cannot see (first: {missing[0]}); "
                      f"the store must be one file system shared by the driver and every worker")
    layout = PartitionLayout(num_partitions, form.feature_shape, (), form.label_dtype, rows, form.feature_dtype,
                             form.group_rows, WINDOW_ROW_GROUPS, SampleScheme.WINDOWED, form.row_bytes, checks)
    write_layout(data_dir, layout)
    fingerprint = hashlib.sha256("".join(digests[k] for k in sorted(digests)).encode()).hexdigest()[:16]
    return layout, fingerprint

