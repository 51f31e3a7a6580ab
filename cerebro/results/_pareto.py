"""The Pareto front of a run with several objectives: the trials no other trial dominates."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._objectives import Objective


def non_dominated(points: Sequence[Sequence[float]], objectives: Sequence[Objective]) -> list[int]:
    """The indices of ``points`` (one value per objective each, all finite) that no other
    point dominates, in the order given. ``a`` dominates ``b`` where ``a`` is at least as good
    as ``b`` on every objective (under its mode) and better on one, so equal points never
    dominate each other: both are on the front.

    >>> both = [Objective("val_accuracy", "max"), Objective("params", "min")]
    >>> non_dominated([(0.9, 500), (0.8, 100), (0.8, 600), (0.9, 500)], both)
    [0, 1, 3]
    """
    if not len(points):
        return []
    signs = np.array([1.0 if o.mode == "min" else -1.0 for o in objectives])
    lower = np.asarray(points, dtype=float) * signs        # every objective to minimise
    front = []
    for index, point in enumerate(lower):
        no_worse, better = np.all(lower <= point, axis=1), np.any(lower < point, axis=1)
        if not np.any(no_worse & better):
            front.append(index)
    return front
