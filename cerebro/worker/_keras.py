"""The Keras 3 trainer: a :class:`Trainable` over a compiled ``keras.Model``, on TensorFlow, JAX
or PyTorch.

Keras is imported only where a build uses it: the module imports it lazily, so torch users
and the workers of torch runs never load it. The backend is the driver's (``KERAS_BACKEND``
or ``~/.keras/keras.json``, as Keras itself chooses); the driver sends it to every worker,
which sets it before unpickling the build.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import os
import random
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._quiet import quiet_tensorflow
from ._exact import is_metric, merges, sub_epoch_state
from ._keras_callbacks import history_name, load_plateau_state, plateau_of, plateau_state, step_plateau
from ._keras_checks import KerasLoss, check_keras_label, check_keras_rows
from ._keras_frozen import KerasFrozenPart, StoredBatch, frozen_prefix, model_for
from ._protocol import Sums
from ._state_check import Spec, check_weights, dtype_name
from ._trainable import Trainable, Transform, callable_transforms, check_deadline, positive_batch_size

# Keras backends that train; Keras also knows "numpy" and "openvino", which only infer.
TRAINING_BACKENDS = ("tensorflow", "jax", "torch")


def driver_keras_backend() -> str | None:
    """The Keras backend this process uses, or None where nothing imported Keras."""
    keras = sys.modules.get("keras")
    return None if keras is None else keras.backend.backend()


def prepare_keras(backend: str, threads: int) -> None:
    """Make this worker's Keras use ``backend`` with ``threads`` threads per op, before
    anything imports it (the build's unpickling would)."""
    if backend not in TRAINING_BACKENDS:
        raise ValueError(f"Keras backend {backend!r} cannot train; use one of {', '.join(TRAINING_BACKENDS)}")
    loaded = driver_keras_backend()
    if loaded not in (None, backend):    # e.g. a Spark Python worker reused from another run
        raise RuntimeError(f"this worker process already runs Keras on {loaded!r} and cannot switch to the run's "
                           f"{backend!r}; start fresh workers (on Spark: spark.python.worker.reuse=false)")
    os.environ["KERAS_BACKEND"] = backend
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    if threads == 1:     # XLA's CPU client otherwise runs every op on all cores
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")     # TensorFlow's C++ INFO lines, once imported
    quiet_tensorflow()        # its start-up banners: the driver printed them once already, if at all
    importlib.import_module("keras")


@dataclass
class KerasTrainable(Trainable):
    """A Keras 3 model with how to train it; the user's ``build(config)`` returns one.

    Args:
        model: a built ``keras.Model`` (it starts with ``keras.Input``, or ``model.build``
            was called). Compiled, it brings its optimizer, loss and metrics; else give them.
        batch_size: rows per mini-batch.
        optimizer, loss, metrics: as for ``model.compile``; given, they compile the model
            (overriding an earlier compile's, keeping what is not given). Metrics are logged
            per epoch for training (``train_<name>``) and validation (``val_<name>``) under
            Keras's names for them, or under their keys where ``metrics`` is a dict
            ``{name: metric}``. A dict's values may also be torchmetrics ``Metric`` objects:
            exact over the whole validation set (``val_<name>``), as for
            :class:`cerebro.TorchTrainable`; ``train_on_batch`` does not return the outputs,
            so they are not logged for training, and each validation batch runs forward once
            more for them (:meth:`evaluate_batches`).
        transform, eval_transform: as for :class:`cerebro.TorchTrainable`; they return numpy
            arrays (or tensors of the backend).
        callbacks: ``[keras.callbacks.ReduceLROnPlateau(...)]``: Keras's own callback, run at
            each epoch's end on the epoch's metrics over all partitions (the driver holds the
            trial's next epoch until they are in), its state hopping with the model. Early
            stopping is the searcher's ``patience``; other callbacks are refused by name
            (:mod:`cerebro.worker._keras_callbacks`).

    The state that hops is the model's weights and the optimizer's variables. Every
    sub-epoch reseeds the model's seed generators (dropout and the like) and Keras's global
    one from the sub-epoch's seed, so training is bitwise the same on any worker count for
    each backend; a plain ``train_on_batch`` loop that reseeds the same way gives the same
    bits on one partition. Layers draw random numbers with ``keras.random`` and a seed
    generator: TensorFlow's own global seed is not reset between sub-epochs.

    Example:
        >>> def build(config):
        ...     model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
        ...     model.compile(keras.optimizers.Adam(config["lr"]),
        ...                   keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        ...     return cb.KerasTrainable(model, batch_size=32)
    """

    model: Any
    batch_size: int
    optimizer: Any = None
    loss: Any = None
    metrics: list | dict | None = None
    transform: Transform | None = None
    eval_transform: Transform | None = None
    callbacks: list | None = None

    def __post_init__(self) -> None:
        keras = sys.modules.get("keras")
        if keras is None or not isinstance(self.model, keras.Model):
            kind = "a torch.nn.Module: use cb.TorchTrainable" if isinstance(self.model, torch.nn.Module) \
                else type(self.model).__name__
            raise TypeError(f"model must be a keras.Model; got {kind}")
        backend = keras.backend.backend()
        if backend not in TRAINING_BACKENDS:
            raise ValueError(f"Keras backend {backend!r} cannot train; set KERAS_BACKEND to one of "
                             f"{', '.join(TRAINING_BACKENDS)}")
        positive_batch_size(self.batch_size)
        callable_transforms(self)
        keras_metrics, self._exact = _split_metrics(self.metrics)
        if self.optimizer is not None or self.loss is not None or keras_metrics is not None:
            self.model.compile(optimizer=self.optimizer or getattr(self.model, "optimizer", None) or "rmsprop",
                               loss=self.loss or getattr(self.model, "loss", None),
                               metrics=None if keras_metrics is None else list(keras_metrics.values()))
        if not getattr(self.model, "compiled", False) or getattr(self.model, "loss", None) is None:
            raise ValueError("the Keras model is not compiled with a loss: call model.compile(optimizer, loss, "
                             "metrics) in build(config), or give KerasTrainable(optimizer=..., loss=...)")
        if not self.model.built:
            raise ValueError("the Keras model is not built, so it has no weights to hop yet: start it with "
                             "keras.Input(shape), or call model.build(input_shape)")
        if not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        # Each Keras metric's logged name -> the name Keras logs it under.
        if keras_metrics is None:
            keras_metrics = {_metric_name(m): m for m in _flat_metrics(self.model)}
        self._logged = {name: _metric_name(m) for name, m in keras_metrics.items()}
        self._metric_names = tuple(self._logged)
        self._plateau = plateau_of(self.callbacks)
        self._stepped_epochs = 0      # epoch ends the plateau callback has seen

    # --- what the driver checks ---------------------------------------------------------
    def metric_names(self) -> tuple[str, ...]:
        return self._metric_names

    def validation_metric_names(self) -> tuple[str, ...]:
        return tuple(self._exact)

    def exact_metrics(self) -> dict[str, Any]:
        return self._exact

    def check_label(self, label: np.ndarray) -> None:
        check_keras_label(KerasLoss.of(self.model.loss), label)

    def check_rows(self, features: np.ndarray, label: np.ndarray, label_range: tuple[int, int] | None) -> None:
        inputs, _ = self.batch(features, label, np.random.default_rng(0), train=True, device=torch.device("cpu"))
        check_keras_rows(self.model, inputs, label, label_range, transformed=self.transform is not None)

    def epoch_metric(self) -> str | None:
        return None if self._plateau is None else history_name(self._plateau.monitor)

    def learning_rate(self) -> float | None:
        keras = sys.modules["keras"]
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(variable.shape) for name, variable in self._weights().items()}

    def weight_specs(self) -> dict[str, Spec]:
        return _specs(self._weights())

    def check_state(self, state: Any) -> None:
        super().check_state(state)
        check_weights(_specs(self._optimizer_variables()), state.get("optimizer"), "optimizer variable")

    def nbytes(self) -> int:
        variables = [*self.model.weights, *self.model.optimizer.variables]
        return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables)

    # --- the state that hops ------------------------------------------------------------
    def state(self) -> dict:
        state: dict[str, Any] = {"model": {name: _tensor(v) for name, v in self._weights().items()},
                                 "optimizer": {name: _tensor(v) for name, v in self._optimizer_variables().items()}}
        if self._plateau is not None:
            state["plateau"] = {**plateau_state(self._plateau), "epochs": float(self._stepped_epochs)}
        return state

    def load_state(self, state: Mapping, *, keep_hyperparameters: bool = False) -> None:
        self.load_weights(state["model"])
        optimizer = self._optimizer_variables()
        kept = {key for key, variable in optimizer.items() if keep_hyperparameters and variable.name == "learning_rate"}
        _assign(optimizer, {key: value for key, value in state["optimizer"].items() if key not in kept},
                "optimizer variable")
        if self._plateau is not None and "plateau" in state:
            load_plateau_state(self._plateau, state["plateau"])
            self._stepped_epochs = int(state["plateau"]["epochs"])

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        _assign(self._weights(), weights, "weight")

    def trained_model(self) -> Any:
        return self.model

    def trained_weights(self) -> dict[str, torch.Tensor]:
        return {name: _tensor(v) for name, v in self._weights().items()}    # frozen ones too, as always

    def frozen_part(self) -> KerasFrozenPart | None:
        if not hasattr(self, "_frozen"):     # leading trainable=False layers: see _keras_frozen
            self._frozen = frozen_prefix(self.model)
        return self._frozen

    def stored_batch(self, features: np.ndarray, label: np.ndarray, device: torch.device) -> StoredBatch:
        return StoredBatch((features, label))       # the frozen prefix's outputs: for the head

    def _weights(self) -> dict[str, Any]:
        # By position: layer names (dense_3, ...) differ between two builds in one process.
        return {f"{i:04d}:{v.name}": v for i, v in enumerate(self.model.weights)}

    def _optimizer_variables(self) -> dict[str, Any]:
        # By position alone: their names carry the layers' (sequential_dense_3_kernel_momentum).
        return {f"{i:04d}": v for i, v in enumerate(self.model.optimizer.variables)}

    # --- sub-epochs ---------------------------------------------------------------------
    def _to_batch(self, inputs: Any, label: np.ndarray, device: torch.device) -> tuple[Any, np.ndarray]:
        return inputs, label

    def train_batches(self, batches: Iterable[Any], seed: int, epoch: int, deadline: float | None = None,
                      metrics: Mapping[str, float] | None = None) -> Sums:
        if self._plateau is not None and self._stepped_epochs < epoch - 1:
            step_plateau(self._plateau, self.model, epoch, metrics or {})
            self._stepped_epochs = epoch - 1
        self._reseed(seed)
        sums = Sums.empty(self._metric_names)
        for batch in batches:
            inputs, targets = batch
            logs = model_for(batch, self).train_on_batch(inputs, targets, return_dict=True)
            sums += self._sums(logs, len(targets))
            if not math.isfinite(sums.loss):
                break
            check_deadline(deadline)
        return sums

    def evaluate_batches(self, batches: Iterable[Any], deadline: float | None = None) -> Sums:
        """Loss and metrics over ``batches``; the exact metrics from a second forward pass in
        inference mode (``predict_on_batch``), since ``test_on_batch`` keeps its outputs."""
        sums = Sums.empty(self._metric_names)
        for metric in self._exact.values():
            metric.reset()
        for batch in batches:
            (inputs, targets), model = batch, model_for(batch, self)
            sums += self._sums(model.test_on_batch(inputs, targets, return_dict=True), len(targets))
            if self._exact:
                outputs = torch.from_numpy(np.asarray(model.predict_on_batch(inputs)))
                for metric in self._exact.values():
                    metric.update(outputs, torch.from_numpy(np.asarray(targets)))
            check_deadline(deadline)
        if not self._exact:
            return sums
        return dataclasses.replace(sums, states={name: sub_epoch_state(name, m) for name, m in self._exact.items()})

    def predict_batches(self, batches: Iterable[Any]) -> np.ndarray:
        return np.concatenate([np.asarray(self.model.predict_on_batch(inputs)) for inputs, _ in batches])

    def _sums(self, logs: Mapping[str, Any], rows: int) -> Sums:
        missing = [keras for keras in self._logged.values() if keras not in logs]
        if missing:
            raise ValueError(f"Keras logged {sorted(logs)}, not the metrics {missing} this trainer expected from "
                             f"compile(metrics=...); give metrics as names, functions or keras.metrics objects")
        return Sums(rows, float(logs["loss"]) * rows,
                    {name: float(logs[keras]) * rows for name, keras in self._logged.items()})

    def _reseed(self, seed: int) -> None:
        """Every seed generator of the model, Keras's global one, Python's, numpy's and (on
        Keras's torch backend) torch's start from ``seed``, whatever ran before.

        This is ``keras.utils.set_random_seed`` but for TensorFlow's global seed: setting
        that clears TensorFlow's kernel caches, which cost ~40 ms at the next step and a
        slower state export and load, every sub-epoch. Keras draws its random numbers
        (dropout, augmentation layers, ``keras.random``) from seed generators, statelessly,
        so TensorFlow's seed changes none of them; a layer calling TensorFlow's stateful
        ``tf.random`` ops directly would not repeat (use ``keras.random`` with a
        ``keras.random.SeedGenerator``)."""
        from keras.src.backend.common import global_state
        from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
        from keras.src.utils.rng_utils import GLOBAL_RANDOM_SEED

        seed32 = seed % 2**32        # numpy's legacy seeds are 32-bit
        global_state.set_global_attribute(GLOBAL_RANDOM_SEED, seed32)
        global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, None)    # made again from the seed
        random.seed(seed32)
        np.random.seed(seed32)
        if sys.modules["keras"].backend.backend() == "torch":
            torch.manual_seed(seed32)
        generators = [g for layer in self.model._flatten_layers() for g in layer._seed_generators]
        for index, generator in enumerate(generators):
            state = np.random.default_rng([seed, index]).integers(0, 2**31, 2)
            generator.state.assign(state.astype(generator.state.dtype))


def _split_metrics(metrics: list | dict | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The Keras metrics given (None: keep the compiled ones) and the torchmetrics ``Metric``
    objects, each by the name it is logged under."""
    if metrics is None:
        return None, {}
    if isinstance(metrics, dict):
        for name in metrics:
            if not isinstance(name, str) or not name or name == "loss":
                raise ValueError(f"metric name {name!r} must be a non-empty string other than 'loss', "
                                 f"which is always logged")
        named = dict(metrics)
    elif isinstance(metrics, (list, tuple)):
        unnamed = [type(m).__name__ for m in metrics if is_metric(m)]
        if unnamed:
            raise ValueError(f"metrics=[... {unnamed[0]}(...) ...]: a torchmetrics Metric needs a name to be logged "
                             f"under; give metrics as a dict, e.g. {{'f1': {unnamed[0]}(...)}}")
        named = {_metric_name(m): m for m in metrics}
    else:
        raise TypeError(f"metrics must be a list or a dict {{name: metric}}; got {type(metrics).__name__}")
    exact = {name: m for name, m in named.items() if is_metric(m)}
    for name, metric in exact.items():
        merges(name, metric)          # refuses a state that cannot be merged over partitions
    keras_metrics = {name: m for name, m in named.items() if name not in exact}
    return (keras_metrics if keras_metrics or not exact else None), exact


def _flat_metrics(model: Any) -> list:
    """The metrics given to ``compile``, for a single-output model."""
    metrics = model._compile_config.config.get("metrics") if getattr(model, "_compile_config", None) else None
    if metrics is None:
        return []
    if isinstance(metrics, dict):
        raise ValueError("compile(metrics=...) is a dict (per output); KerasTrainable trains single-output models: "
                         "give a list")
    return list(metrics)


def _metric_name(metric: Any) -> str:
    if isinstance(metric, str):
        return metric       # Keras 3 logs a named metric under the name given ("acc" stays "acc")
    return getattr(metric, "name", None) or metric.__name__


def _specs(variables: Mapping[str, Any]) -> dict[str, Spec]:
    """Each variable's shape and dtype name, as its hopping tensor has them."""
    return {name: (tuple(v.shape), dtype_name(v.dtype)) for name, v in variables.items()}


def _tensor(variable: Any) -> torch.Tensor:
    """``variable``'s value for the hop, without a copy where the backend never writes
    through the view: TensorFlow copies a variable's buffer before updating it while a read
    of it lives, JAX arrays never change. Keras's torch backend updates in place: a copy."""
    value = variable.value
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    read = value.read_value() if hasattr(value, "read_value") else value     # TensorFlow: no copy
    with warnings.catch_warnings():    # read-only, and read only: packed, sent, dropped
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(np.asarray(read))


def _assign(variables: dict[str, Any], values: Mapping[str, torch.Tensor], what: str) -> None:
    for name, value in values.items():
        variable = variables.get(name)
        if variable is None or tuple(variable.shape) != tuple(value.shape):
            made = "none" if variable is None else tuple(variable.shape)
            raise ValueError(f"the state's {what} {name} has shape {tuple(value.shape)}; this model's is {made}")
        variable.assign(value.numpy())
