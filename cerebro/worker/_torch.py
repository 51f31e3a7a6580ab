"""The PyTorch trainer: what a trial is on a worker, and how it trains one sub-epoch."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ._protocol import Sums

Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TorchTrainable:
    """A model with how to train it; the user's ``build(config)`` returns one.

    Args:
        model: the ``torch.nn.Module`` to train.
        optimizer: an optimizer over ``model``'s parameters.
        loss: ``loss(outputs, targets)`` -> the mean loss of a batch, as a scalar tensor.
        batch_size: rows per mini-batch.
        metrics: name -> ``metric(outputs, targets)``, each logged per epoch for training
            (``train_<name>``) and validation (``val_<name>``).

    Example:
        >>> def build(config):
        ...     model = torch.nn.Linear(64, 10)
        ...     return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"]),
        ...                              torch.nn.functional.cross_entropy, batch_size=32,
        ...                              metrics={"accuracy": cb.metrics.accuracy})
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch_size: int
    metrics: Mapping[str, Metric] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module; got {type(self.model).__name__}")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer; got {type(self.optimizer).__name__}")
        if not callable(self.loss):
            raise TypeError(f"loss={self.loss!r} must be callable as loss(outputs, targets)")
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size!r} must be a positive integer")
        self.metrics = dict(self.metrics or {})
        for name, metric in self.metrics.items():
            if not isinstance(name, str) or not name or name == "loss":
                raise ValueError(f"metric name {name!r} must be a non-empty string other than 'loss', "
                                 f"which is always logged")
            if not callable(metric):
                raise TypeError(f"metric {name!r}={metric!r} must be callable as metric(outputs, targets)")

    # --- the state that hops ------------------------------------------------------------
    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, state: Mapping, *, keep_hyperparameters: bool = False) -> None:
        """Load weights and optimizer state; with ``keep_hyperparameters`` the optimizer keeps
        the learning rate, weight decay, ... it was built with (PBT's explore step)."""
        built = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if keep_hyperparameters:
            for group, hyperparameters in zip(self.optimizer.param_groups, built):
                group.update(hyperparameters)

    # --- sub-epochs ---------------------------------------------------------------------
    def train_partition(self, features: torch.Tensor, label: torch.Tensor, seed: int,
                        deadline: float | None = None) -> Sums:
        """Plain mini-batch SGD over one partition, batches in an order fixed by ``seed``.

        Stops early, with non-finite sums, as soon as the loss stops being finite; raises
        :class:`SubEpochTimeout` after a batch that ends past ``deadline`` (``time.monotonic``).
        """
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout and any other randomness inside the model
        order = torch.randperm(len(features), generator=generator).to(features.device)
        sums = Sums.empty(self.metrics)
        self.model.train()
        for start in range(0, len(features), self.batch_size):
            rows = order[start:start + self.batch_size]
            inputs, targets = features[rows], label[rows]
            self.optimizer.zero_grad(set_to_none=True)
            outputs, loss = self._forward(inputs, targets)
            loss.backward()
            self.optimizer.step()
            sums += _batch_sums(loss, outputs.detach(), targets, self.metrics)
            if not math.isfinite(sums.loss):
                break
            _check(deadline)
        return sums

    @torch.no_grad()
    def evaluate_partition(self, features: torch.Tensor, label: torch.Tensor, deadline: float | None = None) -> Sums:
        """Loss and metrics over one partition, in batches of ``batch_size``."""
        sums = Sums.empty(self.metrics)
        self.model.eval()
        for start in range(0, len(features), self.batch_size):
            inputs, targets = features[start:start + self.batch_size], label[start:start + self.batch_size]
            outputs, loss = self._forward(inputs, targets)
            sums += _batch_sums(loss, outputs, targets, self.metrics)
            _check(deadline)
        return sums


    def _forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's outputs and the batch's loss; a failure says what the shapes were."""
        outputs = None
        try:
            outputs = self.model(inputs)
            loss = self.loss(outputs, targets)
        except Exception as error:
            made = "" if outputs is None else f" -> outputs {_shape(outputs)}"
            error.add_note(f"on a batch of features {_shape(inputs)}{made}, labels {_shape(targets)}")
            raise
        if loss.dim() != 0:
            raise ValueError(f"loss(outputs, targets) must return a scalar (the batch's mean loss); it returned "
                             f"a tensor of shape {tuple(loss.shape)} (a loss with reduction='none'?)")
        return outputs, loss


def _shape(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


class SubEpochTimeout(Exception):
    """A sub-epoch ran past its trial_timeout."""


def _check(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise SubEpochTimeout("the sub-epoch ran past its trial_timeout")



@torch.no_grad()
def _batch_sums(loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor,
                metrics: Mapping[str, Metric]) -> Sums:
    n = len(targets)
    return Sums(n, float(loss.detach()) * n, {name: float(metric(outputs, targets)) * n
                                              for name, metric in metrics.items()})
