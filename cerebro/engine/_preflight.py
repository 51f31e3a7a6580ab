"""Checks of the user's ``build`` on the driver, before any worker starts (invariant 4).

``build`` runs for a few configurations (the policy's first trials, then some drawn from the
space), on the meta device (no memory, no init) where the user's code allows it, else on
the CPU. From the first that builds it learns
the metrics the trainable logs, and so whether ``metric`` can rank the trials and whether a
space key would overwrite a history column; and from its loss object what fails for every
trial alike: float labels for torch's classification losses, a loss with
``reduction='none'``. Then, for torch, one training step of that configuration, built on
the CPU, on a few real training rows (:func:`check_a_step`): a loss that needs other labels,
a metric that raises, a model whose input is not the data's, class indices beyond the
model's outputs, all refused with the cause before any worker starts (not for a model over
2 GiB, which the driver does not build for real). That step runs the
user's model and loss on the driver, as Lightning's sanity check does; code with side effects
can ask :func:`cerebro.worker.in_preflight`. What depends on the configuration (one trial's
build that fails) fails that trial alone, at its first sub-epoch.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._checks import quoted
from ..data import Dataset
from ..results import flat_config
from ..worker import Trainable, preflight
from ..worker._frozen import DRAWS_ROWS, draws, frozen_draws
from ..worker._label_checks import CLASS_INDEX_FIX, check_class_range
from ..worker._torch_checks import ignored_class
from ..worker._trainable import not_a_trainable
from ._interface import SearchPolicy

HISTORY_COLUMNS = ("trial_id", "epoch", "exploited_from", "warm_started_from")
PREFLIGHT_ROWS = 4      # real rows for the preflight's one training step
# A model larger than this (weights and optimizer, as the meta build sizes it) is not built
# for real on the driver, whose memory is for the run's bookkeeping (DESIGN, invariant 7).
PREFLIGHT_MAX_BYTES = 2 << 30


def check_build(build: Callable[[dict], Any], configs: Sequence[dict[str, Any]], metric: str | Sequence[str],
                data: Dataset) -> Trainable:
    """The first of ``configs``' trainables; raises, naming the problem, if the run could not do
    what it is asked (see the module)."""
    trainable, config = _first_that_builds(build, configs)
    logged = check_metric(trainable, metric, data.has_validation)
    stepped_on = trainable.epoch_metric()
    if stepped_on is not None and stepped_on not in logged:
        raise ValueError(f"lr_scheduler_metric={quoted(stepped_on)}, which the lr_scheduler steps on, is not logged; "
                         f"logged metrics are {logged}")
    clashes = [key for key in flat_config(config) if key in (*HISTORY_COLUMNS, *logged)]
    if clashes:
        raise ValueError(f"space key {quoted(clashes[0])} is also a column of result.history() "
                         f"({', '.join((*HISTORY_COLUMNS, *logged))}); rename it")
    if data.feature_dtype == "bytes" and (trainable.transform is None or
                                          data.has_validation and trainable.eval_transform is None):
        missing = "transform" if trainable.transform is None else "eval_transform"
        raise ValueError(f"the features are bytes (encoded data) and build(config) gives no {missing} to decode "
                         f"them; pass {type(trainable).__name__}({missing}=fn), fn(features, rng) -> array")
    sample = data.sample(PREFLIGHT_ROWS)
    if sample is not None:
        trainable.check_label(sample[1])
        if trainable.checks_a_step_on_the_driver:
            check_a_step(build, [config, *configs], sample, data)
        else:
            check_rows(build, trainable, config, configs, sample, data.label_range())
            with preflight():
                _say_frozen(trainable, config, sample[0])
    return trainable


def check_rows(build: Callable[[dict], Any], trainable: Trainable, config: dict[str, Any],
               configs: Sequence[dict[str, Any]], sample: tuple[np.ndarray, np.ndarray],
               label_range: tuple[int, int] | None) -> None:
    """:meth:`Trainable.check_rows` of ``trainable`` (``config``'s), where no step runs on the
    driver; where it refuses the rows, of the other ``configs`` too, each built: its refusal is
    raised where every configuration is refused (another model, with more outputs say, may fit
    the rows, and only its own trials fail)."""
    try:
        trainable.check_rows(*sample, label_range)
        return
    except ValueError as error:
        refused = error
    for other in {repr(c): c for c in configs if c != config}.values():
        try:
            with preflight():
                build(other).check_rows(*sample, label_range)
            return
        except Exception:
            continue
    raise refused


def check_a_step(build: Callable[[dict], Any], configs: Sequence[dict[str, Any]],
                 sample: tuple[np.ndarray, np.ndarray], data: Dataset) -> None:
    """One training step of ``build(config)``, built on the CPU, on ``sample`` (a few real
    training rows), for the first of ``configs`` where that works; raises if it works for
    none, as every trial would then fail at its first batch. The copies are thrown away; a
    model or loss may ask :func:`cerebro.worker.in_preflight`."""
    failures = []
    for config in {repr(c): c for c in configs}.values():   # each distinct one once
        if _too_large(build, config):
            continue
        try:
            with preflight():
                _one_step(build, config, sample, data)
            return
        except Exception as error:
            if "cuda" in str(error).lower():      # it needs the workers' GPU: they will tell
                return
            failures.append((config, error))
    if not failures:
        return
    config, failure = failures[0]
    which, tried = ((f" of build({config})", "") if len(failures) == 1 else
                    ("", f" for each of the {len(failures)} configurations tried, e.g. build({config}),"))
    raise ValueError(f"one training step{which} on {len(sample[1])} training rows, run on the driver before any "
                     f"worker starts, fails{tried} as every trial would at its first batch: "
                     f"{type(failure).__name__}: {failure}{_label_hint(sample[1], failure)}"
                     f"{_list_hint(config, failure)}") from failure


def _label_hint(label: np.ndarray, error: Exception) -> str:
    """Whole-number float labels and a loss that wanted integers: class indices stored as
    floats, as Spark ML's StringIndexer gives them; a column of labels, shape (N, 1), where
    the loss wanted one class index a row."""
    if label.ndim == 2 and label.shape[1] == 1 and "target" in str(error):
        return ". The labels have shape (rows, 1); for one class index a row give a 1-D label: label.ravel()"
    if label.ndim == 2 and np.issubdtype(label.dtype, np.integer) and "target" in str(error):
        return (f". The labels have shape (rows, {label.shape[1]}) ({label.dtype}): for one class index a row give "
                f"y.argmax(1); for class probabilities, y.astype('float32')")
    wanted_integers = any(word in str(error) for word in ("Long", "Int", "int64", "integer"))
    if not (wanted_integers and np.issubdtype(label.dtype, np.floating) and np.all(np.mod(label, 1) == 0)):
        return ""
    return f". The labels are whole numbers stored as {label.dtype}: for class indices encode them as integers: " \
           f"{CLASS_INDEX_FIX}"


def _list_hint(config: dict[str, Any], error: Exception) -> str:
    """A list in the space is a constant, which every trial gets whole: where the error is
    about a list, the list is likely meant as a choice among its values."""
    lists = [key for key, value in config.items() if isinstance(value, list)]
    if not lists or "list" not in str(error):
        return ""
    return (f". Space key {lists[0]!r} is a list, which every trial gets whole; for a choice among its "
            f"values write cb.choice({config[lists[0]]!r})")


def _too_large(build: Callable[[dict], Any], config: dict[str, Any]) -> bool:
    """Whether ``config``'s model, sized by its meta build, is over PREFLIGHT_MAX_BYTES: then
    the step does not build it for real on the driver."""
    try:
        with preflight(), on_meta():
            return build(config).nbytes() > PREFLIGHT_MAX_BYTES
    except Exception:
        return False      # it cannot be built on meta: build_cheaply built such ones for real already


def _one_step(build: Callable[[dict], Any], config: dict[str, Any], sample: tuple[np.ndarray, np.ndarray],
              data: Dataset) -> None:
    features, label = sample
    cpu, rng = torch.device("cpu"), np.random.default_rng(0)
    trainable = build(config)
    evaluated = [trainable.batch(features, label, rng, train=False, device=cpu)]
    if label.ndim == 1:
        _check_classes(trainable.predict_batches(evaluated), data.label_range(), getattr(trainable, "loss", None))
    trainable.train_batches([trainable.batch(features, label, rng, train=True, device=cpu)], 0, 1)
    if data.has_validation:
        trainable.evaluate_batches(evaluated)
    _say_frozen(trainable, config, features)


def _say_frozen(trainable: Any, config: dict[str, Any], features: np.ndarray) -> None:
    """Say, once a run (for the configuration checked on the driver), where ``trainable``'s
    frozen layers are not computed once per partition, or are shared with no other trial."""
    frozen, say = trainable.frozen_part(), logging.getLogger("cerebro").warning
    if frozen is None:
        return
    if draws(trainable.transform, features):
        say("the training transform of build(%s) draws from its rng (augmentation), so its frozen layers' outputs "
            "differ every epoch: they run on every training batch; evaluation uses their outputs computed once per "
            "partition", config)
    unfaithful = getattr(frozen, "unfaithful", None)
    if unfaithful is not None:
        say("the frozen layers of build(%s) cannot be told apart from another trial's (%s): each trial keeps its "
            "own and runs them on every batch, as the plain model does", config, unfaithful)
    elif os.environ.get("CEREBRO_MATERIALIZE") != "0" and \
            frozen_draws(frozen, features[:DRAWS_ROWS], trainable.eval_transform, torch.device("cpu")):
        say("the frozen layers of build(%s) draw random numbers (two runs on the same rows differ: noise, or a "
            "Dropout kept in training mode), so their outputs cannot be computed once: they run on every batch, as "
            "the plain model does", config)


def _check_classes(outputs: np.ndarray, label_range: tuple[int, int] | None, loss: Any) -> None:
    """Class indices must each have an output: a model with C outputs per row takes 0..C-1, and
    none negative but the one the loss ignores (``cross_entropy``'s -100)."""
    if label_range is None or outputs.ndim != 2 or outputs.shape[1] < 2:
        return
    check_class_range(label_range, outputs.shape[1], ignored_class(loss))


def first_trials(policy: SearchPolicy, seed: int) -> list[dict[str, Any]]:
    """The configurations ``policy`` starts with under ``seed``, from a copy of it, so the
    run's own policy has spent nothing."""
    probe = copy.deepcopy(policy)
    probe.start(seed)
    return [request.config for request in probe.suggest()[:8]]


def check_metric(trainable: Any, metric: str | Sequence[str], has_validation: bool) -> list[str]:
    """The metrics ``trainable`` logs; raises unless it is a trainer that logs ``metric``
    (each of them, where a search has several objectives)."""
    if not isinstance(trainable, Trainable):
        raise not_a_trainable(trainable)
    prefixes = ("train", "val") if has_validation else ("train",)
    logged = [f"{p}_{name}" for p in prefixes for name in ("loss", *trainable.metric_names())]
    if has_validation:
        logged += [f"val_{name}" for name in trainable.validation_metric_names()]
    logged += list(trainable.model_metrics())       # of the model itself, unprefixed (cb.metrics.params)
    for name in [metric] if isinstance(metric, str) else metric:
        if name not in logged:
            hint = "" if has_validation else " (the data has no validation split)"
            how = "; metrics={'params': cb.metrics.params} logs the parameter count" if name == "params" else ""
            raise ValueError(f"metric={quoted(name)} is not logged{hint}; logged metrics are {logged}{how}")
    return logged


def _first_that_builds(build: Callable[[dict], Any], configs: Sequence[dict[str, Any]]) -> tuple[Any, dict]:
    """The first of ``configs`` that builds; a build that fails for every one is bad input."""
    failures = []
    for config in {repr(c): c for c in configs}.values():   # each distinct one once
        try:
            return build_cheaply(build, config), config
        except Exception as error:
            failures.append((config, error))
    config, failure = failures[0]
    tried = f"each of the {len(failures)} configurations tried on the driver, e.g." if len(failures) > 1 \
        else "the configuration tried on the driver,"
    # Its traceback is in the message (where a command line shows only the message), and so
    # not chained as well: it would be printed twice.
    raise ValueError(f"build(config) fails for {tried} {config}: {type(failure).__name__}: {failure}"
                     f"{_list_hint(config, failure)}\n"
                     + "".join(traceback.format_exception(failure))) from None


def build_cheaply(build: Callable[[dict], Any], config: dict[str, Any]) -> Any:
    """``build(config)`` on torch's meta device (no memory, no init) where its framework
    allows that, else as it is; a check on the driver, so :func:`cerebro.worker.in_preflight`."""
    with preflight():
        try:
            with on_meta():
                trainable = build(config)
            if getattr(trainable, "builds_on_meta_device", False):
                return trainable
        except Exception:
            pass
        return build(config)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Build on torch's meta device, quietly: a build that loads pretrained weights
    (``load_state_dict``) would warn once per tensor that copying into a meta tensor does
    nothing, which is all the driver's sizing build wants."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "for .*: copying from a non-meta parameter", UserWarning)
        yield
