"""A space's configs: checking one a user gives (``cb.add_trial``), every one a grid makes,
the primitives of a nested space and the one behind a value of a config (PBT's mutations).
See :mod:`._space` for what a space is."""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from ._space import Distribution, choice, plain_value, randint


def check_config(space: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """``config`` as plain data, once it has the space's keys and each value is of its key's
    kind: one of a ``choice``'s types (a number where its values are numbers; for a choice of
    dicts, a dict that fits one of them), a number in a ``uniform``'s, ``loguniform``'s or
    ``quniform``'s [low, high], an integer in a ``randint``'s [low, high), a value of a
    constant's type, a dict with a nested dict's keys; else an error naming the key."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config={config!r} must be a dict from parameter name to value")
    return _fit_dict(space, config, "config")


def _fit_dict(space: Mapping[str, Any], config: Mapping[str, Any], where: str, branch: bool = False) -> dict[str, Any]:
    if set(config) != set(space):
        raise ValueError(f"{where} has keys {sorted(config)}; the space has {sorted(space)}: give every key, and no "
                         f"other")
    plain = {key: plain_value(config[key], f"{where}[{key!r}]") for key in space}
    for key, node in space.items():
        _fit(node, plain[key], f"{where}[{key!r}]", branch)
    return plain


def _fit(node: Any, value: Any, where: str, branch: bool = False) -> None:
    """Raises unless ``value`` is one ``node`` could have given; inside a ``branch`` of a
    choice among dicts, a constant must be equal (it tells the branches apart), elsewhere of
    its type."""
    number = (int, float)
    if isinstance(node, Mapping):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}={value!r} must be a dict with the keys {sorted(node)}")
        _fit_dict(node, value, where, branch)
        return
    if isinstance(node, choice) and node.branches:
        for option in node.values:
            try:
                _fit(option, value, where, branch=True)
                return
            except (TypeError, ValueError):
                continue
        raise ValueError(f"{where}={value!r} fits none of the options of {node!r}")
    if isinstance(node, choice):
        kinds = {number if isinstance(v, number) and not isinstance(v, bool) else type(v) for v in node.values}
        fits = any(isinstance(value, kind) and not (kind is number and isinstance(value, bool)) for kind in kinds)
        rule = f"a value of the kind of {node!r}'s"
    elif isinstance(node, randint):
        fits = isinstance(value, int) and not isinstance(value, bool) and node.low <= value < node.high
        rule = f"an integer in [{node.low}, {node.high})"
    elif isinstance(node, Distribution):
        low, high = node.low, node.high  # type: ignore[attr-defined]  # the other primitives are bounded
        fits = isinstance(value, number) and not isinstance(value, bool) and low <= value <= high
        rule = f"a number in [{low!r}, {high!r}] ({node!r})"
    elif branch:
        fits, rule = value == node and type(value) is type(node), f"{node!r}, as the space's branch has it"
    else:
        fits = type(value) is type(node) or (isinstance(value, number) and not isinstance(value, bool)
                                             and isinstance(node, float))
        rule = f"a {type(node).__name__}, as the space's {node!r}"
    if not fits:
        raise ValueError(f"{where}={value!r} must be {rule}")


def grid_values(node: Any, where: str) -> list[Any]:
    """Every value ``node`` gives in a grid: a choice's options (each branch expanded in
    turn), the product of a dict's keys' values in ``itertools.product`` order, a constant."""
    if isinstance(node, choice):
        return [value for i, option in enumerate(node.values)
                for value in grid_values(option, f"{where} option {i}" if isinstance(option, Mapping) else where)]
    if isinstance(node, Distribution):
        raise ValueError(f"GridSearch can only enumerate cb.choice values; {where} is {node!r}. Use "
                         f"cb.choice([...]) or cb.RandomSearch")
    if isinstance(node, Mapping):
        keys = list(node)
        options = [grid_values(node[key], f"{where}[{key!r}]") for key in keys]
        return [dict(zip(keys, combination)) for combination in itertools.product(*options)]
    return [plain_value(node, where)]


def leaves(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Distribution]]:
    """Every primitive of ``node`` with its path of keys, in order, inside branches too (a
    choice of dicts itself among them)."""
    if isinstance(node, Mapping):
        return [leaf for key, value in node.items() for leaf in leaves(value, (*path, key))]
    if isinstance(node, choice) and node.branches:
        return [(path, node)] + [leaf for option in node.values for leaf in leaves(option, path)]
    return [(path, node)] if isinstance(node, Distribution) else []


def primitive_at(space: Mapping[str, Any], config: Mapping[str, Any], path: Sequence[str]) -> Distribution | None:
    """The primitive that gave ``config``'s value at ``path``, following the branches
    ``config`` took; None where ``config`` has no such key (another branch) or it is a constant."""
    node: Any = space
    value: Any = config
    for key in path:
        while isinstance(node, choice) and node.branches:     # into the branch the value fits
            node = next((o for o in node.values if isinstance(o, Mapping) and _fits(o, value)), None)
        if not isinstance(node, Mapping) or not isinstance(value, Mapping) or key not in node or key not in value:
            return None
        node, value = node[key], value[key]
    return node if isinstance(node, Distribution) else None


def _fits(node: Any, value: Any) -> bool:
    try:
        _fit(node, value, "config", branch=True)
        return True
    except (TypeError, ValueError):
        return False
