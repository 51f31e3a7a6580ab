"""The PyTorch trainer: what a trial is on a worker, and how it trains one sub-epoch."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ._protocol import Sums

Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Transform = Callable[[np.ndarray, np.random.Generator], Any]
Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


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
        transform: ``transform(features, rng)`` -> an array or tensor with one row per row of
            ``features``, run on the worker on every training batch (decode, normalise,
            augment) in its prefetch thread. ``features`` is the batch as stored (e.g. uint8
            images, or an object array of ``bytes``); ``rng`` is a ``numpy.random.Generator``
            seeded by the sub-epoch, so augmentation is reproducible: draw from it, never
            from a global generator. Default: the features as float32.
        eval_transform: the same for evaluation batches. Default: none (float32 features),
            so augmentation never touches evaluation; decoding that evaluation needs too
            goes in both.

    Example:
        >>> def build(config):
        ...     model = torch.nn.Linear(64, 10)
        ...     return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"]),
        ...                              torch.nn.functional.cross_entropy, batch_size=32,
        ...                              metrics={"accuracy": cb.metrics.accuracy})

        Images stored as uint8, flipped at random for training:

        >>> def flip(images, rng):
        ...     images = images.astype(np.float32) / 255
        ...     return np.where(rng.random(len(images))[:, None, None, None] < 0.5, images[..., ::-1], images)
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch_size: int
    metrics: Mapping[str, Metric] = field(default_factory=dict)
    transform: Transform | None = None
    eval_transform: Transform | None = None

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
        for name in ("transform", "eval_transform"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise TypeError(f"{name}={getattr(self, name)!r} must be callable as {name}(features, rng), or None")

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
    def tensors(self, features: np.ndarray, label: np.ndarray, rng: np.random.Generator, *, train: bool,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch as stored, made into the model's inputs and targets on ``device``: through
        ``transform`` (``train``) or ``eval_transform``, else as float32."""
        transform = self.transform if train else self.eval_transform
        if transform is None:
            if features.dtype == object:
                raise TypeError(f"the features are bytes (encoded data): give TorchTrainable a "
                                f"{'transform' if train else 'eval_transform'} that decodes them")
            inputs = torch.from_numpy(features).float()
        else:
            inputs = _as_tensor(transform(features, rng), "transform" if train else "eval_transform")
            if inputs.dim() == 0 or len(inputs) != len(features):
                raise ValueError(f"{'transform' if train else 'eval_transform'} returned {_shape(inputs)} for a "
                                 f"batch of {len(features)} rows; it must return one row per row")
        targets = torch.from_numpy(label)
        if device.type == "cuda":      # pinned, so the copy overlaps the previous batch's compute
            return (inputs.pin_memory().to(device, non_blocking=True),
                    targets.pin_memory().to(device, non_blocking=True))
        return inputs.to(device), targets.to(device)

    def train_batches(self, batches: Batches, seed: int, deadline: float | None = None) -> Sums:
        """Plain mini-batch SGD over ``batches`` (a partition's, in its sample order), with the
        model's own randomness (dropout) seeded by ``seed``.

        Stops early, with non-finite sums, as soon as the loss stops being finite; raises
        :class:`SubEpochTimeout` after a batch that ends past ``deadline`` (``time.monotonic``).
        """
        torch.manual_seed(seed)
        sums = Sums.empty(self.metrics)
        self.model.train()
        for inputs, targets in batches:
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
    def evaluate_batches(self, batches: Batches, deadline: float | None = None) -> Sums:
        """Loss and metrics over ``batches``."""
        sums = Sums.empty(self.metrics)
        self.model.eval()
        for inputs, targets in batches:
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


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.from_numpy(np.ascontiguousarray(value))
    except TypeError:
        raise TypeError(f"{name} must return a numeric array or tensor; it returned {_shape(value)}"
                        f"{f' of dtype {value.dtype}' if hasattr(value, 'dtype') else ''}") from None


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
