"""Search-space primitives: what a configuration value may be.

A space is a dict from name to a primitive (``choice``, ``uniform``, ...), a plain
constant, which every trial gets as it is, or a dict of the same (a nested space). A
``choice`` among dicts that hold primitives makes a conditional space, to any depth: an
architecture with its own hyperparameters,
``{"model": cb.choice([{"kind": "mlp", "hidden": cb.choice([64, 256])},
{"kind": "cnn", "filters": cb.choice([16, 32]), "layers": cb.randint(2, 5)}])}``.
A trial's config is plain nested data of the same shape; ``history()`` flattens it with
dotted names (``model.kind``).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._checks import Constraint, quoted


class Distribution(ABC):
    """One dimension of a search space."""

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Any:
        """Draw one value with ``rng``."""


def _check_finite(name: str, **bounds: float) -> None:
    for key, value in bounds.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{name}: {key}={quoted(value)} must be a finite number")


def _check_order(name: str, low: float, high: float) -> None:
    if not low < high:
        raise ValueError(f"{name}: low={quoted(low)} must be smaller than high={quoted(high)}")


class choice(Distribution):
    """One of ``values``, each equally likely; the only primitive a grid can enumerate.

    >>> import cerebro as cb
    >>> cb.choice([32, 64, 128])
    choice([32, 64, 128])
    """

    def __init__(self, values: Sequence[Any]) -> None:
        if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
            raise ValueError(f"choice: values={quoted(values)} must be a list of options")
        if len(values) == 0:
            raise ValueError(f"choice: values={quoted(values)} must hold at least one option")
        # A dict option is a branch of the space: it may hold primitives, drawn once it is chosen.
        self.values = [check_node(v, f"choice option {i}") if isinstance(v, Mapping) else plain_value(v, "choice")
                       for i, v in enumerate(values)]

    def sample(self, rng: np.random.Generator) -> Any:
        """One of the values, each equally likely (a branch: then its own primitives)."""
        return sample_node(self.values[int(rng.integers(len(self.values)))], rng)

    @property
    def branches(self) -> bool:
        """Whether its options are dicts: a conditional space."""
        return any(isinstance(v, Mapping) for v in self.values)

    def __repr__(self) -> str:
        return f"choice({self.values!r})"


class uniform(Distribution):
    """A float drawn uniformly from [low, high)."""

    def __init__(self, low: float, high: float) -> None:
        _check_finite("uniform", low=low, high=high)
        _check_order("uniform", low, high)
        self.low, self.high = low, high

    def sample(self, rng: np.random.Generator) -> float:
        """A float in [low, high)."""
        return float(rng.uniform(self.low, self.high))

    def __repr__(self) -> str:
        return f"uniform({self.low!r}, {self.high!r})"


class loguniform(Distribution):
    """A float whose logarithm is uniform on [log(low), log(high)); for learning rates."""

    def __init__(self, low: float, high: float) -> None:
        _check_finite("loguniform", low=low, high=high)
        if low <= 0:
            raise ValueError(f"loguniform: low={quoted(low)} must be greater than 0")
        _check_order("loguniform", low, high)
        self.low, self.high = low, high

    def sample(self, rng: np.random.Generator) -> float:
        """A float whose log is uniform in [log(low), log(high))."""
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))

    def __repr__(self) -> str:
        return f"loguniform({self.low!r}, {self.high!r})"


class randint(Distribution):
    """An integer drawn uniformly from [low, high), as ``numpy`` and Ray Tune do."""

    def __init__(self, low: int, high: int) -> None:
        for key, value in (("low", low), ("high", high)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise ValueError(f"randint: {key}={quoted(value)} must be an integer")
        _check_order("randint", low, high)
        self.low, self.high = int(low), int(high)

    def sample(self, rng: np.random.Generator) -> int:
        """An integer in [low, high)."""
        return int(rng.integers(self.low, self.high))

    def __repr__(self) -> str:
        return f"randint({self.low!r}, {self.high!r})"


class quniform(Distribution):
    """A float drawn uniformly from [low, high] and rounded to a multiple of ``q`` in that range."""

    def __init__(self, low: float, high: float, q: float) -> None:
        _check_finite("quniform", low=low, high=high, q=q)
        if q <= 0:
            raise ValueError(f"quniform: q={quoted(q)} must be greater than 0")
        _check_order("quniform", low, high)
        if math.floor(high / q) < math.ceil(low / q):
            raise ValueError(f"quniform: no multiple of q={quoted(q)} lies in [{quoted(low)}, {quoted(high)}]")
        self.low, self.high, self.q = low, high, q

    def sample(self, rng: np.random.Generator) -> float:
        """A multiple of ``q`` in [low, high], as a float."""
        steps = round(rng.uniform(self.low, self.high) / self.q)
        steps = min(max(steps, math.ceil(self.low / self.q)), math.floor(self.high / self.q))
        return float(steps * self.q)

    def __repr__(self) -> str:
        return f"quniform({self.low!r}, {self.high!r}, {self.q!r})"


_MAX_DEPTH = 32     # lists in lists in a configuration value


def plain_value(value: Any, where: str, depth: int = 0) -> Any:
    """``value`` as plain JSON data (numpy scalars become Python numbers, tuples lists), so a
    configuration reads back from the run directory exactly as it was trained."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (list, tuple, Mapping)):
        if depth >= _MAX_DEPTH:
            raise ValueError(f"{where}: a value nested deeper than {_MAX_DEPTH} lists or dicts cannot be a "
                             f"configuration value")
        if not isinstance(value, Mapping):
            return [plain_value(v, where, depth + 1) for v in value]
        bad = next((k for k in value if not isinstance(k, str)), None)
        if bad is not None:
            raise ValueError(f"{where}: key {quoted(bad)} of a dict value must be a string")
        return {k: plain_value(v, f"{where}[{quoted(k)}]", depth + 1) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise ValueError(f"{where}: {quoted(value)} cannot be stored as a configuration value; use numbers, "
                     f"strings, booleans, None or lists or dicts of them (map names to objects inside build)")


def check_space(space: Any) -> Mapping[str, Any]:
    """Validate that ``space`` is a dict with string keys and storable constants, nested
    dicts of the same, and primitives."""
    if not isinstance(space, Mapping):
        raise TypeError(f"space={quoted(space)} must be a dict from parameter name to a value or primitive")
    if not space:
        raise ValueError("space={} must name at least one parameter")
    return check_node(space, "space")


def check_node(node: Any, where: str, depth: int = 0) -> Any:
    """``node`` (a dict of nodes, a primitive or a constant) once it is valid; raises naming
    where it is not (``space['model']['hidden']``)."""
    if isinstance(node, Distribution):
        return node
    if not isinstance(node, Mapping):
        plain_value(node, where)            # raises for what cannot be stored
        return node
    if depth >= _MAX_DEPTH:
        raise ValueError(f"{where}: a space nested deeper than {_MAX_DEPTH} dicts")
    for key, value in node.items():
        if not isinstance(key, str):
            raise TypeError(f"{'space key' if where == 'space' else f'{where}: key'} {quoted(key)} must be a string")
        check_node(value, f"{where}[{quoted(key)}]", depth + 1)
    return node


def sample_node(node: Any, rng: np.random.Generator) -> Any:
    """A value of ``node``: a dict's keys drawn in its order, a primitive's draw, a constant."""
    if isinstance(node, Distribution):
        return node.sample(rng)
    if isinstance(node, Mapping):
        return {key: sample_node(value, rng) for key, value in node.items()}
    return plain_value(node, "space")


def sample_config(space: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Draw one configuration; keys are sampled in the space's order (a branch's after it is
    chosen), so a seed fixes it."""
    return {key: sample_node(value, rng) for key, value in space.items()}


class SearchSpace(Constraint):
    """The constraint on a searcher's ``space``: :func:`check_space`, with its messages."""

    def __init__(self) -> None:
        super().__init__(description="a dict from parameter name to a value or primitive")

    def check(self, name: str, value: Any) -> None:
        """Raise :func:`check_space`'s error unless ``value`` is a valid space."""
        check_space(value)
