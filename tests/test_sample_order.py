"""The sample order: one definition for every storage. A sub-epoch visits each row of its
partition once, in an order fixed by its seed and the layout alone; streamed and in-memory
partitions yield the same batches, whatever the batch size, row group size and window."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cerebro as cb
from cerebro.data import SampleScheme, _partitions, open_partition, read_layout, sample_order, write_partitions


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


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 120), group_bytes=st.sampled_from([64, 300, 1000, 1 << 20]),
       batch=st.integers(1, 70), seed=st.integers(0, 1000))
def test_streamed_batches_equal_in_memory_batches(tmp_path_factory, rows, group_bytes, batch, seed):
    directory = str(tmp_path_factory.mktemp("partitions"))
    features = np.random.default_rng(seed).integers(0, 255, (rows, 2, 3), dtype=np.uint8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_partitions, "ROW_GROUP_BYTES", group_bytes)
        write_partitions(cb.Dataset.from_numpy(features, np.arange(rows), validation=None), directory, 1)
    layout = read_layout(directory)
    memory, streamed = (open_partition(layout, directory, "train", 0, in_memory) for in_memory in (True, False))
    for make in (lambda s: s.train_batches(seed, batch), lambda s: s.eval_batches(batch)):
        got = list(make(streamed))
        expected = list(make(memory))
        assert len(got) == len(expected) == -(-rows // batch)
        for (x, y), (u, v) in zip(got, expected):
            assert x.dtype == np.uint8 and np.array_equal(x, u) and np.array_equal(y, v)
