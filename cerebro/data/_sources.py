"""A worker's partitions: held in memory or streamed from Parquet row groups, batched in
one sample order (see :mod:`._sample_order`), so both give the model the same bits."""
from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np
import pyarrow.parquet as pq

from ..store import _files as files
from ._file_checks import check_file
from ._mapped import MappedPartition, MappedRows, map_partition
from ._partitions import BYTES, PartitionLayout, arrays, partition_file
from ._sample_order import SampleScheme, sample_order, windows

Rows = np.ndarray | MappedRows                       # a window's rows, taken by their positions
Part = tuple[Rows, Rows, np.ndarray]                   # features, label, positions to yield in order
Batch = tuple[np.ndarray, np.ndarray]


class PartitionSource(abc.ABC):
    """One split of one partition, as a worker reads it."""

    def __init__(self, layout: PartitionLayout, rows: int) -> None:
        self.layout, self.rows = layout, rows

    def train_batches(self, seed: int, batch_size: int) -> Iterator[Batch]:
        """Batches of a training sub-epoch with ``seed``, in the sample order."""
        return batched(self._train_parts(seed), batch_size)

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        """Batches of an evaluation, in the stored order."""
        return batched(self._eval_parts(), batch_size)

    @abc.abstractmethod
    def _train_parts(self, seed: int) -> Iterator[Part]:
        """The rows of a training sub-epoch, part after part."""

    @abc.abstractmethod
    def _eval_parts(self) -> Iterator[Part]:
        """Every row, in the stored order, part after part."""


class InMemoryPartition(PartitionSource):
    """A partition held in memory, in its stored dtype (uint8 images stay uint8)."""

    def __init__(self, layout: PartitionLayout, features: np.ndarray, label: np.ndarray) -> None:
        super().__init__(layout, len(label))
        self.features, self.label = features, label

    def _train_parts(self, seed: int) -> Iterator[Part]:
        layout = self.layout
        yield self.features, self.label, sample_order(layout.sample_order, seed, self.rows,
                                                      layout.row_group_rows or max(self.rows, 1), layout.window)

    def _eval_parts(self) -> Iterator[Part]:
        yield self.features, self.label, np.arange(self.rows)


class StreamedPartition(PartitionSource):
    """A partition read from its Parquet file a window of row groups at a time, so a worker
    holds about one window of it (two while its prefetch thread starts on the next),
    whatever the partition's size. Files in the form Cerebro writes are mapped and each
    batch gathered from the page cache in place (:mod:`._mapped`); others (written before,
    or bytes features) are read and decoded by Arrow."""

    def __init__(self, layout: PartitionLayout, path: str, rows: int, expected: tuple[int, int] | None = None
                 ) -> None:
        if layout.sample_order is SampleScheme.PERMUTATION or layout.row_group_rows is None:
            raise ValueError("this run's partitions were written before row groups and cannot be streamed; "
                             "hold them in memory (in_memory=True)")
        super().__init__(layout, rows)
        self.path, self._group_rows = path, layout.row_group_rows
        self._checked = check_file(path, expected)     # in full once; then by size and time (_open)
        self._mapped: MappedPartition | None = None      # or, for files not in that form:
        self._parquet: pq.ParquetFile | None = None      # opened once: its footer lists every row group

    @property
    def mapped(self) -> bool:
        """Whether the file is read in place (known once a sub-epoch has started reading it)."""
        return self._mapped is not None

    def _train_parts(self, seed: int) -> Iterator[Part]:
        order = windows(seed, self.rows, self._group_rows, self.layout.window)
        return self._parts((w.groups, w.rows, w.shuffle) for w in order)

    def _eval_parts(self) -> Iterator[Part]:
        group_rows, window = self._group_rows, self.layout.window
        groups = -(-self.rows // group_rows)

        def in_stored_order() -> Iterator[tuple[list[int], np.ndarray, np.ndarray]]:
            for start in range(0, groups, window):
                rows = np.arange(start * group_rows, min((start + window) * group_rows, self.rows))
                yield list(range(start, min(start + window, groups))), rows, np.arange(len(rows))
        return self._parts(in_stored_order())

    def _parts(self, order: Iterator[tuple[list[int], np.ndarray, np.ndarray]]) -> Iterator[Part]:
        """Each window ``(row groups, their rows, positions to yield)`` as a part."""
        self._open()
        if self._mapped is None:
            for groups, _, positions in order:
                features, label = self._read(groups)
                yield features, label, positions
            return
        mapped = self._mapped
        ahead = next(order, None)
        if ahead is not None:
            mapped.will_need(ahead[0])
        while ahead is not None:
            groups, rows, positions = ahead
            ahead = next(order, None)
            if ahead is not None:
                mapped.will_need(ahead[0])     # the kernel reads it while this window is batched
            try:
                in_place, labels_in_place = mapped.rows(rows)
                yield in_place, labels_in_place, positions
            finally:
                mapped.done_with(groups)

    def _open(self) -> None:
        """Open the file the first time; each later sub-epoch checks it is still the one checked."""
        self._checked.check_unchanged()
        if self._mapped is not None or self._parquet is not None:
            return
        layout = self.layout
        if layout.feature_dtype != BYTES:
            columns = [(layout.feature_shape, layout.feature_dtype), (layout.label_shape, layout.label_dtype)]
            self._mapped = map_partition(self.path, columns, self.rows, self._group_rows)
        if self._mapped is None:
            self._parquet = pq.ParquetFile(files.open_file(self.path))

    def _read(self, groups: list[int]) -> tuple[np.ndarray, np.ndarray]:
        assert self._parquet is not None, "_open opens the file mapped or with Arrow"
        # One thread: the worker's cores are busy training; this runs on its prefetch thread.
        return arrays(self._parquet.read_row_groups(groups, use_threads=False), self.layout)


def batched(parts: Iterator[Part], batch_size: int) -> Iterator[Batch]:
    """Rows of ``parts`` in order, in batches of ``batch_size`` (the last may be smaller); a
    batch may span two parts."""
    pieces: list[Batch] = []
    held = 0
    for features, label, positions in parts:
        start = 0
        while start < len(positions):
            take = positions[start:start + batch_size - held]
            start += len(take)
            pieces.append((features[take], label[take]))
            held += len(take)
            if held == batch_size:
                yield _join(pieces)
                pieces, held = [], 0
    if held:
        yield _join(pieces)


def _join(pieces: list[Batch]) -> Batch:
    if len(pieces) == 1:
        return pieces[0]
    return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


def open_partition(layout: PartitionLayout, data_dir: str, split: str, partition: int,
                   in_memory: bool) -> PartitionSource:
    """One split of one partition from ``data_dir``, held in memory or streamed."""
    path = partition_file(data_dir, split, partition)
    expected = layout.file_check(split, partition)
    if not in_memory:
        return StreamedPartition(layout, path, layout.rows[split][partition], expected)
    check_file(path, expected)
    with files.open_file(path) as f:   # not pq.read_table: it goes through pyarrow.dataset, which loads pandas
        return InMemoryPartition(layout, *arrays(pq.ParquetFile(f).read(), layout))
