"""Keras models from the rows of SQL tables: an architecture (Keras JSON), a
``compile_params`` and a ``fit_params`` string make a :class:`cerebro.KerasTrainable`.

Weights travel in and out of tables as MADlib stores them: the float32 values of
``model.get_weights()``, concatenated in order, in one ``bytea``.
"""
from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..worker import KerasTrainable
from ._grid import ConfigGrid
from ._limits import cut, quoted
from ._params import parse_compile_params, parse_fit_params


@dataclass(frozen=True)
class ModelSpec:
    """One model selection row with its architecture, and the weights it starts from
    (``warm_start``), if any."""

    model_id: int
    model_arch: str
    compile_params: str
    fit_params: str
    # Left out of repr, which names a call's run directory: the call's digest hashes them.
    weights: bytes | None = field(default=None, repr=False)


# Layers that run code of their own (a Python function, a SavedModel, a torch or JAX module):
# Keras's safe mode lets a Lambda call any exported Keras function at load time.
_CODE_LAYERS = frozenset({"Lambda", "TFSMLayer", "TorchModuleWrapper", "JaxLayer", "FlaxLayer"})
_FUNCTION_MODULES = frozenset({"builtins", "keras.activations", "keras.src.activations.activations"})


_SUB_MODULES = {"initializer": "keras.initializers", "regularizer": "keras.regularizers",
                "constraint": "keras.constraints"}


def keras3_json(model_arch: str) -> str:
    """``model_arch`` as Keras 3 reads it: Keras 2's ``Sequential.to_json()`` (no ``module``
    keys, ``batch_input_shape`` on the first layer, or a bare list of layers, as MADlib's
    users have them) is converted; Keras 3's is returned as it is. A Keras 2 functional model
    is refused with what to do."""
    arch = json.loads(model_arch)
    if not isinstance(arch, dict) or "module" in arch:
        return model_arch
    if arch.get("class_name") != "Sequential":
        raise ValueError(f"model_arch is a Keras 2 {quoted(arch.get('class_name'))} model; Keras 2 Sequential models "
                         f"are converted, others must be saved again with Keras 3's model.to_json()")
    config = arch.get("config")
    layers = config if isinstance(config, list) else (config or {}).get("layers", [])
    converted = [_keras3_node(layer, "keras.layers") for layer in layers]
    first = converted[0]["config"] if converted else {}
    if "batch_input_shape" in first:
        shape = first.pop("batch_input_shape")
        converted.insert(0, {"module": "keras.layers", "class_name": "InputLayer",
                             "config": {"batch_shape": shape, "dtype": first.get("dtype", "float32")}})
    name = config.get("name", "sequential") if isinstance(config, dict) else "sequential"
    return json.dumps({"module": "keras", "class_name": "Sequential", "registered_name": None,
                       "config": {"name": name, "layers": converted}})


def _keras3_node(node: dict, module: str) -> dict:
    """A Keras 2 object's config with the ``module`` keys Keras 3 looks objects up by."""
    config = {key: _keras3_node(value, _SUB_MODULES[key.rsplit("_", 1)[-1]])
              if isinstance(value, dict) and "class_name" in value and key.rsplit("_", 1)[-1] in _SUB_MODULES
              else value for key, value in (node.get("config") or {}).items()}
    return {"module": module, "class_name": node.get("class_name"), "config": config, "registered_name": None}


def check_model_arch(model_arch: str) -> None:
    """Refuse, naming where, an architecture that could do more than build layers when a
    server process loads it: a layer of :data:`_CODE_LAYERS`, a function that is not an
    activation, a constant fed to a layer (which Keras calls with it at load time), or an
    object from outside Keras. What ``model.to_json()`` of built-in layers writes passes."""
    _check_node(json.loads(model_arch), "model_arch")


def _check_node(node: Any, where: str) -> None:
    # Only containers can hold a layer, so only they are walked: a list of millions of
    # numbers is passed over, not walked one call (and one path string) each.
    if isinstance(node, list):
        for index, item in enumerate(node):
            if isinstance(item, (list, dict)):
                _check_node(item, f"{where}[{index}]")
        return
    if not isinstance(node, dict):
        return
    kind, module = node.get("class_name"), node.get("module")
    if kind in _CODE_LAYERS or kind == "__lambda__":
        raise ValueError(f"{cut(where)}: a {cut(str(kind))} layer runs code of its own in the server; use Keras's "
                         f"built-in layers")
    if kind == "function" and module not in _FUNCTION_MODULES:
        function = f"{module}.{node.get('config')}"
        raise ValueError(f"{cut(where)}: the function {cut(function)} is not an activation; a model may refer to "
                         f"Keras's activations only")
    if kind == "__numpy__":
        raise ValueError(f"{cut(where)}: a constant given to a layer as its input; a layer's inputs must be other "
                         f"layers' outputs")
    if module is not None and not (module == "keras" or str(module).startswith("keras.") or module == "builtins"):
        raise ValueError(f"{cut(where)}: {cut(f'{module}.{kind}')} is not part of Keras; custom objects are not "
                         f"supported")
    for key, value in node.items():
        if isinstance(value, (list, dict)):
            _check_node(value, f"{where}.{key}")


def keras_architecture(model_arch: str) -> Any:
    """The ``keras.Model`` of ``model_arch`` (Keras 3's JSON or Keras 2's), not compiled:
    what inference needs."""
    model_arch = keras3_json(model_arch)
    check_model_arch(model_arch)     # also here: an architecture may reach a table without load_model_arch
    return importlib.import_module("keras").models.model_from_json(model_arch)


def keras_model(model_arch: str, compile_params: str, *, one_hot: bool) -> Any:
    """The compiled ``keras.Model``. With class ids as labels (``one_hot=False``),
    ``categorical_crossentropy`` is trained as ``sparse_categorical_crossentropy``: the same
    loss on the same targets, as MADlib's preprocessor would have one-hot encoded them."""
    keras = importlib.import_module("keras")
    params = parse_compile_params(compile_params)
    model = keras_architecture(model_arch)
    optimizer_class = optimizer_classes(keras).get(params.optimizer.lower())
    if optimizer_class is None:
        raise ValueError(f"compile_params {quoted(compile_params)}: optimizer {quoted(params.optimizer)} is not a "
                         f"class of "
                         f"keras.optimizers (Adam, SGD, RMSprop, AdamW, ...)")
    try:
        optimizer = optimizer_class(**_legacy_decay(keras, optimizer_class, dict(params.optimizer_args)))
    except (TypeError, ValueError) as error:
        raise ValueError(f"compile_params {quoted(compile_params)}: "
                         f"{cut(params.optimizer + str(dict(params.optimizer_args)))} cannot be made: {cut(str(error))}"
                         ) from None
    loss = "sparse_categorical_crossentropy" if params.loss == "categorical_crossentropy" and not one_hot \
        else params.loss
    try:
        keras.losses.get(loss)
    except ValueError:
        raise ValueError(f"compile_params {quoted(compile_params)}: loss {quoted(params.loss)} is not a loss of "
                         f"keras.losses") from None
    model.compile(optimizer=optimizer, loss=loss, metrics=list(params.metrics))
    return model


def _legacy_decay(keras: Any, optimizer_class: type, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with Keras 2's ``decay=d`` (MADlib's pages pass it; Keras 3 dropped it) as the
    schedule it was: the learning rate at step t is ``lr / (1 + d * t)``."""
    if "decay" not in args:
        return args
    decay = args.pop("decay")
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or decay < 0:
        raise ValueError(f"decay={quoted(decay)} must be a number >= 0 (Keras 2's time-based learning rate decay)")
    if decay:
        start = args.get("learning_rate", inspect.signature(optimizer_class).parameters["learning_rate"].default)
        args["learning_rate"] = keras.optimizers.schedules.InverseTimeDecay(start, decay_steps=1, decay_rate=decay)
    return args


def optimizer_classes(keras: Any) -> dict[str, type]:
    """Keras's optimizer classes by their lower-case names: Keras itself takes ``'adam'`` or
    ``'rmsprop'`` for ``Adam`` and ``RMSprop``, and MADlib's examples use both spellings."""
    return {name.lower(): value for name, value in vars(keras.optimizers).items()
            if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer)}


def keras_trainable(spec: ModelSpec, *, one_hot: bool) -> KerasTrainable:
    """The trainable of ``spec``; its weights are ``spec.weights`` where given."""
    model = keras_model(spec.model_arch, spec.compile_params, one_hot=one_hot)
    if spec.weights is not None:
        load_flat_weights(model, spec.weights)
    # The rows were checked as they were read, each by the rule of the call that read it.
    return KerasTrainable(model, batch_size=parse_fit_params(spec.fit_params).batch_size)


@dataclass(frozen=True)
class SelectionBuild:
    """``build(config)`` for the trials of a model selection table: ``config["mst_key"]``
    names the row."""

    models: Mapping[int, ModelSpec]
    one_hot: bool

    def spec(self, config: Mapping[str, Any]) -> ModelSpec:
        """The row ``config`` names."""
        return self.models[config["mst_key"]]

    def __call__(self, config: Mapping[str, Any]) -> KerasTrainable:
        return keras_trainable(self.spec(config), one_hot=self.one_hot)

    def epochs(self, config: Mapping[str, Any]) -> int:
        """The epochs one iteration of the row trains (its ``fit_params``'s ``epochs``)."""
        return parse_fit_params(self.spec(config).fit_params).epochs


@dataclass(frozen=True)
class GridBuild:
    """``build(config)`` for AutoML: ``config`` is drawn from :class:`ConfigGrid`'s space;
    ``architectures`` holds each model id's JSON and starting weights."""

    architectures: Mapping[int, tuple[str, bytes | None]]
    grid: ConfigGrid
    one_hot: bool

    def spec(self, config: Mapping[str, Any]) -> ModelSpec:
        model_id, compile_params, fit_params = self.grid.render(config)
        return ModelSpec(model_id, self.architectures[model_id][0], compile_params, fit_params,
                         self.architectures[model_id][1])

    def __call__(self, config: Mapping[str, Any]) -> KerasTrainable:
        return keras_trainable(self.spec(config), one_hot=self.one_hot)


def flat_weights(state_dict: Mapping[str, Any]) -> bytes:
    """A Keras trial's weights (keys in ``model.weights`` order) as MADlib's ``bytea``."""
    return b"".join(np.asarray(state_dict[key], dtype=np.float32).tobytes() for key in sorted(state_dict))


def load_flat_weights(model: Any, blob: bytes) -> None:
    """Set ``model``'s weights from MADlib's ``bytea``, refusing one of another size."""
    values = np.frombuffer(blob, dtype=np.float32)
    sizes = [int(np.prod(w.shape)) for w in model.weights]
    if len(values) != sum(sizes):
        raise ValueError(f"model_weights holds {len(values)} float32 values; the architecture has {sum(sizes)} "
                         f"weights")
    offsets = np.cumsum([0, *sizes])
    model.set_weights([values[offsets[i]:offsets[i + 1]].reshape(w.shape) for i, w in enumerate(model.weights)])
