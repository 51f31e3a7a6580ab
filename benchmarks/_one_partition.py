"""One in-memory partition trained as a worker trains it, for the trainer benchmarks."""
from __future__ import annotations

import numpy as np
import torch

import cerebro as cb
from cerebro.data import InMemoryPartition, PartitionLayout, SampleScheme, sample_order, transform_rng
from cerebro.worker import Sums

WINDOW = 8


def partition(features: torch.Tensor, label: torch.Tensor) -> InMemoryPartition:
    """``features`` and ``label`` as one partition of one row group."""
    rows = len(label)
    layout = PartitionLayout(1, tuple(features.shape[1:]), tuple(label.shape[1:]), str(label.numpy().dtype),
                             {"train": [rows], "val": [0]}, str(features.numpy().dtype), rows, WINDOW,
                             SampleScheme.WINDOWED)
    return InMemoryPartition(layout, features.numpy(), label.numpy())


def train(trainable: cb.Trainable, source: InMemoryPartition, seed: int, epoch: int = 1) -> Sums:
    """One training sub-epoch, as a worker runs it: batches in the sample order, made into the
    framework's."""
    rng = transform_rng(seed, True)
    batches = (trainable.batch(f, y, rng, train=True, device=torch.device("cpu"))
               for f, y in source.train_batches(seed, trainable.batch_size))
    return trainable.train_batches(batches, seed, epoch)


def order(rows: int, seed: int) -> torch.Tensor:
    """The sample order of a partition of one row group, for a hand-written loop."""
    return torch.from_numpy(sample_order(SampleScheme.WINDOWED, seed, rows, rows, WINDOW).astype(np.int64))
