"""Metric functions for ``TorchTrainable(metrics={...})``.

A metric takes a batch's model outputs and targets and returns the batch mean as a scalar
tensor; Cerebro weights it by the batch's row count, so an epoch's value is the mean over
all rows however the rows were split into batches and partitions. Any function of that
shape works, e.g. ``metrics={"top1": lambda out, y: (out.argmax(1) == y).float().mean()}``.
"""
from __future__ import annotations

import torch


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of rows whose highest-scoring class is the target class."""
    return (outputs.argmax(dim=-1) == targets).float().mean()


def mean_squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.mean((outputs.reshape(targets.shape).float() - targets.float()) ** 2)


def mean_absolute_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.mean(torch.abs(outputs.reshape(targets.shape).float() - targets.float()))
