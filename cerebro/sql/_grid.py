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

A grid to be enumerated (``search_type => 'grid'``) is counted before a row is built, from
the lengths of its lists alone (per optimizer family the product of its lists, summed over
the families), and refused above :data:`._limits.MAX_GRID_CONFIGS`: expanded in the
backend, which answers no cancel while Python runs, a 10 KB grid of a million rows held a
session for 91 s. Checking the candidates and enumerating them call the ``pulse`` they are
given, which answers a cancel (see :mod:`._limits`).
"""
from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..search import choice, loguniform, randint, uniform
from ..search._space import Distribution
from ._limits import (
    MAX_GRID_CHARS,
    MAX_GRID_CONFIGS,
    MAX_GRID_PARAMETERS,
    Pulse,
    check_count,
    check_length,
    listed,
    no_pulse,
    quoted,
)
from ._params import parse_compile_params, parse_fit_params

_RANGES = ("log", "linear", "log_near_one")
_COMPILE_KEYS = ("loss", "metrics", "optimizer_params_list")


def parse_grid(text: str, what: str) -> dict[str, Any]:
    """``text`` as a dict literal, at most :data:`._limits.MAX_GRID_CHARS` characters
    (Python's parser takes time and memory in proportion); names the rule it breaks."""
    check_length(text, what, MAX_GRID_CHARS, "MAX_GRID_CHARS")
    try:
        grid = ast.literal_eval(text.strip()) if isinstance(text, str) else None
    except (SyntaxError, ValueError, RecursionError) as error:
        raise ValueError(f"{what} {quoted(text)} is malformed ({getattr(error, 'msg', error)}); expected a dict "
                         f"literal such as {{'batch_size': [32, 64], 'epochs': [1]}}") from None
    if not isinstance(grid, dict) or not grid or not all(isinstance(k, str) for k in grid):
        raise ValueError(f"{what} {quoted(text)} must be a non-empty dict from parameter name to a list of "
                         f"candidates")
    check_count(f"{what} has", len(grid), "parameters", MAX_GRID_PARAMETERS, "MAX_GRID_PARAMETERS")
    return grid


def _is_near_one(values: Any) -> bool:
    return isinstance(values, list) and len(values) == 3 and values[2] == "log_near_one"


def _distribution(values: Any, where: str) -> Distribution:
    """The distribution of a grid's entry; for ``log_near_one``, of the distance from 1."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}={quoted(values)} must be a non-empty list of candidates, or "
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
            raise ValueError(f"{where}={quoted(values)} is not a valid range: {error}") from None
    return choice(values)


def _families(compile_grid: Mapping[str, Any], text: str) -> list[dict[str, Any]]:
    """The optimizer families of a ``compile_params_grid``, checked for their shape."""
    unknown = sorted(set(compile_grid) - set(_COMPILE_KEYS))
    if unknown or "optimizer_params_list" not in compile_grid or "loss" not in compile_grid:
        raise ValueError(f"compile_params_grid {quoted(text)} must have the keys loss, optimizer_params_list and "
                         f"optionally metrics" + (f"; {listed(unknown, quote=False)} are not understood"
                                                  if unknown else ""))
    families = compile_grid["optimizer_params_list"]
    if not isinstance(families, list) or not families or not all(
            isinstance(f, dict) and "optimizer" in f for f in families):
        raise ValueError(f"optimizer_params_list={quoted(families)} must be a list of dicts, each with an "
                         f"'optimizer' list, e.g. [{{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}}]")
    for index, family in enumerate(families):
        check_count(f"optimizer_params_list[{index}] has", len(family), "parameters", MAX_GRID_PARAMETERS,
                    "MAX_GRID_PARAMETERS")
    return families


def _counted(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


class ConfigGrid:
    """The model ids and both grids as one flat search space, and the way back from a
    configuration drawn from it to ``(model_id, compile_params, fit_params)``."""

    def __init__(self, model_ids: Sequence[int], compile_params_grid: str, fit_params_grid: str, *,
                 enumerated: bool = False, pulse: Pulse = no_pulse) -> None:
        """Parse and check both grids. ``enumerated``: they are to be expanded (search type
        'grid'), so a range, or more rows than :data:`._limits.MAX_GRID_CONFIGS`, is refused
        before any candidate is checked; ``pulse`` is called as each one is."""
        self._given = (list(model_ids), compile_params_grid, fit_params_grid)
        compile_grid = parse_grid(compile_params_grid, "compile_params_grid")
        fit_grid = parse_grid(fit_params_grid, "fit_params_grid")
        families = _families(compile_grid, compile_params_grid)
        self.metrics = compile_grid.get("metrics", [])
        self.families = [list(f) for f in families]
        self.fit_keys = list(fit_grid)
        # Where each key of the flat space was written in the grids, for messages.
        self._where: dict[str, str] = {}
        self._family_of: dict[str, int] = {}
        # Keys drawn as their distance from 1 (log_near_one): rendered as 1 - the draw.
        self._near_one: set[str] = set()
        self.space: dict[str, Any] = {"model_id": choice(list(model_ids)),
                                      "loss": _distribution(compile_grid["loss"], "loss"),
                                      "optimizer_family": choice(list(range(len(families))))}
        for index, family in enumerate(families):
            for key, values in family.items():
                self._add(f"optimizer_{index}.{key}", values, f"optimizer_params_list[{index}][{quoted(key)}]", index)
        for key, values in fit_grid.items():
            self._add(f"fit.{key}", values, f"fit_params_grid[{quoted(key)}]")
        if enumerated:
            self._check_enumerable()
        self._check_candidates(pulse)

    def _add(self, name: str, values: Any, where: str, family: int | None = None) -> None:
        self._where[name] = where
        self.space[name] = _distribution(values, where)
        if family is not None:
            self._family_of[name] = family
        if _is_near_one(values):
            self._near_one.add(name)

    def _check_candidates(self, pulse: Pulse) -> None:
        """Every candidate must make valid strings. A row is parsed value by value, so the
        candidates are tried side by side: the k-th rendering of a family puts each of its
        keys' k-th distinct candidate (its first, past its end) in one row. A family of 100
        parameters of 2 candidates each takes 2 renderings, not 200 (each spelling all 100:
        that was 9 s for 50 such families)."""
        distinct = {key: list({repr(c): c for c in value.values}.values()) if isinstance(value, choice)
                    else [_first(value)] for key, value in self.space.items()}
        shared = ["model_id", "loss", *(f"fit.{key}" for key in self.fit_keys)]
        for index, family in enumerate(self.families):
            keys = [*shared, *(f"optimizer_{index}.{key}" for key in family)]
            # The shared keys' candidates are tried with the first family only.
            tried = keys if index == 0 else keys[len(shared):]
            for row in range(max(len(distinct[key]) for key in tried)):
                pulse()
                self.render({"optimizer_family": index, **{
                    key: distinct[key][row] if key in tried and row < len(distinct[key]) else distinct[key][0]
                    for key in keys}})

    def __repr__(self) -> str:
        return f"ConfigGrid{self._given!r}"

    def render(self, config: Mapping[str, Any], *, check: bool = True) -> tuple[int, str, str]:
        """``config`` (drawn from :attr:`space`) as a model selection table's row, its strings
        parsed to check them unless ``check`` is false (the row of candidates checked when the
        grid was made: a row is parsed value by value, so it is valid as they are)."""
        config = {key: 1 - value if key in self._near_one else value for key, value in config.items()}
        index = config["optimizer_family"]
        arguments = ", ".join(f"{key}={config[f'optimizer_{index}.{key}']!r}"
                              for key in self.families[index] if key != "optimizer")
        optimizer = f"{config[f'optimizer_{index}.optimizer']}({arguments})"
        compile_params = f"loss={config['loss']!r}, optimizer={optimizer!r}, metrics={self.metrics!r}"
        fit_params = ", ".join(f"{key}={config[f'fit.{key}']!r}" for key in self.fit_keys)
        # Every row, checked or not: 10,000 rows of long candidates would fill the backend.
        check_length(compile_params, "compile_params")
        check_length(fit_params, "fit_params")
        if check:
            parse_compile_params(compile_params)
            parse_fit_params(fit_params)
        return config["model_id"], compile_params, fit_params

    def counts(self) -> tuple[int, int, int]:
        """How many distinct model ids, ``compile_params_grid`` combinations (the losses
        times, summed over the optimizer families, the product of each family's lists) and
        ``fit_params_grid`` combinations :meth:`grid` combines, from the lists' lengths
        alone; a range counts as one."""
        def length(key: str) -> int:
            value = self.space[key]
            return len(value.values) if isinstance(value, choice) else 1

        families = sum(math.prod(length(f"optimizer_{index}.{key}") for key in family)
                       for index, family in enumerate(self.families))
        return (len(dict.fromkeys(self.space["model_id"].values)), length("loss") * families,
                math.prod(length(f"fit.{key}") for key in self.fit_keys))

    def _check_enumerable(self) -> None:
        """Refuse a range, which cannot be enumerated, and a grid of more rows than
        :data:`._limits.MAX_GRID_CONFIGS`, counted before any is made."""
        for key, value in self.space.items():
            if not isinstance(value, choice):
                raise ValueError(f"search_type 'grid' enumerates candidate lists; {self._where.get(key, key)} is "
                                 f"a range ({quoted(value)}): use search_type 'random'")
        models, compiles, fits = self.counts()
        check_count(f"search_type 'grid' over {_counted(models, 'model id')}, {_counted(compiles, 'combination')} "
                    f"of compile_params_grid and {_counted(fits, 'combination')} of fit_params_grid makes",
                    models * compiles * fits, "configurations", MAX_GRID_CONFIGS, "MAX_GRID_CONFIGS",
                    ": give fewer candidates, or draw num_configs of them with search_type 'random'")

    def grid(self, pulse: Pulse = no_pulse) -> list[tuple[int, str, str]]:
        """Every distinct row of the grid, models outermost, then compile, then fit
        parameters; a range (``[low, high, 'log']``) cannot be enumerated, and a grid of
        more than :data:`._limits.MAX_GRID_CONFIGS` rows is refused before any is made."""
        self._check_enumerable()
        rows: dict[tuple[int, str, str], None] = {}
        for config in self._combinations():
            pulse()
            # Every candidate was checked when the grid was made: parsing 10,000 rows of 32
            # parameters again would take ~4 s.
            rows.setdefault(self.render(config, check=False))
        return list(rows)

    def _combinations(self) -> Iterator[dict[str, Any]]:
        """Every combination in the grid's order: each optimizer family with its own
        candidates only (another family's cannot change its row)."""
        fit = [f"fit.{key}" for key in self.fit_keys]
        for model_id in dict.fromkeys(self.space["model_id"].values):
            for loss in self.space["loss"].values:
                for index, family in enumerate(self.families):
                    keys = [f"optimizer_{index}.{key}" for key in family] + fit
                    for values in itertools.product(*(self.space[key].values for key in keys)):
                        yield {"model_id": model_id, "loss": loss, "optimizer_family": index,
                               **dict(zip(keys, values))}


def _first(value: Any) -> Any:
    return value.values[0] if isinstance(value, choice) else getattr(value, "low", value)
