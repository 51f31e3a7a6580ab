"""Partitions on disk: each one a Parquet file per split, written once per run.

Layout under a run's ``data/`` folder::

    meta.json                      shapes and dtypes, row counts, row groups, sample order scheme,
                                   each file's size and CRC-32 (see ._file_checks)
    train/part-00003.parquet       columns: features (flat list of the stored dtype, or binary), label
    val/part-00003.parquet

Features keep their dtype (uint8 images stay uint8) or are bytes (encoded images): a worker
turns a batch into what the model takes (the trainer's ``transform``, float32 by default).
Each file is written in row groups of ``row_group_rows`` rows, the unit a streaming worker
reads (see :mod:`._sample_order`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..store import _files as files
from ._file_checks import Checksummed
from ._sample_order import SampleScheme

SPLITS = ("train", "val")
BYTES = "bytes"                  # the feature dtype of encoded data (PNG, JPEG, ...)
ROW_GROUP_BYTES = 2 << 20        # a row group's size on disk and in memory, about
WINDOW_ROW_GROUPS = 8            # row groups shuffled together: 16 MiB windows


@dataclass(frozen=True)
class PartitionLayout:
    """What ``meta.json`` says: enough to read any partition back with its shapes, in row groups."""

    num_partitions: int
    feature_shape: tuple[int, ...]
    label_shape: tuple[int, ...]
    label_dtype: str
    rows: dict[str, list[int]]
    feature_dtype: str = "float32"        # a numpy dtype, or BYTES
    row_group_rows: int | None = None     # None: written before row groups (one per file, in memory only)
    window: int = 1                       # row groups per shuffle window
    sample_order: SampleScheme = SampleScheme.PERMUTATION
    bytes_per_row: int | None = None      # features and label in memory (bytes features: their mean size)
    files: dict[str, list[list[int]]] | None = None    # split -> [size, CRC-32] per partition; None: unchecked

    def file_check(self, split: str, partition: int) -> tuple[int, int] | None:
        """The (size, CRC-32) ``split``'s file of ``partition`` was written with, where recorded."""
        if self.files is None:
            return None
        size, crc = self.files[split][partition]
        return size, crc

    @property
    def has_validation(self) -> bool:
        return sum(self.rows["val"]) > 0

    @property
    def streamable(self) -> bool:
        """Whether its partitions can be streamed (runs written before row groups cannot)."""
        return self.row_group_rows is not None

    def partition_bytes(self, partition: int) -> int:
        """A partition's size in memory, both splits, about."""
        per_row = self.bytes_per_row or 4 * (int(np.prod(self.feature_shape)) + int(np.prod(self.label_shape)) + 1)
        return sum(self.rows[split][partition] for split in SPLITS) * per_row


def bytes_per_row(features: np.ndarray, label: np.ndarray) -> int:
    """A row's size in memory: features (bytes values: their mean length) and label."""
    if len(features) == 0:
        return 1
    size = (sum(map(len, features)) if features.dtype == object else features.nbytes) + label.nbytes
    return max(1, -(-size // len(features)))


def row_group_rows(row_bytes: float) -> int:
    """Rows per row group for rows of ``row_bytes`` bytes."""
    return max(1, int(ROW_GROUP_BYTES // max(row_bytes, 1)))


def partition_file(data_dir: str, split: str, partition: int) -> str:
    return files.join(data_dir, split, f"part-{partition:05d}.parquet")


def write_table(table: pa.Table, data_dir: str, split: str, partition: int, rows_per_group: int) -> list[int]:
    """Write a partition's rows so that a streaming worker can read fixed-width columns in
    place (:mod:`._mapped`): required, plain, uncompressed, one data page per row group.
    Numbers and encoded images barely compress, and rows are all distinct (a dictionary
    would hold each once more and cost a gather per row group). Returns the file's
    ``[size, CRC-32]``, for ``meta.json``."""
    table = table.cast(pa.schema([field.with_nullable(False) for field in table.schema]))
    with files.open_file(partition_file(data_dir, split, partition), "wb") as f:
        written = Checksummed(f)
        pq.write_table(table, written, row_group_size=rows_per_group, compression="none", use_dictionary=False,
                       write_statistics=False, data_page_size=1 << 40, max_rows_per_page=max(rows_per_group, 1))
    return [written.size, written.crc]


def column(array: np.ndarray) -> pa.Array:
    """An array of shape (rows, ...) as a Parquet column: scalars, bytes, or each row's raw
    bytes (fixed-size binary: read back without the repetition levels a list column costs,
    four bytes per value)."""
    if array.dtype == object:
        return pa.array(list(array), type=pa.binary())
    if array.ndim == 1:
        return pa.array(array)
    width = int(np.prod(array.shape[1:])) * array.dtype.itemsize
    data = np.ascontiguousarray(array)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(array), [None, pa.py_buffer(data)])


def write_layout(data_dir: str, layout: PartitionLayout) -> None:
    meta = {**layout.__dict__, "feature_shape": list(layout.feature_shape), "label_shape": list(layout.label_shape),
            "sample_order": layout.sample_order.value}
    files.write_atomic(files.join(data_dir, "meta.json"), json.dumps(meta, indent=1).encode())


MAX_META_BYTES = 64 << 20     # meta.json: shapes, dtypes and per-partition counts


def read_layout(data_dir: str) -> PartitionLayout:
    """The partitions' layout from ``meta.json``: a regular file of a bounded size (a run
    directory is anyone's to write), with every entry readers need, or a ValueError naming it."""
    path = files.join(data_dir, "meta.json")
    try:
        meta = json.loads(files.read_regular(path, MAX_META_BYTES))
        return _layout(meta)
    except (KeyError, TypeError, AttributeError, RecursionError) as error:
        raise ValueError(f"{path} is damaged: {type(error).__name__}: {error}") from None
    except ValueError as error:
        raise ValueError(f"{path} is damaged: {error}") from None


def _layout(meta: dict) -> PartitionLayout:
    if not isinstance(meta.get("num_partitions"), int) or not isinstance(meta.get("rows"), dict):
        raise TypeError("its num_partitions must be a whole number and its rows an object of the splits' counts")
    if any(not isinstance(r, list) or len(r) != meta["num_partitions"] for r in meta["rows"].values()):
        raise TypeError("its rows must list one count per partition for each split")
    return PartitionLayout(meta["num_partitions"], tuple(meta["feature_shape"]), tuple(meta["label_shape"]),
                           meta["label_dtype"], meta["rows"], meta.get("feature_dtype", "float32"),
                           meta.get("row_group_rows"), meta.get("window", 1),
                           SampleScheme(meta.get("sample_order", SampleScheme.PERMUTATION.value)),
                           meta.get("bytes_per_row"), meta.get("files"))


def read_partition(data_dir: str, split: str, partition: int,
                   layout: PartitionLayout | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One partition's ``(features, label)`` arrays, in the order they were written (writable
    copies)."""
    layout = layout or read_layout(data_dir)
    with files.open_file(partition_file(data_dir, split, partition)) as f:
        features, label = arrays(pq.ParquetFile(f).read(), layout)
    return np.array(features), np.array(label)


def arrays(table: pa.Table, layout: PartitionLayout) -> tuple[np.ndarray, np.ndarray]:
    """A table of partition rows as ``(features, label)``: features in their stored dtype
    (float32 for runs written before dtypes were kept), bytes as an object array. Numbers
    are copied once, from Arrow's buffers into one array (read-only where Arrow allows it
    without a copy: batches are copies of their rows anyway)."""
    n = table.num_rows

    def unpack(name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        chunks = table.column(name).chunks
        if dtype == BYTES:
            return np.array([value for c in chunks for value in c.to_pylist()], object)
        values = [_values(c, dtype) if shape else _scalars(c) for c in chunks]
        array = values[0] if len(values) == 1 else np.concatenate(values) if values else np.zeros(0, dtype)
        return array.astype(dtype, copy=False).reshape((n, *shape))

    feature_shape = () if layout.feature_dtype == BYTES else layout.feature_shape
    return (unpack("features", feature_shape, layout.feature_dtype),
            unpack("label", layout.label_shape, layout.label_dtype))


def _scalars(chunk: pa.Array) -> np.ndarray:
    """A column of numbers without nulls as a view of its buffer: Arrow's own ``to_numpy``
    imports pandas, 45 MB a worker would carry for nothing."""
    if pa.types.is_integer(chunk.type) and chunk.null_count == 0:
        dtype = np.dtype(str(chunk.type))
    elif pa.types.is_floating(chunk.type) and chunk.null_count == 0:
        dtype = np.dtype(f"float{chunk.type.bit_width}")
    else:
        return chunk.to_numpy(zero_copy_only=False)
    return np.frombuffer(chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)


def _values(chunk: pa.Array, dtype: str) -> np.ndarray:
    """The numbers of a chunk of rows: a view of a fixed-size binary column's buffer, or the
    flattened values of a list column (how partitions were written before)."""
    if pa.types.is_fixed_size_binary(chunk.type):
        width = chunk.type.byte_width
        return np.frombuffer(chunk.buffers()[1], dtype=np.uint8, count=len(chunk) * width,
                             offset=chunk.offset * width).view(dtype)
    return _scalars(chunk.flatten())
