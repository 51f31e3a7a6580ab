"""MADlib's parameter grids (``compile_params_grid``, ``fit_params_grid``) as a search space.

A grid is a Python dict literal: each parameter maps to a list of candidates, or to
``[low, high, 'log']`` / ``[low, high, 'linear']`` for a range that random search and TPE
sample, or ``[low, high, 'log_near_one']`` for one close to 1 (a momentum, a beta): its
distance from 1 is drawn log-uniformly, as in MADlib; ``metrics`` is the metrics list
itself, and ``optimizer_params_list`` holds one dict per optimizer family, each with its
own candidates, e.g.::

    {'loss': ['categorical_crossentropy'], 'metrics': ['accuracy'],
     'optimizer_params_list': [{'optimizer': ['SGD'], 'lr': [0.001, 0.1, 'log'], 'momentum': [0.9, 0.95]},
                               {'optimizer': ['Adam'], 'lr': [0.0001, 0.01, 'log']}]}

:class:`ConfigGrid` flattens both grids and the model ids into one ``cb`` search space and
renders a drawn configuration back into the ``compile_params`` and ``fit_params`` strings of
a model selection table, so every trial is a row a SQL user can read and rerun.
"""
from __future__ import annotations

import ast
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from ..search import choice, loguniform, randint, uniform
from ..search._space import Distribution
from ._params import parse_compile_params, parse_fit_params

_RANGES = ("log", "linear", "log_near_one")


def parse_grid(text: str, what: str) -> dict[str, Any]:
    """``text`` as a dict literal; names the rule it breaks."""
    try:
        grid = ast.literal_eval(text.strip()) if isinstance(text, str) else None
    except (SyntaxError, ValueError) as error:
        raise ValueError(f"{what} {text!r} is malformed ({getattr(error, 'msg', error)}); expected a dict literal "
                         f"such as {{'batch_size': [32, 64], 'epochs': [1]}}") from None
    if not isinstance(grid, dict) or not grid or not all(isinstance(k, str) for k in grid):
        raise ValueError(f"{what} {text!r} must be a non-empty dict from parameter name to a list of candidates")
    return grid


def _is_near_one(values: Any) -> bool:
    return isinstance(values, list) and len(values) == 3 and values[2] == "log_near_one"


def _distribution(values: Any, where: str) -> Distribution:
    """The distribution of a grid's entry; for ``log_near_one``, of the distance from 1."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}={values!r} must be a non-empty list of candidates, or "
                         f"[low, high, 'log'|'linear'|'log_near_one']")
    if len(values) == 3 and values[2] in _RANGES:
        low, high, scale = values
        try:
            if scale == "log_near_one":
                if not (isinstance(low, float) and isinstance(high, float) and 0 < low < high < 1):
                    raise ValueError("log_near_one takes 0 < low < high < 1")
                return loguniform(1 - high, 1 - low)
            if all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
                return randint(low, high + 1)      # integers: drawn uniformly, whatever the scale
            return loguniform(low, high) if scale == "log" else uniform(low, high)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}={values!r} is not a valid range: {error}") from None
    return choice(values)


class ConfigGrid:
    """The model ids and both grids as one flat search space, and the way back from a
    configuration drawn from it to ``(model_id, compile_params, fit_params)``."""

    def __init__(self, model_ids: Sequence[int], compile_params_grid: str, fit_params_grid: str) -> None:
        self._given = (list(model_ids), compile_params_grid, fit_params_grid)
        compile_grid = parse_grid(compile_params_grid, "compile_params_grid")
        fit_grid = parse_grid(fit_params_grid, "fit_params_grid")
        unknown = sorted(set(compile_grid) - {"loss", "metrics", "optimizer_params_list"})
        if unknown or "optimizer_params_list" not in compile_grid or "loss" not in compile_grid:
            raise ValueError(f"compile_params_grid {compile_params_grid!r} must have the keys loss, "
                             f"optimizer_params_list and optionally metrics"
                             + (f"; {', '.join(unknown)} are not understood" if unknown else ""))
        self.metrics = compile_grid.get("metrics", [])
        families = compile_grid["optimizer_params_list"]
        if not isinstance(families, list) or not families or not all(
                isinstance(f, dict) and "optimizer" in f for f in families):
            raise ValueError(f"optimizer_params_list={families!r} must be a list of dicts, each with an "
                             f"'optimizer' list, e.g. [{{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}}]")
        self.families = [list(f) for f in families]
        self.fit_keys = list(fit_grid)
        space: dict[str, Any] = {"model_id": choice(list(model_ids)),
                                 "loss": _distribution(compile_grid["loss"], "loss"),
                                 "optimizer_family": choice(list(range(len(families))))}
        # Where each key of the flat space was written in the grids, for messages.
        self._where: dict[str, str] = {}
        family_of: dict[str, int] = {}
        # Keys drawn as their distance from 1 (log_near_one): rendered as 1 - the draw.
        self._near_one: set[str] = set()
        for index, family in enumerate(families):
            for key, values in family.items():
                name = f"optimizer_{index}.{key}"
                self._where[name], family_of[name] = f"optimizer_params_list[{index}][{key!r}]", index
                space[name] = _distribution(values, self._where[name])
                if _is_near_one(values):
                    self._near_one.add(name)
        for key, values in fit_grid.items():
            self._where[f"fit.{key}"] = f"fit_params_grid[{key!r}]"
            space[f"fit.{key}"] = _distribution(values, self._where[f"fit.{key}"])
            if _is_near_one(values):
                self._near_one.add(f"fit.{key}")
        self.space = space
        # Every candidate must make valid strings: each is tried with the others' first.
        first = {key: _first(value) for key, value in space.items()}
        for key, value in space.items():
            for candidate in value.values if isinstance(value, choice) else [first[key]]:
                family = {"optimizer_family": family_of[key]} if key in family_of else {}
                self.render({**first, key: candidate, **family})

    def __repr__(self) -> str:
        return f"ConfigGrid{self._given!r}"

    def render(self, config: Mapping[str, Any]) -> tuple[int, str, str]:
        """``config`` (drawn from :attr:`space`) as a model selection table's row."""
        config = {key: 1 - value if key in self._near_one else value for key, value in config.items()}
        index = config["optimizer_family"]
        arguments = ", ".join(f"{key}={config[f'optimizer_{index}.{key}']!r}"
                              for key in self.families[index] if key != "optimizer")
        optimizer = f"{config[f'optimizer_{index}.optimizer']}({arguments})"
        compile_params = f"loss={config['loss']!r}, optimizer={optimizer!r}, metrics={self.metrics!r}"
        fit_params = ", ".join(f"{key}={config[f'fit.{key}']!r}" for key in self.fit_keys)
        parse_compile_params(compile_params)
        parse_fit_params(fit_params)
        return config["model_id"], compile_params, fit_params

    def grid(self) -> list[tuple[int, str, str]]:
        """Every distinct row of the grid, models outermost, then compile, then fit
        parameters; a range (``[low, high, 'log']``) cannot be enumerated."""
        for key, value in self.space.items():
            if not isinstance(value, choice):
                raise ValueError(f"search_type 'grid' enumerates candidate lists; {self._where.get(key, key)} is "
                                 f"a range ({value!r}): use search_type 'random'")
        keys = list(self.space)
        rows: dict[tuple[int, str, str], None] = {}
        for values in itertools.product(*(self.space[k].values for k in keys)):
            rows.setdefault(self.render(dict(zip(keys, values))))
        return list(rows)


def _first(value: Any) -> Any:
    return value.values[0] if isinstance(value, choice) else getattr(value, "low", value)
