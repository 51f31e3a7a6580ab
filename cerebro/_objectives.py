"""A search's objectives: ``metric`` and ``mode`` as a searcher takes them and run.json records
them, one metric (``"val_loss"``, ``"min"``) or several (``["val_accuracy", "params"]``,
``["max", "min"]``), checked and read the same way by the searchers, the engine and every
reader of a run. The first metric is the primary one: what makes an epoch a trial's best,
what early stopping, the bandits' rungs, ``result.best`` and ``ranked()`` use."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ._checks import Constraint, OneOf, quoted

MODES = ("min", "max")


class Objective(NamedTuple):
    """One objective: a metric and which way is better (``"min"`` or ``"max"``)."""

    metric: str
    mode: str


class MetricNames(Constraint):
    """``metric``: a metric's name, or a list (or tuple) of them; raises ``TypeError``. What
    the list holds, and how it pairs with ``mode``, :func:`objectives` checks."""

    error = TypeError

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is a string, a list or a tuple."""
        return isinstance(value, (str, list, tuple))

    def describe(self) -> str:
        """``"a string such as 'val_loss'"``: a list is the exception, explained where it is given."""
        return "a string such as 'val_loss'"


class Modes(OneOf):
    """``mode``: ``"min"`` or ``"max"``, or a list (or tuple) of modes, one per metric
    (:func:`objectives` checks each)."""

    def __init__(self) -> None:
        super().__init__(*MODES)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is ``"min"``, ``"max"``, a list or a tuple."""
        return isinstance(value, (list, tuple)) or super().accepts(value)


def objectives(metric: str | Sequence[str], mode: str | Sequence[str], *,
               recorded: bool = False) -> tuple[Objective, ...]:
    """``metric`` and ``mode`` as objectives, the primary first: both strings (one objective)
    or both lists of the same length, the metrics distinct, each mode ``"min"`` or ``"max"``;
    else a ``ValueError`` (``TypeError`` for a metric that is not a string) naming the value
    and the rule. ``recorded``: a run.json's, whose modes are read as readers always read
    them, any string (all but ``"min"`` rank the highest first): a run directory is shown
    as it is, not refused for what it says.

    >>> objectives(["val_accuracy", "params"], ["max", "min"])
    (Objective(metric='val_accuracy', mode='max'), Objective(metric='params', mode='min'))
    >>> objectives("val_loss", "min")
    (Objective(metric='val_loss', mode='min'),)
    """
    MetricNames().check("metric", metric)
    if not recorded:
        Modes().check("mode", mode)
    if isinstance(metric, str) and isinstance(mode, str):
        return (Objective(metric, mode),)
    if isinstance(metric, str) or isinstance(mode, str):
        raise ValueError(_unpaired(metric, mode))
    metrics, modes = list(metric), list(mode)
    if not metrics:
        raise ValueError(f"metric={quoted(metric)} names no metric: give one metric such as 'val_loss', or a "
                         f"non-empty list of them")
    for name in metrics:
        if not isinstance(name, str) or not name:
            raise TypeError(f"metric={quoted(metric)} holds {quoted(name)}: each metric must be a non-empty string "
                            f"such as 'val_loss'")
    twice = next((name for index, name in enumerate(metrics) if name in metrics[:index]), None)
    if twice is not None:
        raise ValueError(f"metric={quoted(metric)} names {twice!r} twice: each objective must be a different metric")
    for value in modes:
        if not (isinstance(value, str) if recorded else OneOf(*MODES).accepts(value)):
            raise ValueError(f"mode={quoted(mode)} holds {quoted(value)}: each mode must be 'min' or 'max'")
    if len(modes) != len(metrics):
        raise ValueError(f"mode={quoted(mode)} has {len(modes)} mode{'s' * (len(modes) != 1)} for the "
                         f"{len(metrics)} metrics of "
                         f"metric={quoted(metric)}: give one mode per metric, in the same order")
    return tuple(Objective(name, value) for name, value in zip(metrics, modes))


def _unpaired(metric: Any, mode: Any) -> str:
    """Why one metric with a list of modes (or a list of metrics with one mode) is refused."""
    if isinstance(metric, str):
        return (f"mode={quoted(mode)} is a list but metric={metric!r} is one metric: give mode='min' or 'max' "
                f"for one metric, or as many metrics as modes in a list")
    return (f"mode={mode!r} is one mode for metric={quoted(metric)}, a list: give a list of modes, one per "
            f"metric, in the same order (e.g. mode=[{', '.join(repr(mode) for _ in metric)}])")


def primary(metric: str | Sequence[str], mode: str | Sequence[str]) -> Objective:
    """The first objective of ``metric`` and ``mode`` as a run.json records them (see
    :func:`objectives`): what ranks trials where one metric must.

    >>> primary(["val_accuracy", "params"], ["max", "min"])
    Objective(metric='val_accuracy', mode='max')
    """
    return objectives(metric, mode, recorded=True)[0]


def recorded(metric: str | Sequence[str]) -> str | list[str]:
    """``metric`` (or ``mode``) as run.json records it: a string as it is, several as a list."""
    return metric if isinstance(metric, str) else list(metric)
