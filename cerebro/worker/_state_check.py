"""Is a state the model's? Checked before a state from elsewhere is loaded.

A state comes from places a worker or a user does not control: a peer's outbox (direct hops),
a checkpoint file in a run directory. Its header and CRC-32 say only that the bytes are the
ones written, not that they are this model's: a peer with a bug, or a file crafted or mixed
up, can hold a well-formed state of other shapes, without a key, or with a number where a
tensor goes. Loaded as it is, that fails deep in the framework (a ``KeyError``, a size
mismatch in the middle of an optimizer step), or worse, does not fail: ``load_state_dict``
casts another dtype silently and an export writes a tensor that is no model's. So each one is
held against the built model first, and refused naming the first thing that differs.

Example:
    >>> import torch
    >>> specs = {"w": ((2, 3), "float32")}
    >>> check_weights(specs, {"w": torch.zeros(2, 3)})
    >>> try:
    ...     check_weights(specs, {"w": torch.zeros(3, 2)})
    ... except StateMismatchError as error:
    ...     print(error)
    weight 'w': expected a tensor of shape (2, 3) float32, got (3, 2) float32
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# A tensor's shape and dtype name ("float32"; "" where unknown); None for an entry that is no
# tensor (a torch module's ``_extra_state``), which is only looked for.
Spec = tuple[tuple[int, ...], str] | None


class StateMismatchError(ValueError):
    """A state that is not the model's: a key missing or unknown, a tensor of another shape
    or dtype, or something else where a tensor goes."""


def dtype_name(dtype: Any) -> str:
    """``torch.float32``, ``numpy.float32`` or ``"float32"`` as ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def _got(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {dtype_name(value.dtype)}"
    return f"a {type(value).__name__}, not a tensor"


def _expected(spec: Spec) -> str:
    if spec is None:           # an entry that is no tensor (a module's _extra_state)
        return "an entry, of any value"
    return f"a tensor of shape {spec[0]} {spec[1]}".rstrip()


def check_weights(specs: Mapping[str, Spec], weights: Any, what: str = "weight") -> None:
    """Raise :class:`StateMismatchError` unless ``weights`` maps exactly the names of
    ``specs`` to tensors of their shapes and dtypes (a spec's empty dtype: any; a spec of
    None: anything)."""
    if not isinstance(weights, Mapping):
        raise StateMismatchError(f"the {what}s: expected a mapping of {len(specs)} names to tensors, got a "
                                 f"{type(weights).__name__}")
    for name, spec in specs.items():
        if name not in weights:
            raise StateMismatchError(f"{what} {name!r} is missing: expected {_expected(spec)}")
        value = weights[name]
        if spec is None:
            continue
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(spec[0]) \
                or (spec[1] and dtype_name(value.dtype) != spec[1]):
            raise StateMismatchError(f"{what} {name!r}: expected {_expected(spec)}, got {_got(value)}")
    unknown = [name for name in weights if name not in specs]
    if unknown:
        raise StateMismatchError(f"{what} {unknown[0]!r} is not one of the model's {len(specs)} {what}s")


def check_tensors(weights: Any) -> None:
    """Raise :class:`StateMismatchError` unless ``weights`` maps names to tensors: what can be
    told of weights without the model they are for."""
    if not isinstance(weights, Mapping):
        raise StateMismatchError(f"the weights: expected a mapping of names to tensors, got a {type(weights).__name__}")
    for name, value in weights.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise StateMismatchError(f"weight {name!r}: expected a tensor, got {_got(value)}")


def model_part(state: Any) -> Any:
    """``state["model"]``, or :class:`StateMismatchError` where ``state`` has none."""
    if not isinstance(state, Mapping) or "model" not in state:
        keys = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        raise StateMismatchError(f"the state has no 'model' weights: expected a mapping with the key 'model', "
                                 f"got {keys}")
    return state["model"]


# Per-parameter buffers that torch's own optimizers keep in the parameter's shape. Others are
# not: Adafactor's factored row_var and col_var, LBFGS's flat directions, a custom optimizer's.
PARAMETER_SHAPED = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "momentum_buffer", "square_avg",
                              "acc_delta", "grad_avg", "sum", "ax", "prev", "step_size"})


def check_torch_optimizer(optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """Raise :class:`StateMismatchError` unless ``saved`` is a state dict of ``optimizer``:
    its parameter groups of the same sizes, per-parameter state only for its parameters, and
    each of the :data:`PARAMETER_SHAPED` buffers (Adam's moments) in its parameter's shape."""
    groups = optimizer.param_groups
    if not isinstance(saved, Mapping) or not isinstance(saved.get("state"), Mapping) \
            or not isinstance(saved.get("param_groups"), (list, tuple)):
        raise StateMismatchError(f"the optimizer state: expected a mapping with 'state' and 'param_groups', got "
                                 f"{sorted(map(str, saved)) if isinstance(saved, Mapping) else type(saved).__name__}")
    sizes = [len(g["params"]) if isinstance(g, Mapping) and isinstance(g.get("params"), (list, tuple)) else None
             for g in saved["param_groups"]]
    if sizes != [len(g["params"]) for g in groups]:
        raise StateMismatchError(f"the optimizer's parameter groups: expected {len(groups)} of sizes "
                                 f"{[len(g['params']) for g in groups]}, got sizes {sizes}")
    params = {index: param for group, mine in zip(saved["param_groups"], groups)
              for index, param in zip(group["params"], mine["params"])}
    for index, entry in saved["state"].items():
        if index not in params or not isinstance(entry, Mapping):
            raise StateMismatchError(f"the optimizer state of parameter {index!r}: expected one of the "
                                     f"parameters {sorted(params)} with a mapping, got a {type(entry).__name__}")
        for name, value in entry.items():
            if name in PARAMETER_SHAPED and (not isinstance(value, torch.Tensor) or value.shape != params[index].shape):
                raise StateMismatchError(f"the optimizer state {name!r} of parameter {index}: expected a tensor of "
                                         f"shape {tuple(params[index].shape)}, got {_got(value)}")
