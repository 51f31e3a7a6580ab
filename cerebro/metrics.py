"""Metric functions for ``TorchTrainable(metrics={...})``.

A metric takes a batch's model outputs and targets and returns the batch mean as a scalar
tensor; Cerebro weights it by the batch's row count, so an epoch's value is the mean over
all rows however the rows were split into batches and partitions. Any function of that
shape works, e.g. ``metrics={"top1": lambda out, y: (out.argmax(1) == y).float().mean()}``.
A :class:`ModelMetric` such as :data:`params` is a number of the model itself instead.
"""
from __future__ import annotations

from collections.abc import Callable

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


class ModelMetric:
    """A metric of the model itself rather than of its outputs: ``function(model)`` -> a
    number, computed on the worker after each sub-epoch and logged each epoch under its own
    name, with no ``train_``/``val_`` prefix. Give it in ``TorchTrainable(metrics=...)``
    like any metric; :data:`params` is one.

    >>> params(torch.nn.Linear(64, 10))
    650.0
    """

    def __init__(self, function: Callable[[torch.nn.Module], float], name: str) -> None:
        self.function, self.__name__ = function, name

    def __call__(self, model: torch.nn.Module) -> float:
        return float(self.function(model))

    def __repr__(self) -> str:
        return f"cb.metrics.{self.__name__}"


def _trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


params = ModelMetric(_trainable_parameters, "params")
"""The model's number of trainable parameters (those of ``model``, not of ``frozen`` layers):
``metrics={"accuracy": cb.metrics.accuracy, "params": cb.metrics.params}`` logs ``params``
each epoch, an objective to minimise beside accuracy (``metric=["val_accuracy", "params"]``)."""
