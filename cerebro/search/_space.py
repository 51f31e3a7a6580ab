"""Search-space primitives: what a configuration value may be.

A space is a dict from name to a primitive (``choice``, ``uniform``, ...) or a plain
constant, which every trial gets as it is.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._checks import Constraint


class Distribution(ABC):
    """One dimension of a search space."""

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Any:
        """Draw one value with ``rng``."""


def _check_finite(name: str, **bounds: float) -> None:
    for key, value in bounds.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{name}: {key}={value!r} must be a finite number")


def _check_order(name: str, low: float, high: float) -> None:
    if not low < high:
        raise ValueError(f"{name}: low={low!r} must be smaller than high={high!r}")


class choice(Distribution):
    """One of ``values``, each equally likely; the only primitive a grid can enumerate.

    >>> cb.choice([32, 64, 128])
    """

    def __init__(self, values: Sequence[Any]) -> None:
        if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
            raise ValueError(f"choice: values={values!r} must be a list of options")
        if len(values) == 0:
            raise ValueError(f"choice: values={values!r} must hold at least one option")
        self.values = [plain_value(v, "choice") for v in values]

    def sample(self, rng: np.random.Generator) -> Any:
        """One of the values, each equally likely."""
        return self.values[int(rng.integers(len(self.values)))]

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
            raise ValueError(f"loguniform: low={low!r} must be greater than 0")
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
                raise ValueError(f"randint: {key}={value!r} must be an integer")
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
            raise ValueError(f"quniform: q={q!r} must be greater than 0")
        _check_order("quniform", low, high)
        if math.floor(high / q) < math.ceil(low / q):
            raise ValueError(f"quniform: no multiple of q={q!r} lies in [{low!r}, {high!r}]")
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
    if isinstance(value, (list, tuple)):
        if depth >= _MAX_DEPTH:
            raise ValueError(f"{where}: a value nested deeper than {_MAX_DEPTH} lists cannot be a configuration value")
        return [plain_value(v, where, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise ValueError(f"{where}: {value!r} cannot be stored as a configuration value; use numbers, "
                     f"strings, booleans, None or lists of them (map names to objects inside build)")


def check_space(space: Any) -> Mapping[str, Any]:
    """Validate that ``space`` is a dict with string keys and storable constants."""
    if not isinstance(space, Mapping):
        raise TypeError(f"space={space!r} must be a dict from parameter name to a value or primitive")
    if not space:
        raise ValueError("space={} must name at least one parameter")
    for key, value in space.items():
        if not isinstance(key, str):
            raise TypeError(f"space key {key!r} must be a string")
        if not isinstance(value, Distribution):
            plain_value(value, f"space[{key!r}]")
    return space


def sample_config(space: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Draw one configuration; keys are sampled in the space's order, so a seed fixes it."""
    return {key: value.sample(rng) if isinstance(value, Distribution) else plain_value(value, key)
            for key, value in space.items()}


def check_config(space: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """``config`` as plain data, once it has the space's keys and each value is of its key's
    kind: one of a ``choice``'s types (a number where its values are numbers), a number in a
    ``uniform``'s, ``loguniform``'s or ``quniform``'s [low, high], an integer in a
    ``randint``'s [low, high), a value of a constant's type; else an error naming the key."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config={config!r} must be a dict from parameter name to value")
    if set(config) != set(space):
        raise ValueError(f"config has keys {sorted(config)}; the space has {sorted(space)}: give every key, and no "
                         f"other")
    plain = {key: plain_value(config[key], f"config[{key!r}]") for key in space}
    for key, primitive in space.items():
        value, number = plain[key], (int, float)
        if isinstance(primitive, choice):
            kinds = {number if isinstance(v, number) and not isinstance(v, bool) else type(v) for v in primitive.values}
            fits = any(isinstance(value, kind) and not (kind is number and isinstance(value, bool)) for kind in kinds)
            rule = f"a value of the kind of {primitive!r}'s"
        elif isinstance(primitive, randint):
            fits = isinstance(value, int) and not isinstance(value, bool) and primitive.low <= value < primitive.high
            rule = f"an integer in [{primitive.low}, {primitive.high})"
        elif isinstance(primitive, Distribution):
            low, high = primitive.low, primitive.high       # type: ignore[attr-defined]
            fits = isinstance(value, number) and not isinstance(value, bool) and low <= value <= high
            rule = f"a number in [{low!r}, {high!r}] ({primitive!r})"
        else:
            fits = type(value) is type(primitive) or (isinstance(value, number) and not isinstance(value, bool)
                                                      and isinstance(primitive, float))
            rule = f"a {type(primitive).__name__}, as the space's {primitive!r}"
        if not fits:
            raise ValueError(f"config[{key!r}]={value!r} must be {rule}")
    return plain


class SearchSpace(Constraint):
    """The constraint on a searcher's ``space``: :func:`check_space`, with its messages."""

    def __init__(self) -> None:
        super().__init__(description="a dict from parameter name to a value or primitive")

    def check(self, name: str, value: Any) -> None:
        """Raise :func:`check_space`'s error unless ``value`` is a valid space."""
        check_space(value)
