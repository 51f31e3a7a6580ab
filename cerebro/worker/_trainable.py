"""The trainer waist: what every framework implements so that its models can hop.

The engine never touches a framework: a worker builds a :class:`Trainable` from the user's
``build(config)``, feeds it a partition's batches for one sub-epoch with the sub-epoch's seed,
and sends back its :meth:`Trainable.state` (a tree of CPU torch tensors, data only). Another
framework needs one new module that subclasses :class:`Trainable` (see ``_torch.py``,
``_keras.py`` and the numpy trainer in docs/extending.md) and nothing else: ``build`` returns
it, and the engine, the store and the workers take any :class:`Trainable`.
"""
from __future__ import annotations

import abc
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from .._checks import Integer
from ._protocol import Sums
from ._state_check import Spec, check_weights, model_part

Transform = Callable[[np.ndarray, np.random.Generator], Any]
Batch = TypeVar("Batch")
_preflight = threading.local()


def in_preflight() -> bool:
    """Whether this thread runs the driver's checks before any worker starts (a trial's
    build, and one training step of it on a few real rows), not a trial's training: a build,
    model or loss with side effects (writing files, a test's fault injection) may skip them
    there.

    >>> from cerebro.worker import in_preflight
    >>> in_preflight()
    False
    """
    return getattr(_preflight, "on", False)


@contextlib.contextmanager
def preflight() -> Iterator[None]:
    """While the block runs, :func:`in_preflight` is True in this thread (blocks may nest)."""
    before, _preflight.on = in_preflight(), True
    try:
        yield
    finally:
        _preflight.on = before


class Trainable(abc.ABC):
    """A trial's model with how to train it, as a worker holds it.

    Writing a trainer (docs/extending.md has a worked one): a subclass, a dataclass by
    convention, has the attributes ``batch_size``, ``transform`` and ``eval_transform`` (see
    :class:`cerebro.TorchTrainable` for what those mean) and implements the abstract methods:

    - :meth:`metric_names`, :meth:`weight_shapes`, :meth:`nbytes`: what the driver checks and
      sizes before any worker starts;
    - :meth:`_to_batch` (a batch as the framework takes it), :meth:`train_batches`,
      :meth:`evaluate_batches` (each returns the sub-epoch's row-weighted :class:`Sums`) and
      :meth:`predict_batches`: the sub-epochs, deterministic given the seed and the batches;
    - :meth:`state` and :meth:`load_state`: the state that hops, CPU torch tensors and plain
      data with the weights under ``"model"``; a trainable that loads another's state and
      trains on must give the bits the other would have given (a hop changes nothing);
    - :meth:`load_weights` and :meth:`trained_model`: the finished trial, for the user.

    The other methods have defaults (no check, no exact metrics, no schedule, no frozen
    layers); the class attributes below say what the framework allows, all False by default.
    """

    batch_size: int
    transform: Transform | None
    eval_transform: Transform | None

    # The driver checks build(config) on torch's meta device (no memory, no init) where the
    # framework allows it.
    builds_on_meta_device: ClassVar[bool] = False
    # The driver runs one training step on a few real rows before any worker starts, on the
    # CPU, where the framework does that quickly (Keras would compile a graph for it).
    checks_a_step_on_the_driver: ClassVar[bool] = False
    # cb.predict may fork single-threaded CPU workers from a process that built the model
    # (no start-up) where the framework survives a fork; TensorFlow's runtime does not.
    predicts_after_fork: ClassVar[bool] = False

    # --- what the driver checks before any worker starts ---------------------------------
    @abc.abstractmethod
    def metric_names(self) -> tuple[str, ...]:
        """The metrics logged besides the loss, as ``train_<name>`` and ``val_<name>``."""

    def validation_metric_names(self) -> tuple[str, ...]:
        """Metrics logged for validation only, as ``val_<name>``."""
        return ()

    def exact_metrics(self) -> dict[str, Any]:
        """The torchmetrics ``Metric`` objects by name: the driver computes their values from
        the merged states the workers send (:mod:`cerebro.worker._exact`)."""
        return {}

    def model_metrics(self) -> dict[str, float]:
        """Metrics of the model itself, by name, as it is now (``cb.metrics.params``: its
        parameter count): logged each epoch under their own names, unprefixed. Asked after
        each sub-epoch on the worker, and of the meta-device build on the driver for their
        names; the default has none."""
        return {}

    def check_label(self, label: np.ndarray) -> None:
        """Raise, naming the problem, if labels like ``label`` (a sample) cannot fit the loss."""

    def check_rows(self, features: np.ndarray, label: np.ndarray, label_range: tuple[int, int] | None) -> None:
        """Raise ``ValueError``, naming the problem and its fix, if the model cannot train on rows
        like these (a few training rows, as a worker loads them; ``label_range``: the smallest
        and largest class index over every row, or None): what a trainer that runs no step on
        the driver (``checks_a_step_on_the_driver``) can tell before any worker starts."""

    @abc.abstractmethod
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each weight's shape, by the name :meth:`state` gives it under ``"model"``."""

    # --- placing and sizing --------------------------------------------------------------
    def place(self, device: torch.device) -> None:
        """Move the model to ``device`` (where the framework does not place it itself)."""

    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes the trial holds on this worker: weights and optimizer state, roughly."""

    # --- sub-epochs ---------------------------------------------------------------------
    def batch(self, features: np.ndarray, label: np.ndarray, rng: np.random.Generator, *, train: bool,
              device: torch.device) -> Any:
        """A batch as stored, made into what :meth:`train_batches` takes: through ``transform``
        (``train``) or ``eval_transform``, else the features as float32."""
        name = "transform" if train else "eval_transform"
        transform = getattr(self, name)
        if transform is None:
            if features.dtype == object:
                raise TypeError(f"the features are bytes (encoded data): give {type(self).__name__} a "
                                f"{name} that decodes them")
            return self._to_batch(features.astype(np.float32, copy=False), label, device)
        inputs = transform(features, rng)
        if not hasattr(inputs, "shape") or getattr(inputs, "dtype", None) == np.dtype(object):
            raise TypeError(f"{name} must return a numeric array or tensor; it returned {describe(inputs)}")
        if len(inputs.shape) == 0 or len(inputs) != len(features):
            raise ValueError(f"{name} returned {describe(inputs)} for a batch of {len(features)} rows; it must "
                             f"return one row per row")
        return self._to_batch(inputs, label, device)

    def stored_batch(self, features: np.ndarray, label: np.ndarray, device: torch.device) -> Any:
        """A batch of the frozen layers' outputs (see :mod:`._frozen`), as :meth:`train_batches`
        takes it: no transform and no frozen layers again."""
        return self._to_batch(features, label, device)

    def frozen_part(self) -> Any:
        """The frozen layers (a :class:`._frozen.FrozenPart`) whose outputs a worker computes
        once per partition, or None."""
        return None

    def trained_weights(self) -> dict[str, torch.Tensor]:
        """The weights of :meth:`trained_model`, frozen layers too, by its own names: asked only
        of a trainer with a :meth:`frozen_part` (the others' are ``state()["model"]``)."""
        raise NotImplementedError(f"{type(self).__name__} has frozen layers but says not what its trained model's "
                                  f"weights are: it needs a trained_weights()")

    @abc.abstractmethod
    def _to_batch(self, inputs: Any, label: np.ndarray, device: torch.device) -> Any:
        """``(inputs, targets)`` as the framework takes them; ``inputs`` is an array or a tensor."""

    @abc.abstractmethod
    def train_batches(self, batches: Iterable[Any], seed: int, epoch: int, deadline: float | None = None,
                      metrics: Mapping[str, float] | None = None) -> Sums:
        """Train on ``batches`` (a partition's, in its sample order) in epoch ``epoch`` (from 1),
        the model's own randomness (dropout) seeded by ``seed`` alone. Stops early once the
        loss is not finite; raises :class:`SubEpochTimeout` after a batch that ends past
        ``deadline`` (``time.monotonic``). ``metrics``: the epoch before's, where
        :meth:`epoch_metric` asked for them, for a schedule that steps on one."""

    def epoch_metric(self) -> str | None:
        """The metric an epoch-level schedule steps on (``ReduceLROnPlateau``'s), or None: with
        one, the driver waits for each epoch's metrics before the trial's next epoch."""
        return None

    def learning_rate(self) -> float | None:
        """The optimizer's learning rate now (its first parameter group's), for ``history()``."""
        return None

    def steps_per_epoch(self, steps: int) -> None:
        """Told once built: the training batches in one epoch over all partitions (for a
        schedule whose length depends on the data)."""

    @abc.abstractmethod
    def evaluate_batches(self, batches: Iterable[Any], deadline: float | None = None) -> Sums:
        """Loss and metrics over ``batches``."""

    @staticmethod
    def before_deadline(batches: Iterable[Batch], deadline: float | None) -> Iterator[Batch]:
        """``batches`` one by one, raising :class:`SubEpochTimeout` once a batch ends past
        ``deadline``: a trainer loops ``for batch in self.before_deadline(batches, deadline)``
        to end a sub-epoch that runs past its trial's ``trial_timeout``."""
        for batch in batches:
            yield batch
            check_deadline(deadline)

    @abc.abstractmethod
    def predict_batches(self, batches: Iterable[Any]) -> np.ndarray:
        """The model's outputs for ``batches`` (made by :meth:`batch`, ``train=False``), in
        inference mode, as one numpy array on the CPU, rows in order."""

    # --- the state that hops ------------------------------------------------------------
    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """Everything the next sub-epoch continues from, as a tree of CPU torch tensors and
        plain data: the weights under ``"model"``, the optimizer's state, schedules, ..."""

    def weight_specs(self) -> dict[str, Spec]:
        """Each weight's shape and dtype name, by the name :meth:`state` gives it under
        ``"model"`` (a dtype left empty is not checked)."""
        return {name: (shape, "") for name, shape in self.weight_shapes().items()}

    def check_weights(self, weights: Any) -> None:
        """Raise :class:`StateMismatchError` unless ``weights`` are this model's: every weight,
        none other, each a tensor of its shape and dtype."""
        check_weights(self.weight_specs(), weights)

    def check_state(self, state: Any) -> None:
        """Raise :class:`StateMismatchError` unless ``state`` (unpacked) is one this trainable
        can continue from: checked before a state from elsewhere (a peer) is loaded."""
        self.check_weights(model_part(state))

    @abc.abstractmethod
    def load_state(self, state: Mapping[str, Any], *, keep_hyperparameters: bool = False) -> None:
        """Continue from ``state``; with ``keep_hyperparameters`` the optimizer keeps the
        learning rate (and the like) it was built with: PBT's explore step."""

    # --- the trained model, for the user -------------------------------------------------
    @abc.abstractmethod
    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load ``state()["model"]`` of a finished trial."""

    @abc.abstractmethod
    def trained_model(self) -> Any:
        """The framework's model, ready for inference."""


class SubEpochTimeout(Exception):
    """A sub-epoch ran past its trial_timeout."""


def check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise SubEpochTimeout("the sub-epoch ran past its trial_timeout")


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)`` on the devices there are. torch's own also queues a seed for
    each accelerator it was built for and has not started, formatting the Python stack for
    each: ~1 ms a sub-epoch, a tenth of a short trial's bookkeeping. A device that is not
    there draws no numbers, so skipping it changes none."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if torch.backends.mps.is_available():
        torch.mps.manual_seed(seed)
    if torch.xpu.is_available():
        torch.xpu.manual_seed_all(seed)


def seed_build(seed: int) -> None:
    """Seed every framework that is loaded before ``build(config)`` makes a trial's model, so
    its initial weights depend on ``seed`` alone."""
    seed_torch(seed)
    if "keras" in sys.modules:
        sys.modules["keras"].utils.set_random_seed(seed % 2**32)     # numpy's legacy seeds are 32-bit


def not_a_trainable(value: object) -> TypeError:
    """The error for a ``build(config)`` whose return is no :class:`Trainable`."""
    return TypeError(f"build(config) must return a cerebro.Trainable (a cerebro.TorchTrainable, a "
                     f"cerebro.KerasTrainable, or a subclass of your own: docs/extending.md); "
                     f"got {type(value).__name__}")


def describe(value: object) -> str:
    """A value's shape and dtype, for error messages."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{tuple(value.shape)} {value.dtype}"
    return type(value).__name__


_BATCH_SIZE = Integer(low=1, description="a positive integer")


def positive_batch_size(batch_size: object) -> None:
    """Refuse a ``batch_size`` that is not a whole number of rows >= 1 (0, negatives, bools,
    floats): a batch of 0 rows never ends an epoch, and a float cuts no rows."""
    _BATCH_SIZE.check("batch_size", batch_size)


def callable_transforms(trainable: Trainable) -> None:
    for name in ("transform", "eval_transform"):
        if getattr(trainable, name) is not None and not callable(getattr(trainable, name)):
            raise TypeError(f"{name}={getattr(trainable, name)!r} must be callable as {name}(features, rng), or None")
