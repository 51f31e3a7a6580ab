"""The sample order: which rows of a partition a sub-epoch trains on, batch after batch.

One definition for every storage (invariant 6): a function of the sub-epoch's seed and the
partition's layout only. A partition is stored as row groups of ``row_group_rows`` rows; the
sub-epoch visits them in a seeded order, ``window`` row groups at a time, and shuffles the
rows within each window. A worker that streams a partition holds one window (plus the next,
read ahead) instead of the whole partition, and one that holds it in memory indexes the same
rows: both feed the model the same batches, bit for bit. The rows were shuffled once when the
partitions were written (by the data seed), so a window is a random sample of the partition.

Petastorm's shuffling row-group reader (Uber, 2018) and TensorFlow's shuffle buffer trade
randomness for memory in the same way; the window here is fixed by the layout, never by a
worker's memory, so results do not depend on where they ran.

Example:
    >>> order = sample_order(SampleScheme.WINDOWED, seed=7, rows=10, row_group_rows=4, window=2)
    >>> sorted(order.tolist()) == list(range(10))
    True
"""
from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


class SampleScheme(enum.StrEnum):
    """How a sub-epoch's rows are ordered; recorded in the run's ``data/meta.json``."""

    PERMUTATION = "permutation"    # one torch.randperm over the partition: runs written before row groups
    WINDOWED = "windowed/1"        # seeded row-group order, rows shuffled within windows of row groups


def sample_order(scheme: SampleScheme, seed: int, rows: int, row_group_rows: int, window: int) -> np.ndarray:
    """The partition's row indices in the order a training sub-epoch with ``seed`` visits them."""
    if scheme is SampleScheme.PERMUTATION:
        # The order of runs written before row groups, kept for their resume.
        import torch
        return torch.randperm(rows, generator=torch.Generator().manual_seed(seed)).numpy()
    return np.concatenate([w.rows[w.shuffle] for w in windows(seed, rows, row_group_rows, window)] or
                          [np.zeros(0, np.int64)])


@dataclass(frozen=True)
class Window:
    """Row groups read together, and the order their rows are yielded in."""

    groups: list[int]          # ascending
    rows: np.ndarray           # the partition's indices of their rows, ascending
    shuffle: np.ndarray        # positions into ``rows``, in the order they are yielded


def windows(seed: int, rows: int, row_group_rows: int, window: int) -> Iterator[Window]:
    """The windows of :attr:`SampleScheme.WINDOWED`, in the order a sub-epoch visits them."""
    rng = np.random.default_rng([seed, 0])     # stream 0: the order; the transform's rng is stream 1
    groups = rng.permutation(-(-rows // row_group_rows))
    for start in range(0, len(groups), window):
        members = sorted(int(g) for g in groups[start:start + window])
        indices = np.concatenate([np.arange(g * row_group_rows, min((g + 1) * row_group_rows, rows))
                                  for g in members])
        yield Window(members, indices, rng.permutation(len(indices)))


def transform_rng(seed: int, train: bool) -> np.random.Generator:
    """The generator a sub-epoch's ``transform`` (``train``) or ``eval_transform`` draws
    from: streams of their own, so augmentation never shifts the sample order."""
    return np.random.default_rng([seed, 1 if train else 2])
