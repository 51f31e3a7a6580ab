"""A trial's config as Optuna's parameters: the inverse of :func:`._tpe._suggest`, so that
configs drawn without Optuna (random proposals) can be told to a TPE model as observations."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._configs import _fits
from ._space import Distribution, choice
from ._tpe import _optuna_distribution


def optuna_params(space: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``config``'s parameters and their Optuna distributions, under the names ``_suggest``
    asks for them: ``key``, ``key.sub`` inside a dict, ``key[i].sub`` inside the ``i``-th branch
    of a choice among dicts (whose own parameter ``key`` is ``i``). A float just outside its
    bounds by rounding (``exp(log(high))``) is moved onto the bound, as Optuna asks."""
    params: dict[str, Any] = {}
    distributions: dict[str, Any] = {}
    for key, node in space.items():
        _collect(node, config[key], key, params, distributions)
    return params, distributions


def _collect(node: Any, value: Any, name: str, params: dict[str, Any], distributions: dict[str, Any]) -> None:
    if isinstance(node, Mapping):
        for key, child in node.items():
            _collect(child, value[key], f"{name}.{key}", params, distributions)
    elif isinstance(node, choice) and node.branches:
        # The first branch the value fits, as check_config reads a config back.
        index = next(i for i, option in enumerate(node.values) if _fits(option, value))
        params[name] = index
        distributions[name] = _branch_distribution(node)
        _collect(node.values[index], value, f"{name}[{index}]", params, distributions)
    elif isinstance(node, Distribution):
        from optuna.distributions import FloatDistribution
        distribution = _optuna_distribution(name, node)
        if isinstance(distribution, FloatDistribution):
            value = min(max(value, distribution.low), distribution.high)
        params[name] = value
        distributions[name] = distribution


def _branch_distribution(node: choice) -> Any:
    """The branch index's distribution, as ``_suggest`` asks for it."""
    from optuna.distributions import CategoricalDistribution
    return CategoricalDistribution(list(range(len(node.values))))
