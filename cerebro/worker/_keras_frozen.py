"""A Keras model's leading frozen layers, computed once per partition (DESIGN invariant 11).

MADlib's transfer learning, and Keras's own guide, freeze a pretrained base with
``layer.trainable = False`` and train a head after it. :class:`KerasTrainable` finds such a
prefix in the compiled model by itself (no argument): a worker then computes the prefix's
outputs once per partition (:class:`cerebro.worker._frozen.Materialized`) and trains and
evaluates the rest of the model, the *head*, on them.

*Which layers*: the model's leading layers, each with ``trainable=False`` (no trainable
weights) and giving the same outputs in training as in inference: no seed generators
(``Dropout``, noise, augmentation), no activity regularizer (its loss would be left out), no
mask, and no sublayer of another library than Keras that takes ``training`` (Keras's own
differ in training only by drawing, or, ``BatchNormalization``, where trainable: frozen, it
normalizes with its moving statistics in training too). A pretrained base model as one layer
counts as one frozen layer.

*Which models*: a ``Sequential`` model, or a functional one that is a chain (one input, one
output, each layer called on the one before's output alone). Any other model (branches,
several inputs, a subclassed model) has no frozen part: it trains as it is, unchanged.

*The head* is ``keras.Model(prefix output, model output)``: the same layer objects, so the
same weights, compiled as the model is with the model's optimizer object, so its variables
(and the state that hops, which keeps every weight of the whole model) are unchanged.
"""
from __future__ import annotations

import enum
import hashlib
import itertools
import json
import sys
import types
import weakref
from typing import Any

import numpy as np
import torch

from ._fingerprint import Unfaithful, fingerprint
from ._frozen import chained_digests


class StoredBatch(tuple):
    """``(inputs, targets)`` where the inputs are the frozen prefix's outputs: the head takes it."""


class KerasFrozenPart:
    """The frozen prefix of a Keras model, as :class:`~cerebro.worker._frozen.Materialized`
    uses one: :meth:`digests`, ``layers`` and :meth:`run_from`."""

    module = None        # Materialized.share shares torch modules only: Keras layers stay the trial's

    def __init__(self, layers: list[Any], head: Any) -> None:
        self.layers = layers
        self.head = head                  # the compiled rest of the model, on the prefix's outputs
        self._digests: list[str] | None = None
        self._unfaithful: str | None = None

    def digests(self) -> list[str]:
        """One digest per prefix (``layers[:k + 1]``), each chained on the one before: equal
        where the prefixes' classes, configurations (layer names aside), attributes and weights
        are. A layer holding what cannot be digested faithfully is digested as itself alone,
        and :attr:`unfaithful` says why."""
        if self._digests is None:
            digested = []
            for layer in self.layers:
                try:
                    digested.append(_layer_digest(layer))
                except Unfaithful as why:
                    self._unfaithful = self._unfaithful or str(why)
                    digested.append(_itself(layer))
            self._digests = chained_digests(b"cerebro-frozen-keras/3", digested)
        return self._digests

    @property
    def unfaithful(self) -> str | None:
        """Why these frozen layers are shared with no other trial and not materialized (what in
        them cannot be digested faithfully), or None."""
        self.digests()
        return self._unfaithful

    def nbytes(self) -> int:
        return sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for layer in self.layers for w in layer.weights)

    def run_from(self, depth: int, inputs: Any, device: torch.device) -> np.ndarray:
        """``layers[depth:]`` applied to ``inputs`` in inference mode, as a numpy array. Keras
        places the computation itself (``device`` is the worker's torch device)."""
        keras = sys.modules["keras"]
        if isinstance(inputs, torch.Tensor):
            inputs = inputs.cpu().numpy()
        x = keras.ops.convert_to_tensor(np.ascontiguousarray(inputs) if isinstance(inputs, np.ndarray) else inputs)
        for layer in self.layers[depth:]:
            x = layer(x, training=False)
        return keras.ops.convert_to_numpy(x)


def frozen_prefix(model: Any) -> KerasFrozenPart | None:
    """``model``'s leading frozen layers with its head, or None: no such layers, a model that
    is not a chain, or a head that cannot be compiled with the model's own optimizer."""
    chain = _chain(model)
    if not chain:
        return None
    depth = 0
    while depth < len(chain) - 1 and _is_frozen(*chain[depth]):     # the last layer is the head's at least
        depth += 1
    if depth == 0:
        return None
    head = _head(model, chain[depth][1].arguments.keras_tensors[0])
    return None if head is None else KerasFrozenPart([layer for layer, _ in chain[:depth]], head)


def _chain(model: Any) -> list[tuple[Any, Any]] | None:
    """``model``'s layers with their nodes in it, input to output, where each takes the one
    before's output alone; None where the model is not such a chain."""
    try:
        inputs, outputs = list(model.inputs), list(model.outputs)
    except (AttributeError, TypeError, ValueError):     # a subclassed model, a Sequential without an input
        return None
    if len(inputs) != 1 or len(outputs) != 1:
        return None
    chain, tensor = [], outputs[0]
    while tensor is not inputs[0]:
        operation, node_index, _ = tensor._keras_history
        node = operation._inbound_nodes[node_index]
        if node.is_input or len(node.arguments.keras_tensors) != 1 or len(node.outputs) != 1:
            return None
        chain.append((operation, node))
        tensor = node.arguments.keras_tensors[0]
    return chain[::-1]


def _is_frozen(layer: Any, node: Any) -> bool:
    """Whether ``layer`` (called at ``node``) is frozen and gives the same outputs in training
    as in inference, so that its outputs can be computed once (see the module's docstring)."""
    if layer.trainable or layer.trainable_weights or set(node.arguments.kwargs) - {"training"}:
        return False
    if getattr(node.outputs[0], "_keras_mask", None) is not None:     # the head would lose the mask
        return False
    for sub in layer._flatten_layers(include_self=True):
        if sub._seed_generators or sub.activity_regularizer is not None:
            return False
        # Keras's own layers differ in training by drawing (seed generators) or, for
        # BatchNormalization, only where trainable; another's that takes `training` may differ.
        if getattr(sub, "_call_has_training_arg", False) and not type(sub).__module__.startswith("keras."):
            return False
    return True


def _head(model: Any, tensor: Any) -> Any:
    """The model from ``tensor`` (the frozen prefix's output) on, compiled as ``model`` is,
    with ``model``'s optimizer object; None where Keras would not keep that optimizer."""
    keras = sys.modules["keras"]
    compiled = getattr(model, "_compile_config", None)
    if compiled is None or getattr(model, "optimizer", None) is None:
        return None
    head = keras.Model(tensor, model.outputs[0], name=f"{model.name}_head")
    head.compile(**{**compiled.config, "optimizer": model.optimizer})
    # A mixed-precision compile could wrap the optimizer in a new LossScaleOptimizer: other
    # variables, another state. Then the model trains as it is.
    return head if head.optimizer is model.optimizer else None


def _layer_digest(layer: Any) -> bytes:
    """The layer's class and code, configuration (names aside), attributes and weights; raises
    :class:`Unfaithful` where an attribute (or its class) cannot be digested faithfully."""
    described = hashlib.sha256()
    described.update(fingerprint(type(layer), where=f"frozen layer {layer.name}'s class"))
    places = _places(layer)
    for sub in layer._flatten_layers(include_self=True):
        described.update(b"layer\0")
        for name, value in _attributes(sub, places).items():
            described.update(name.encode() + b"\0" + fingerprint(value, where=f"frozen layer {sub.name}.{name}"))
    try:
        config = json.dumps(_unnamed(layer.get_config(), _names(layer)), sort_keys=True, default=repr)
    except NotImplementedError:
        # A custom layer without get_config: nothing tells two of them apart but the object,
        # so its outputs are shared by no other trial (still computed once per partition).
        return _itself(layer)
    described.update(config.encode() + b"\n")
    for weight in layer.weights:
        value = np.ascontiguousarray(weight.numpy())
        described.update(f"{value.dtype} {value.shape}\n".encode())
        described.update(value.tobytes())
    return described.digest()


# Each layer digested as itself alone gets a number of its own: an id() could be a freed
# layer's, whose outputs a worker may still keep.
_OBJECTS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_COUNTER = itertools.count()


def _itself(layer: Any) -> bytes:
    """A digest no other layer object in this process has (the same one for ``layer`` again)."""
    if layer not in _OBJECTS:
        _OBJECTS[layer] = next(_COUNTER)
    return f"object {_OBJECTS[layer]}".encode()


def _attributes(layer: Any, places: dict[int, str]) -> dict[str, Any]:
    """What ``layer`` computes with beyond its configuration and weights. A layer of a user's
    class: each of its attributes but Keras's bookkeeping (those every Keras layer has, its
    name, tracking), its weights and sublayers by their place (their values are digested
    with the layer's weights, the sublayers themselves), initializers left out (they act
    only when it is built). A layer of Keras's own class, whose configuration says what it
    computes: its public plain attributes, which may have been set after it was made (an
    ``activation``)."""
    own = not type(layer).__module__.startswith("keras.")
    found = {}
    for name, value in sorted(vars(layer).items()):
        if name in _bookkeeping() or name.startswith("_self_"):
            continue
        if own:
            found[name] = _placed(value, places)
        elif not name.startswith("_") and _is_plain(value):
            found[name] = _placed(value, places)
    return found


def _is_plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_plain(item) for item in value)
    return value is None or isinstance(value, (bool, int, float, str, enum.Enum, types.FunctionType))


def _placed(value: Any, places: dict[int, str]) -> Any:
    """``value`` with Keras's tracked containers as plain ones, and each weight and sublayer
    by its place in the frozen layer."""
    keras = sys.modules["keras"]
    if id(value) in places:
        return places[id(value)]
    if isinstance(value, keras.initializers.Initializer):
        return "initializer"
    if isinstance(value, (list, tuple)) and type(value).__module__.startswith("keras."):
        value = list(value)
    if isinstance(value, dict) and type(value).__module__.startswith("keras."):
        value = dict(value)
    if isinstance(value, set) and type(value).__module__.startswith("keras."):
        value = set(value)
    if type(value) in (list, tuple):
        return type(value)(_placed(item, places) for item in value)
    if type(value) is dict:
        return {key: _placed(item, places) for key, item in value.items()}
    return value


def _places(layer: Any) -> dict[int, str]:
    """The weights and sublayers of ``layer`` by id, each named by its place in it."""
    places = {id(sub): f"layer #{index}" for index, sub in enumerate(layer._flatten_layers(include_self=True))}
    places.update({id(weight): f"weight #{index}" for index, weight in enumerate(layer.weights)})
    return places


_BOOKKEEPING: set[str] = set()


def _bookkeeping() -> set[str]:
    """The attributes every Keras layer has (a bare ``Layer``'s), and its name: Keras's, not
    what the user's layer computes with (its weights, nodes, call signature)."""
    if not _BOOKKEEPING:
        _BOOKKEEPING.update(vars(sys.modules["keras"].layers.Layer()), {"name"})
    return _BOOKKEEPING


def _names(layer: Any) -> dict[str, int]:
    """The names of ``layer`` and everything in it: Keras numbers them per process (dense_3,
    dense_7), so two builds of one model differ in them alone."""
    names: dict[str, int] = {}
    for sub in layer._flatten_layers(include_self=True):
        for operation in [sub, *getattr(sub, "_operations", ())]:
            names.setdefault(operation.name, len(names))
    return names


def _unnamed(config: Any, names: dict[str, int]) -> Any:
    """``config`` with each layer name replaced by its place among ``names``."""
    if isinstance(config, dict):
        return {key: _unnamed(value, names) for key, value in config.items()}
    if isinstance(config, (list, tuple)):
        return [_unnamed(value, names) for value in config]
    if isinstance(config, str) and config in names:
        return f"#{names[config]}"
    return config


def model_for(batch: Any, trainable: Any) -> Any:
    """The model that takes ``batch``: the head for a :class:`StoredBatch`, else the whole."""
    return trainable.frozen_part().head if isinstance(batch, StoredBatch) else trainable.model
