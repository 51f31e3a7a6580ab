"""Partitions on disk: each one a Parquet file per split, written once per run.

Layout under a run's ``data/`` folder::

    meta.json                      shapes and dtypes, row counts per partition
    train/part-00003.parquet       columns: features (flat float32 list), label
    val/part-00003.parquet
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..store import _files as files

SPLITS = ("train", "val")


@dataclass(frozen=True)
class PartitionLayout:
    """What ``meta.json`` says: enough to read any partition back with its shapes."""

    num_partitions: int
    feature_shape: tuple[int, ...]
    label_shape: tuple[int, ...]
    label_dtype: str
    rows: dict[str, list[int]]

    @property
    def has_validation(self) -> bool:
        return sum(self.rows["val"]) > 0


def partition_file(data_dir: str, split: str, partition: int) -> str:
    return files.join(data_dir, split, f"part-{partition:05d}.parquet")


def write_table(table: pa.Table, data_dir: str, split: str, partition: int) -> None:
    with files.open_file(partition_file(data_dir, split, partition), "wb") as f:
        pq.write_table(table, f)


def column(array: np.ndarray) -> pa.Array:
    """An array of shape (rows, ...) as a Parquet column: scalars, or flat fixed-size lists."""
    if array.ndim == 1:
        return pa.array(array)
    flat = array.reshape(len(array), int(np.prod(array.shape[1:])))
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


def write_layout(data_dir: str, layout: PartitionLayout) -> None:
    meta = {**layout.__dict__, "feature_shape": list(layout.feature_shape), "label_shape": list(layout.label_shape)}
    files.write_atomic(files.join(data_dir, "meta.json"), json.dumps(meta, indent=1).encode())


def read_layout(data_dir: str) -> PartitionLayout:
    with files.open_file(files.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    return PartitionLayout(meta["num_partitions"], tuple(meta["feature_shape"]),
                           tuple(meta["label_shape"]), meta["label_dtype"], meta["rows"])


def read_partition(data_dir: str, split: str, partition: int,
                   layout: PartitionLayout | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One partition's ``(features, label)`` arrays, in the order they were written."""
    layout = layout or read_layout(data_dir)
    with files.open_file(partition_file(data_dir, split, partition)) as f:
        table = pq.read_table(f)
    n = table.num_rows

    def unpack(name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        column = table.column(name).combine_chunks()
        values = column.flatten() if shape else column
        # A writable copy: workers turn it into tensors they keep for the whole run.
        return np.array(values.to_numpy(zero_copy_only=False), dtype=dtype).reshape((n, *shape))

    return unpack("features", layout.feature_shape, "float32"), unpack("label", layout.label_shape,
                                                                       layout.label_dtype)
