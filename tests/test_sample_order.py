"""The sample order: one definition for every storage. A sub-epoch visits each row of its
partition once, in an order fixed by its seed and the layout alone; streamed and in-memory
partitions yield the same batches, whatever the batch size, row group size and window."""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cerebro as cb
from cerebro.data import SampleScheme, _partitions, open_partition, read_layout, sample_order, write_partitions
from cerebro.data._mapped import map_partition


@given(rows=st.integers(1, 300), group=st.integers(1, 50), window=st.integers(1, 9), seed=st.integers(0, 2 ** 63 - 1))
def test_each_row_once_in_an_order_fixed_by_the_seed(rows, group, window, seed):
    order = sample_order(SampleScheme.WINDOWED, seed, rows, group, window)
    assert sorted(order.tolist()) == list(range(rows))
    assert np.array_equal(order, sample_order(SampleScheme.WINDOWED, seed, rows, group, window))


def test_the_order_varies_with_the_seed_and_mixes_rows_across_row_groups():
    a, b = (sample_order(SampleScheme.WINDOWED, seed, 1000, 10, 8) for seed in (1, 2))
    assert not np.array_equal(a, b)
    first_window = set(a[:80] // 10)        # 8 row groups of 10 rows, shuffled together
    assert len(first_window) == 8


def test_runs_written_before_row_groups_keep_their_torch_permutation():
    expected = torch.randperm(97, generator=torch.Generator().manual_seed(5)).numpy()
    assert np.array_equal(sample_order(SampleScheme.PERMUTATION, 5, 97, 97, 1), expected)


def _rewrite_as_before(directory: str, layout) -> None:
    """Rewrite the partition files the way earlier versions did (nullable columns, a
    dictionary, snappy labels; here also several pages per row group): a streaming worker
    then decodes them with Arrow instead of reading them in place."""
    for split in ("train", "val"):
        path = _partitions.partition_file(directory, split, 0)
        table = pq.read_table(path)
        table = table.cast(pa.schema([field.with_nullable(True) for field in table.schema]))
        pq.write_table(table, path, row_group_size=layout.row_group_rows, compression={"label": "snappy"},
                       max_rows_per_page=2)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 120), group_bytes=st.sampled_from([64, 300, 1000, 1 << 20]),
       batch=st.integers(1, 70), seed=st.integers(0, 1000),
       dtype=st.sampled_from([np.uint8, np.float32, np.int16]), label_shape=st.sampled_from([(), (2,)]),
       as_before=st.booleans())
def test_streamed_batches_equal_in_memory_batches(tmp_path_factory, rows, group_bytes, batch, seed, dtype,
                                                  label_shape, as_before):
    directory = str(tmp_path_factory.mktemp("partitions"))
    rng = np.random.default_rng(seed)
    features = rng.integers(0, 255, (rows, 2, 3)).astype(dtype)
    label = np.arange(rows) if label_shape == () else rng.normal(size=(rows, *label_shape))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_partitions, "ROW_GROUP_BYTES", group_bytes)
        write_partitions(cb.Dataset.from_numpy(features, label, validation=None), directory, 1)
    layout = read_layout(directory)
    if as_before:       # and no file checks in meta.json, as then
        _rewrite_as_before(directory, layout)
        layout = dataclasses.replace(layout, files=None)
    memory, streamed = (open_partition(layout, directory, "train", 0, in_memory) for in_memory in (True, False))
    for make in (lambda s: s.train_batches(seed, batch), lambda s: s.eval_batches(batch)):
        got = list(make(streamed))
        expected = list(make(memory))
        assert len(got) == len(expected) == -(-rows // batch)
        for (x, y), (u, v) in zip(got, expected):
            assert x.dtype == dtype and x.shape == u.shape and np.array_equal(x, u)
            assert y.dtype == v.dtype and y.shape == v.shape and np.array_equal(y, v)
    # Files as Cerebro writes them are read in place, earlier ones decoded.
    assert streamed.mapped == (not as_before)


def test_a_mapped_partition_holds_no_window_once_its_batches_are_made(tmp_path):
    """A streaming worker's memory is bounded by a window, not the partition: the pages of a
    window are unmapped once its batches are made (they stay in the page cache)."""
    features = np.random.default_rng(0).integers(0, 255, (4096, 3, 32, 32), dtype=np.uint8)    # 12 MB
    directory = str(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_partitions, "ROW_GROUP_BYTES", 1 << 18)      # 85 rows a group, 8 a window: 2 MB
        write_partitions(cb.Dataset.from_numpy(features, np.zeros(4096, int), validation=None), directory, 1)
    streamed = open_partition(read_layout(directory), directory, "train", 0, in_memory=False)
    resident = []
    for _ in streamed.train_batches(seed=3, batch_size=64):
        resident.append(_mapped_resident_bytes(_partitions.partition_file(directory, "train", 0)))
    assert streamed.mapped
    assert 0 < max(resident) <= 2 * 8 * (1 << 18) + (1 << 16), max(resident)


def _mapped_resident_bytes(path: str) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.parametrize("change, mapped", [
    ({}, True), ({"data_page_version": "2.0"}, True), ({"write_statistics": True}, True),
    ({"max_rows_per_page": 3}, False), ({"compression": "snappy"}, False), ({"use_dictionary": True}, False),
    ({"nullable": True}, False), ({"label_type": pa.float64()}, False), ({"rows": 39}, False),
])
def test_only_files_of_one_plain_page_per_row_group_are_read_in_place(tmp_path, change, mapped):
    """Anything else, or a file not of the expected rows and types, is decoded by Arrow: read
    in place, it would give other bits."""
    rows, group = 40, 10
    nullable, label_type = change.pop("nullable", False), change.pop("label_type", pa.int64())
    table = pa.table({"features": _partitions.column(np.arange(rows * 6, dtype=np.float32).reshape(rows, 6)),
                      "label": pa.array(np.arange(rows), type=label_type)})
    table = table.cast(pa.schema([field.with_nullable(nullable) for field in table.schema]))
    expected_rows = change.pop("rows", rows)
    options = {"compression": "none", "use_dictionary": False, "write_statistics": False, "max_rows_per_page": group,
               **change}
    path = str(tmp_path / "part.parquet")
    pq.write_table(table, path, row_group_size=group, data_page_size=1 << 30, **options)
    found = map_partition(path, [((6,), "float32"), ((), "int64")], expected_rows, group)
    assert (found is not None) == mapped
    if mapped:
        features, label = found.rows(np.arange(rows))
        assert np.array_equal(features[np.arange(rows)], np.arange(rows * 6, dtype=np.float32).reshape(rows, 6))
        assert np.array_equal(label[np.arange(rows)], np.arange(rows))
