"""Checks of the user's ``build`` on the driver, before any worker starts (invariant 4).

``build`` runs for a few configurations (the policy's first trials, then some drawn from the
space), on the meta device (no memory, no init) where the user's code allows it, else on
the CPU. From the first that builds it learns
the metrics the trainable logs, and so whether ``metric`` can rank the trials and whether a
space key would overwrite a history column; and from its loss object what fails for every
trial alike: float labels for torch's classification losses, a loss with
``reduction='none'``. Nothing else of the user's code runs here: a model or a loss may have
side effects. What the driver cannot see (a model whose output does not fit the labels, a
loss of its own that is not a scalar) fails that trial at its first sub-epoch, with the
shapes in its error.
"""
from __future__ import annotations

import copy
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..data import Dataset
from ..report import flat_config
from ..worker import Trainable
from ._interface import SearchPolicy

HISTORY_COLUMNS = ("trial_id", "epoch", "exploited_from", "warm_started_from")


def check_build(build: Callable[[dict], Any], configs: Sequence[dict[str, Any]], metric: str,
                data: Dataset) -> Trainable:
    """The first of ``configs``' trainables; raises, naming the problem, if the run could not do
    what it is asked (see the module)."""
    trainable, config = _first_that_builds(build, configs)
    logged = check_metric(trainable, metric, data.has_validation)
    stepped_on = trainable.epoch_metric()
    if stepped_on is not None and stepped_on not in logged:
        raise ValueError(f"lr_scheduler_metric={stepped_on!r}, which the lr_scheduler steps on, is not logged; "
                         f"logged metrics are {logged}")
    clashes = [key for key in flat_config(config) if key in (*HISTORY_COLUMNS, *logged)]
    if clashes:
        raise ValueError(f"space key {clashes[0]!r} is also a column of result.history() "
                         f"({', '.join((*HISTORY_COLUMNS, *logged))}); rename it")
    if data.feature_dtype == "bytes" and (trainable.transform is None or
                                          data.has_validation and trainable.eval_transform is None):
        missing = "transform" if trainable.transform is None else "eval_transform"
        raise ValueError(f"the features are bytes (encoded data) and build(config) gives no {missing} to decode "
                         f"them; pass {type(trainable).__name__}({missing}=fn), fn(features, rng) -> array")
    sample = data.sample(1)
    if sample is not None:
        trainable.check_label(sample[1])
    return trainable


def first_trials(policy: SearchPolicy, seed: int) -> list[dict[str, Any]]:
    """The configurations ``policy`` starts with under ``seed``, from a copy of it, so the
    run's own policy has spent nothing."""
    probe = copy.deepcopy(policy)
    probe.start(seed)
    return [request.config for request in probe.suggest()[:8]]


def check_metric(trainable: Any, metric: str, has_validation: bool) -> list[str]:
    """The metrics ``trainable`` logs; raises unless it is a trainer that logs ``metric``."""
    if not isinstance(trainable, Trainable):
        raise TypeError(f"build(config) must return a cerebro.TorchTrainable or cerebro.KerasTrainable; "
                        f"got {type(trainable).__name__}")
    prefixes = ("train", "val") if has_validation else ("train",)
    logged = [f"{p}_{name}" for p in prefixes for name in ("loss", *trainable.metric_names())]
    if has_validation:
        logged += [f"val_{name}" for name in trainable.validation_metric_names()]
    if metric not in logged:
        hint = "" if has_validation else " (the data has no validation split)"
        raise ValueError(f"metric={metric!r} is not logged{hint}; logged metrics are {logged}")
    return logged


def _first_that_builds(build: Callable[[dict], Any], configs: Sequence[dict[str, Any]]) -> tuple[Any, dict]:
    """The first of ``configs`` that builds; a build that fails for every one is bad input."""
    failures = []
    for config in {repr(c): c for c in configs}.values():   # each distinct one once
        try:
            return build_cheaply(build, config), config
        except Exception as error:
            failures.append((config, error))
    config, error = failures[0]
    raise ValueError(f"build(config) fails for each of the {len(failures)} configurations tried on the driver, "
                     f"e.g. {config}: {type(error).__name__}: {error}\n"
                     + "".join(traceback.format_exception(error))) from error


def build_cheaply(build: Callable[[dict], Any], config: dict[str, Any]) -> Any:
    """``build(config)`` on torch's meta device (no memory, no init) where its framework
    allows that, else as it is."""
    try:
        with torch.device("meta"):
            trainable = build(config)
        if getattr(trainable, "builds_on_meta_device", False):
            return trainable
    except Exception:
        pass
    return build(config)
