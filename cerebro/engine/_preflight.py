"""Checks of the user's ``build`` on the driver, before any worker starts (invariant 4).

``build`` runs for a few configurations of the space, on the meta device (no memory, no
init) where the user's code allows it, else on the CPU. From the first that builds it learns
the metrics the trainable logs, and so whether ``metric`` can rank the trials and whether a
space key would overwrite a history column; then it runs the model and the loss on two rows
of the training data, to refuse what fails for every trial alike: labels whose dtype the
loss cannot take (float labels for a classification loss) and a loss that is not a scalar.
What may differ between configurations (a model whose output does not fit the labels) is
left to the trials, which fail at their first sub-epoch with the shapes in their error.
"""
from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..data import Dataset
from ..worker import TorchTrainable

HISTORY_COLUMNS = ("trial_id", "epoch", "exploited_from")


def check_build(build: Callable[[dict], Any], configs: Sequence[dict[str, Any]], metric: str,
                data: Dataset) -> None:
    """Raise, naming the problem, if the run could not do what it is asked (see the module)."""
    trainable, config = _first_that_builds(build, configs)
    if not isinstance(trainable, TorchTrainable):
        raise TypeError(f"build(config) must return a cerebro.TorchTrainable; got {type(trainable).__name__}")
    prefixes = ("train", "val") if data.has_validation else ("train",)
    logged = [f"{p}_{name}" for p in prefixes for name in ("loss", *trainable.metrics)]
    if metric not in logged:
        hint = "" if data.has_validation else " (the data has no validation split)"
        raise ValueError(f"metric={metric!r} is not logged{hint}; logged metrics are {logged}")
    clashes = [key for key in config if key in (*HISTORY_COLUMNS, *logged)]
    if clashes:
        raise ValueError(f"space key {clashes[0]!r} is also a column of result.history() "
                         f"({', '.join((*HISTORY_COLUMNS, *logged))}); rename it")
    sample = data.sample(2)
    if sample is not None:
        _check_loss(trainable, *sample)


def _first_that_builds(build: Callable[[dict], Any], configs: Sequence[dict[str, Any]]) -> tuple[Any, dict]:
    """The first of ``configs`` that builds; a build that fails for every one is bad input."""
    failures = []
    for config in {repr(c): c for c in configs}.values():   # each distinct one once
        for device in ("meta", "cpu"):
            try:
                with torch.device(device):
                    return build(config), config
            except Exception as error:
                if device == "cpu":
                    failures.append((config, error))
    config, error = failures[0]
    raise ValueError(f"build(config) fails for each of the {len(failures)} configurations tried on the driver, "
                     f"e.g. {config}: {type(error).__name__}: {error}\n"
                     + "".join(traceback.format_exception(error))) from error


def _check_loss(trainable: TorchTrainable, features: np.ndarray, label: np.ndarray) -> None:
    device = next((p.device for p in trainable.model.parameters()), torch.device("cpu"))
    inputs, targets = torch.from_numpy(features), torch.from_numpy(label)
    with torch.no_grad():
        try:
            loss = trainable.loss(trainable.model(inputs.to(device)), targets.to(device))
        except Exception as error:
            _check_label_dtype(trainable, targets, error)
            return                         # the model's own problem: its trial will say so
    if loss.dim() != 0:
        raise ValueError(f"loss(outputs, targets) must return a scalar (the batch's mean loss); it returned a "
                         f"tensor of shape {tuple(loss.shape)} (a loss with reduction='none'?)")


def _check_label_dtype(trainable: TorchTrainable, targets: torch.Tensor, error: Exception) -> None:
    """Float labels that the loss fails on but takes as class indices: a classification
    loss given the wrong label dtype, whatever the model."""
    if not targets.is_floating_point():
        return
    classes = torch.zeros(len(targets), int(targets.max().clamp(min=1).item()) + 1, device=targets.device)
    try:
        trainable.loss(classes, targets)
    except Exception:
        try:
            trainable.loss(classes, targets.long().clamp(min=0))
        except Exception:
            return
        raise ValueError(f"the label is float32 but the loss takes class indices: loss(outputs, targets) fails on "
                         f"float labels ({type(error).__name__}: {str(error).splitlines()[0]}); encode the classes "
                         f"as integers 0..K-1 (e.g. y.astype(int))") from None
