"""Metric functions for ``TorchTrainable(metrics={...})``.

A metric takes a batch's model outputs and targets and returns the batch mean as a scalar
tensor; Cerebro weights it by the batch's row count, so an epoch's value is the mean over
all rows however the rows were split into batches and partitions. Any function of that
shape works, e.g. ``metrics={"top1": lambda out, y: (out.argmax(1) == y).float().mean()}``.
"""
from __future__ import annotations

import torch


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of rows whose highest-scoring class is the target class.

    >>> float(accuracy(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1])))
    0.5
    """
    return (outputs.argmax(dim=-1) == targets).float().mean()


def mean_squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean of the squared differences, for regression; ``outputs`` of shape (n, 1) or (n,).

    >>> float(mean_squared_error(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])))
    2.5
    """
    return torch.mean((outputs.reshape(targets.shape).float() - targets.float()) ** 2)


def mean_absolute_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean of the absolute differences, for regression; ``outputs`` of shape (n, 1) or (n,).

    >>> float(mean_absolute_error(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])))
    1.5
    """
    return torch.mean(torch.abs(outputs.reshape(targets.shape).float() - targets.float()))
